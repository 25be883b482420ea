"""``kpmon run``: the orchestration pieces (config generation, the demo schedule, the live figures, the
process groups) and one end-to-end run of the whole thing on embedded defaults.

The timeline renderer it adds to the report is tested in tests/checks/test_report_timeline.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from kpconfig.model import ConfigError, KpmonConfig, load_config
from kpmon.cli import main
from kpmon.runner.children import Child, group_members
from kpmon.runner.demo import SCENARIOS, DemoSchedule
from kpmon.runner.plan import (
    Broker,
    RunLayout,
    config_yaml,
    default_state_dir,
    embedded_config,
    external_config,
    tap_ports,
)
from kpmon.runner.progress import (
    AlertLine,
    BatchLine,
    InfoLine,
    Progress,
    format_alert,
    parse_line,
    watermark_delay,
)

REPO = Path(__file__).resolve().parents[2]

# ----- config generation ----------------------------------------------------------------------------


def test_embedded_config_puts_clients_on_the_tap_and_the_tap_topic_on_the_internal_listener(
    tmp_path: Path,
) -> None:
    brokers = [Broker(1, "127.0.0.1", 19092), Broker(2, "127.0.0.1", 19093), Broker(3, "127.0.0.1", 19094)]
    config = embedded_config(
        load_config(None, {}), tmp_path / "state", brokers, "127.0.0.1:19095,127.0.0.1:19096", 29092
    )
    assert [(x.listen, x.broker, x.broker_id) for x in config.tap.listeners] == [
        ("127.0.0.1:29092", "127.0.0.1:19092", 1),
        ("127.0.0.1:29093", "127.0.0.1:19093", 2),
        ("127.0.0.1:29094", "127.0.0.1:19094", 3),
    ]
    assert config.kafka.bootstrap_servers == "127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094"
    # The mirror and the job never go through the tap (that would mirror the mirroring).
    assert config.tap_cluster.bootstrap_servers == "127.0.0.1:19095,127.0.0.1:19096"
    assert Path(config.state_dir) == (tmp_path / "state").resolve()
    assert config.checks.watermark_seconds == 2.0 and config.stream.shuffle_partitions == 2
    assert config.stream.master == "local[*]"


def test_demo_tuning_never_overrides_what_the_user_set(tmp_path: Path) -> None:
    env = {"KPMON__CHECKS__WATERMARK_SECONDS": "7", "KPMON__STREAM__MASTER": "local[1]"}
    config = embedded_config(load_config(None, env), tmp_path, [Broker(1, "127.0.0.1", 1)], "127.0.0.1:2", 3)
    assert config.checks.watermark_seconds == 7.0
    assert config.stream.master == "local[1]"
    assert config.stream.shuffle_partitions == 2  # not set by the user: tuned


def test_generated_config_file_loads_back_to_the_same_config(tmp_path: Path) -> None:
    config = embedded_config(
        load_config(None, {}), tmp_path, [Broker(1, "127.0.0.1", 19092)], "127.0.0.1:19093", 29092
    )
    path = tmp_path / "kpmon.yaml"
    path.write_text(config_yaml(config))
    assert load_config(path, {}) == config


def _config(**raw: object) -> KpmonConfig:
    return KpmonConfig.model_validate(raw)


LISTENER = {"listen": "0.0.0.0:9092", "broker": "kafka-1:9092", "broker_id": 1}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kafka": {"bootstrap_servers": "kafka-1:9092"}}, "tap.listeners is empty"),
        ({"tap": {"listeners": [LISTENER]}}, "no cluster for the tap topic"),
        (
            {"tap": {"listeners": [LISTENER, LISTENER], "cluster": {"bootstrap_servers": "kafka-1:9093"}}},
            "listen more than once on 0.0.0.0:9092",
        ),
        (
            {"tap": {"listeners": [LISTENER], "cluster": {"bootstrap_servers": "0.0.0.0:9092"}}},
            "reached through the tap",
        ),
    ],
)
def test_external_config_errors_say_what_is_missing(
    tmp_path: Path, raw: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        external_config(_config(**raw), tmp_path, "config x.yaml")


def test_external_config_keeps_the_users_settings(tmp_path: Path) -> None:
    raw = {
        "kafka": {"bootstrap_servers": "kafka-1:9092"},
        "tap": {"listeners": [LISTENER], "topic": "frames"},
        "checks": {"watermark_seconds": 30},
    }
    config = external_config(_config(**raw), tmp_path / "s")
    assert config.tap_cluster.bootstrap_servers == "kafka-1:9092"
    assert config.tap.topic == "frames" and config.checks.watermark_seconds == 30
    assert config.stream.shuffle_partitions == 4  # no demo tuning for someone else's cluster
    assert Path(config.state_dir) == (tmp_path / "s").resolve()


def test_state_dir_is_kpmon_home_unless_the_config_sets_it(tmp_path: Path) -> None:
    assert default_state_dir(load_config(None, {}), tmp_path) == tmp_path
    assert default_state_dir(load_config(None, {"KPMON__STATE_DIR": "/srv/kpmon"}), tmp_path) == Path(
        "/srv/kpmon"
    )
    layout = RunLayout(tmp_path)
    assert layout.report == tmp_path / "run" / "report" / "index.html"
    assert layout.stack_home == tmp_path / "run" / "stack"
    assert tap_ports(29092, 3) == [29092, 29093, 29094]


def test_cli_rejects_an_unusable_config_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("kafka:\n  bootstrap_servers: kafka-1:9092\n")
    assert main(["run", "--config", str(path), "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "kpmon run: config" in err and "tap.listeners is empty" in err
    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read config" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--duration", "-5"])


def test_the_quickstart_documents_every_flag_and_scenario() -> None:
    import re

    from kpmon.cli import build_parser

    doc = (REPO / "docs" / "quickstart.md").read_text()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run_parser = sub.choices["run"]
    flags = {s for a in run_parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    documented = set(re.findall(r"^\| `(--[a-z-]+)", doc, re.M)) | {"--config", "--verbose"}
    assert flags == documented
    for scenario in SCENARIOS:
        assert f"`{scenario.label}" in doc and all(f"`{rule}`" in doc for rule in scenario.expect), scenario


# ----- the demo schedule ------------------------------------------------------------------------------


def test_schedule_rotates_every_scenario_once_per_period() -> None:
    schedule = DemoSchedule(every=60)
    names = [schedule.scenario(i).name for i in range(len(SCENARIOS) + 1)]
    assert names[: len(SCENARIOS)] == [
        "zombie_producer",
        "mixed_protocol_group",
        "out_of_range_versions",
        "envelope_from_client",
        "malformed_frame",
    ]
    assert names[-1] == names[0]
    assert schedule.first == 20.0  # half a period, at most 20 s
    assert [schedule.due_at(i) for i in range(3)] == [20.0, 80.0, 140.0]
    assert DemoSchedule(every=20).first == 10.0
    assert DemoSchedule(every=20, first_after=0).due_at(2) == 40.0


def test_an_overrunning_step_delays_the_next_without_a_burst() -> None:
    schedule = DemoSchedule(every=20)
    assert schedule.due_at(1, previous_end=15.0) == 30.0  # on time
    assert schedule.due_at(1, previous_end=95.0) == 95.0  # late: right after, then back on the grid
    assert schedule.due_at(5, previous_end=95.0) == 110.0


def test_schedule_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        DemoSchedule(every=0)
    with pytest.raises(ValueError):
        DemoSchedule(every=10, scenarios=())


# ----- live figures -------------------------------------------------------------------------------


def test_parse_the_stream_lines() -> None:
    # Lines as `kpmon stream` prints them (streaming/observe.py, streaming/job.py).
    assert parse_line("batch 12: 340 frames, 85.2 frames/s, 812 ms, lag 0 records\n") == BatchLine(
        12, 340, 85.2, 812, 0
    )
    assert parse_line("batch 3: 1 frames, 0.5 frames/s, None ms, lag ? records") == BatchLine(
        3, 1, 0.5, None, None
    )
    line = "  ALERT firing critical: envelope.untrusted_source conn:kpmon-run-105: Envelope carrying CreateTopics v7"
    alert = parse_line(line)
    assert alert == AlertLine(
        "firing",
        "critical",
        "envelope.untrusted_source",
        "conn:kpmon-run-105: Envelope carrying CreateTopics v7",
    )
    assert isinstance(alert, AlertLine)
    assert format_alert(alert).startswith("ALERT firing   critical envelope.untrusted_source  conn:")
    assert parse_line("kpmon stream: running (query 42)") == InfoLine("running (query 42)")
    assert parse_line("   \n") is None


def test_progress_rates_and_status_line() -> None:
    progress = Progress(window=10)
    assert progress.status_line(0.0) == "monitor: waiting for the streaming job's first batch"
    assert progress.on_batch(BatchLine(0, 5000, 50.0, 60_000, 0), now=100.0) is True
    assert progress.status_line(101.0).startswith(
        "monitor: batch 0 | frames/s after the start-up backlog (5000 frames) | batch lag 0 records"
    )
    assert progress.frames_per_second(101.0) == 0.0  # the backlog is not a rate
    assert progress.on_batch(BatchLine(1, 100, 80.0, 900, 5), now=102.0) is False
    assert progress.on_batch(BatchLine(2, 300, 80.0, 900, 5), now=104.0) is False
    assert progress.frames_per_second(105.0) == pytest.approx(400 / 5)
    assert progress.frames_per_second(113.0) == pytest.approx(300 / 10)  # batch 1 left the window
    progress.on_alert(AlertLine("firing", "warning", "r", ""))
    line = progress.status_line(113.0, watermark_delay_s=4.2)
    assert line == (
        "monitor: batch 2 | 30.0 frames/s | batch lag 5 records | last batch 900 ms | watermark 4 s behind "
        "| alerts 1 fired, 0 resolved"
    )
    assert (progress.batches, progress.frames) == (3, 5400)


def test_watermark_delay_from_the_progress_file() -> None:
    assert watermark_delay({"eventTime": {"watermark": "2026-01-01T00:00:00.000Z"}}, 1767225610.0) == 10.0
    assert watermark_delay({"eventTime": {"watermark": "1970-01-01T00:00:00.000Z"}}, 5.0) is None
    assert watermark_delay({"eventTime": {}}, 5.0) is None
    assert watermark_delay(None, 5.0) is None


def test_duration_counts_from_the_running_query_not_from_sparks_start_up(tmp_path: Path) -> None:
    from kpmon.runner.orchestrator import STARTUP_CAP, Orchestrator, RunOptions

    run = Orchestrator(load_config(None, {}), RunOptions(tmp_path, embedded=True, duration=60))
    run._stream_started = 1000.0
    assert run._deadline() == 1000.0 + STARTUP_CAP + 60  # a Spark that never starts still ends
    run._query_running_at = 1090.0
    assert run._deadline() == 1150.0
    no_duration = Orchestrator(load_config(None, {}), RunOptions(tmp_path, embedded=True))
    assert no_duration._deadline() is None


def test_an_unresumable_checkpoint_stops_the_run_before_spark_and_fresh_moves_it_aside(
    tmp_path: Path,
) -> None:
    from kpmon.runner.orchestrator import Orchestrator, RunFailed, RunOptions
    from streaming.compat import shape_path, write_shape
    from streaming.paths import StreamPaths

    old = load_config(None, {"KPMON__STATE_DIR": str(tmp_path), "KPMON__STREAM__SHUFFLE_PARTITIONS": "4"})
    write_shape(old)
    paths = StreamPaths.of(old)
    Path(paths.checkpoint(old)).mkdir(parents=True)
    new = old.model_copy(update={"stream": old.stream.model_copy(update={"shuffle_partitions": 2})})

    run = Orchestrator(new, RunOptions(tmp_path, embedded=True))
    run.config = new
    with pytest.raises(RunFailed, match=r"(?s)shuffle_partitions changed 4 -> 2.*--fresh"):
        run._check_checkpoint()
    Orchestrator(old, RunOptions(tmp_path, embedded=True))._check_checkpoint()  # same shape: resumes

    fresh = Orchestrator(new, RunOptions(tmp_path, embedded=True, fresh=True))
    fresh.config = new
    fresh._check_checkpoint()
    assert not paths.root.exists()
    [aside] = tmp_path.glob("stream.*")
    assert shape_path(StreamPaths(aside)).exists()  # moved, not deleted


def test_signals_stop_then_hurry_and_abandon_a_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kpmon.runner.orchestrator import Orchestrator, RunOptions, _Interrupted

    run = Orchestrator(load_config(None, {}), RunOptions(tmp_path, embedded=True))
    run._on_signal(signal.SIGTERM, None)
    assert run._stop.is_set() and not run._hurry and run._stop_reason == "SIGTERM received"
    run._on_signal(signal.SIGINT, None)
    assert run._hurry
    assert "SIGINT while stopping: stopping without waiting" in capsys.readouterr().out

    starting = Orchestrator(load_config(None, {}), RunOptions(tmp_path, embedded=True))
    starting._starting = True
    with pytest.raises(_Interrupted):
        starting._on_signal(signal.SIGINT, None)

    by_duration = Orchestrator(load_config(None, {}), RunOptions(tmp_path, embedded=True, duration=5))
    by_duration.request_stop("--duration 5 s reached")
    by_duration._on_signal(signal.SIGINT, None)  # a Ctrl-C during a stop already under way hurries it
    assert by_duration._hurry


# ----- process groups ---------------------------------------------------------------------------------


def test_stop_ends_the_whole_group_even_when_the_leader_is_gone(tmp_path: Path) -> None:
    # The leader starts a grandchild (as `kpmon stream` starts a JVM) and exits on SIGTERM at once.
    child = Child("sh", ["sh", "-c", "sleep 300 & wait"], dict(os.environ), tmp_path / "sh.log").start()
    deadline = time.monotonic() + 10
    while len(group_members(child.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(child.pid)) == 2
    child.stop(None, grace=5)
    assert group_members(child.pid) == []


def test_a_leader_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(300)"
    child = Child(
        "stubborn", [sys.executable, "-c", code], dict(os.environ), tmp_path / "s.log", pipe_stdout=True
    )
    child.start()
    assert child.proc is not None and child.proc.stdout is not None
    assert child.proc.stdout.readline().strip() == "up"
    started = time.monotonic()
    assert child.stop(None, grace=0.5, term_grace=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 15
    assert group_members(child.pid) == []


def test_a_graceful_request_is_used_first(tmp_path: Path) -> None:
    marker = tmp_path / "STOP"
    code = (
        f"import os, time\nwhile not os.path.exists({str(marker)!r}): time.sleep(0.05)\nraise SystemExit(0)"
    )
    child = Child("polite", [sys.executable, "-c", code], dict(os.environ), tmp_path / "p.log").start()
    assert child.stop(marker.touch, grace=30) == 0


# ----- the whole thing ----------------------------------------------------------------------------------


def _free_base(count: int) -> int:
    """A base port with ``count`` consecutive free ports after it (the stack's contiguous layout)."""
    from deploy.local.process import port_is_free

    for _ in range(200):
        base = 20000 + int.from_bytes(os.urandom(2), "big") % 30000
        if all(port_is_free(p) for p in range(base, base + count)):
            return base
    raise RuntimeError("no free port range")


def _processes_with(marker: str) -> dict[int, str]:
    """Live processes whose environment carries ``marker`` (pid -> command line): what a run left behind."""
    found = {}
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
                if state not in ("Z", "X"):
                    found[int(entry.name)] = (
                        (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
                    )
        except OSError:
            continue
    return found


DEMO_RULES = ("producer.stale_epoch_rejected", "group.protocol_type_mismatch", "apiversions.out_of_range")


def _wait_for(log: Path, proc: subprocess.Popen[bytes], done: Callable[[str], bool], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        output = log.read_text(errors="replace")
        if done(output):
            return output
        time.sleep(1)
    raise AssertionError(f"not seen within {timeout:.0f} s (exit {proc.poll()}):\n{log.read_text()[-4000:]}")


def _recorded_groups(registry: Path) -> list[str]:
    return [g["name"] for g in json.loads(registry.read_text())["groups"]]


def _seen_demo_alert_and_status(output: str) -> bool:
    alerted = any(f"ALERT firing   warning  {rule}" in output for rule in DEMO_RULES)
    return alerted and "frames/s | batch lag" in output


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_make_run_on_embedded_defaults_shows_real_alerts_writes_the_report_and_ctrl_c_leaves_nothing(
    tmp_path: Path,
) -> None:
    """`kpmon run` for real: local Kafka, the tap, Spark on local[*], demo clients; Ctrl-C once the
    demo's first alert is on screen; then everything must be stopped and the report written."""
    state = tmp_path / "state"
    tag, env, cmd = _real_run(state, "--violation-every", "20")
    log = tmp_path / "run.out"
    with log.open("wb") as out:
        # Its own session, as a shell's foreground job: Ctrl-C is SIGINT to that process group.
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_for(log, proc, _seen_demo_alert_and_status, timeout=600)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=300)
    finally:
        leftovers = _kill_leftovers(tag, [proc])
    output = log.read_text()
    assert code == 0, output[-4000:]
    assert leftovers == {}, leftovers
    assert "stopping (SIGINT received): demo traffic, streaming monitor, tap, Kafka" in output
    assert "Kafka stopped" in output

    # Real alerts from the demo, both live in the terminal and in the job's batch results.
    from streaming.paths import StreamPaths
    from streaming.sink import read_batches

    rules = {a["rule"] for batch in read_batches(StreamPaths(state / "stream")) for a in batch["alerts"]}
    assert set(DEMO_RULES) & rules, (rules, output[-4000:])
    assert "demo: zombie producer (tx-" in output and "expect producer.stale_epoch_rejected" in output
    assert "streaming monitor up: first batch" in output

    # The report: heatmap, groups, producers, the alert timeline and the Data Docs link.
    report = state / "run" / "report" / "index.html"
    page = report.read_text()
    assert "data:image/png;base64," in page and report.with_suffix(".png").stat().st_size > 1000
    for section in ("Alert timeline", "ApiVersions coverage", "Consumer groups", "Producers"):
        assert f">{section}<" in page, section
    assert "<svg" in page and 'aria-label="alert timeline"' in page
    assert any(f"<td>{rule}</td>" in page for rule in DEMO_RULES)
    assert "final report" in page
    assert "../../stream/data-docs/site/index.html" in page
    assert f"report: {report}" in output
    assert "stream: stopped (ok)" in output  # the job's own word: it stopped gracefully


# ----- whatever happens to it, a run leaves nothing behind ---------------------------------------------

#: How the terminal or the machine ends a run (the issue's cases): the output pipe closed by the same
#: Ctrl-C (`make run 2>&1 | tee run.log`), a hung-up terminal, a second Ctrl-C during the stop, SIGTERM,
#: and SIGKILL of kpmon run itself (its watchdog stops what it started).
ENDINGS = ("closed-pipe-ctrl-c", "sighup", "double-ctrl-c", "sigterm", "sigkill")


def _real_run(state: Path, *args: str) -> tuple[str, dict[str, str], list[str]]:
    """(tag, environment, command) of a real `kpmon run` on its own ports, with ``args`` added: the tag
    marks every process of that run (the environment is inherited), so a test can find what is left."""
    base = _free_base(4)
    tag = uuid.uuid4().hex
    env = {
        **os.environ,
        "KPMON_RUN_TEST": tag,
        "KPMON__STACK__BASE_PORT": str(base),  # broker base, base+1 inter-broker, base+2 controller
        "KPMON__TAP__METRICS_PORT": "null",
        "KPMON__STREAM__METRICS_PORT": "null",
        "PYTHONUNBUFFERED": "1",
    }
    # --duration only bounds a run whose ending never comes.
    cmd = [
        *(sys.executable, "-m", "kpmon.cli", "run", "--state-dir", str(state), *args),
        *("--tap-port", str(base + 3), "--duration", "600"),
    ]
    return tag, env, cmd


def _wait_until_gone(tag: str, seconds: float) -> None:
    """Until no process of the run tagged ``tag`` is left, or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while _processes_with(f"KPMON_RUN_TEST={tag}") and time.monotonic() < deadline:
        time.sleep(1)


def _kill_leftovers(tag: str, procs: list[subprocess.Popen[bytes]]) -> dict[int, str]:
    """What was left of the run tagged ``tag`` (pid → command line), after SIGKILLing it all: whatever
    happened in the test, nothing of a run may live on into the next test."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    leftovers = _processes_with(f"KPMON_RUN_TEST={tag}")
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return leftovers


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("ending", ENDINGS)
def test_every_ending_leaves_no_process_of_the_run(tmp_path: Path, ending: str) -> None:
    """A real `kpmon run --no-demo` (Kafka, the tap, the streaming job and its Spark JVM), ended once
    Spark runs the query; afterwards no process of that run may be left, whatever the ending."""
    state = tmp_path / "state"
    tag, env, cmd = _real_run(state, "--no-demo")
    run_log = state / "run" / "run.log"
    # As a shell pipeline's first command: its own process group, output into a pipe we read.
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    assert proc.stdout is not None
    seen: list[bytes] = []
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if b"stream: running (query" in line:
                break
        assert b"stream: running (query" in b"".join(seen), b"".join(seen)[-4000:].decode(errors="replace")
        if ending == "closed-pipe-ctrl-c":
            proc.stdout.close()  # tee died with the Ctrl-C: every later write gets EPIPE
            os.killpg(proc.pid, signal.SIGINT)
        elif ending == "sighup":
            os.killpg(proc.pid, signal.SIGHUP)
        elif ending == "double-ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
            while b"streaming monitor: finishing" not in proc.stdout.readline():
                pass
            os.killpg(proc.pid, signal.SIGINT)
        elif ending == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGKILL)
        if not proc.stdout.closed:
            proc.stdout.read()  # keep the pipe drained, as a living reader does
        code = proc.wait(timeout=300)
        _wait_until_gone(tag, seconds=180)  # the watchdog (after SIGKILL) takes a few seconds more
    finally:
        leftovers = _kill_leftovers(tag, [proc])
    log = run_log.read_text()
    assert leftovers == {}, (leftovers, log[-3000:])
    if ending == "sigkill":
        assert code == -signal.SIGKILL
        watchdog = (state / "run" / "watchdog.log").read_text()
        assert "ended without stopping what it started" in watchdog and "done" in watchdog, watchdog
    else:
        assert code == 0, log[-3000:]
        assert "Kafka stopped" in log and "tap stopped" in log, log[-3000:]
        reason = {"sighup": "SIGHUP", "sigterm": "SIGTERM"}.get(ending, "SIGINT")
        assert f"stopping ({reason} received)" in log
        if ending == "double-ctrl-c":
            assert "SIGINT while stopping: stopping without waiting" in log
    assert json.loads((state / "run" / "processes.json").read_text())["state"] == "stopped"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_next_run_cleans_up_after_a_run_killed_with_its_watchdog(tmp_path: Path) -> None:
    """`kpmon run` and its watchdog both killed -9 (the worst case): the tap, the job and Kafka are left.
    The next `kpmon run` on that state directory stops them before it starts anything."""
    state = tmp_path / "state"
    tag, env, cmd = _real_run(state, "--no-demo")
    registry = state / "run" / "processes.json"
    first_log, second_log = tmp_path / "first.out", tmp_path / "second.out"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with first_log.open("wb") as out:
            first = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        procs.append(first)
        _wait_for(first_log, first, lambda text: "streaming monitor: starting Spark" in text, timeout=300)
        # The run says it is starting Spark before it starts and records the job's process group.
        _wait_for(first_log, first, lambda _: len(_recorded_groups(registry)) == 2, timeout=60)
        assert _recorded_groups(registry) == ["tap", "stream"]
        watchdog = [
            pid
            for pid, cmdline in _processes_with(f"KPMON_RUN_TEST={tag}").items()
            if "kpmon.runner.watchdog" in cmdline
        ]
        assert len(watchdog) == 1, _processes_with(f"KPMON_RUN_TEST={tag}")
        os.kill(watchdog[0], signal.SIGKILL)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        time.sleep(2)
        left = _processes_with(f"KPMON_RUN_TEST={tag}")
        assert any("kpmon.cli tap" in c for c in left.values()), left  # really left behind
        with second_log.open("wb") as out:
            second = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        procs.append(second)
        _wait_for(
            second_log,
            second,
            lambda text: "Kafka: " in text and "starting a KRaft stack" in text,
            timeout=300,
        )
        os.killpg(second.pid, signal.SIGINT)
        assert second.wait(timeout=300) == 0, second_log.read_text()[-3000:]
        _wait_until_gone(tag, seconds=60)
    finally:
        leftovers = _kill_leftovers(tag, procs)
    second_out = second_log.read_text()
    assert leftovers == {}, (leftovers, second_out[-3000:])
    assert "a previous kpmon run here did not stop (killed?): stopping what it left first" in second_out
    # The tap was seen left behind above, so the second run must have stopped it. The job may be gone
    # by then on its own (its output pipe went with the killed run), so it is not required here:
    # that nothing of the run is left is asserted above.
    assert "tap (process group" in second_out
    assert "Kafka: stopping the local stack" in second_out
    # Only then did the second run start its own stack.
    assert second_out.index("Kafka: stopping the local stack") < second_out.index("starting a KRaft stack")
