"""Process control on real processes. The real job's start, graceful stop and restart are in
test_kpmon_redeploy.py; here are the paths it never takes by itself: a config it rejects, a process that
ignores the STOP marker or SIGTERM, a child left behind in its process group."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from airflow_dags import jobctl
from streaming.paths import StreamPaths
from tests.airflow_dags.traffic import wait_for


@pytest.fixture
def paths(tmp_path: Path) -> StreamPaths:
    p = StreamPaths(tmp_path / "state" / "stream")
    p.make()
    return p


def start(paths: StreamPaths, code: str, *args: str) -> subprocess.Popen[bytes]:
    """A process in its own session, recorded in the pid file as the job would be."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], start_new_session=True)
    paths.pid_file.write_text(f"{proc.pid}\n")
    return proc


def test_spawn_runs_the_build_and_records_it(tmp_path: Path, paths: StreamPaths) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nstream: {{trigger_seconds: -1}}\n")
    record = jobctl.spawn(jobctl.JobSpec(sys.executable, str(config), {"KPMON_MARK": "1"}), paths)
    assert jobctl.read_record(paths) == record
    assert record.python == sys.executable and record.env == {"KPMON_MARK": "1"}
    # The real ``kpmon stream`` rejects the config and exits; is_alive reaps it (no zombie left).
    wait_for(lambda: not jobctl.is_alive(record.pid), 60, "the job to exit")
    assert "trigger_seconds" in Path(record.log).read_text()
    assert jobctl.running_pid(paths) is None
    assert jobctl.stop(paths).how == "not running"


def test_is_alive() -> None:
    assert jobctl.is_alive(os.getpid())
    assert not jobctl.is_alive(None) and not jobctl.is_alive(0) and not jobctl.is_alive(-1)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: not jobctl.is_alive(proc.pid), 30, "exit")


def test_graceful_stop_through_the_marker(paths: StreamPaths) -> None:
    proc = start(
        paths,
        """
        import os, sys, time
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        """,
        str(paths.stop_marker),
    )
    assert jobctl.running_pid(paths) == proc.pid
    result = jobctl.stop(paths, timeout=30)
    assert (result.how, result.pid) == ("graceful", proc.pid) and result.graceful
    assert not paths.stop_marker.exists()
    assert proc.wait(5) is not None


def test_sigterm_when_the_marker_is_ignored(paths: StreamPaths) -> None:
    proc = start(paths, "import time\nwhile True: time.sleep(0.05)")
    result = jobctl.stop(paths, timeout=0.5, term_grace=10)
    assert result.how == "sigterm" and not result.graceful
    # jobctl reaped it (is_alive waits for its own children), so Popen cannot see how it ended.
    assert proc.wait(5) is not None and not jobctl.is_alive(proc.pid)


def test_sigkill_of_the_group_when_sigterm_is_ignored_too(paths: StreamPaths) -> None:
    # The child stands for the JVM: same process group, outlives its parent unless killed.
    proc = start(
        paths,
        """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
        while True:
            time.sleep(0.05)
        """,
    )
    wait_for(lambda: len(jobctl.group_members(proc.pid)) == 2, 30, "the child")
    started = time.monotonic()
    result = jobctl.stop(paths, timeout=0.5, term_grace=1.0)
    assert result.how == "sigkill"
    assert jobctl.group_members(proc.pid) == []
    assert time.monotonic() - started < 20
    proc.wait(5)


def test_a_child_left_in_the_group_is_cleaned_up(paths: StreamPaths) -> None:
    proc = start(
        paths,
        """
        import os, subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        """,
        str(paths.stop_marker),
    )
    wait_for(lambda: len(jobctl.group_members(proc.pid)) == 2, 30, "the child")
    result = jobctl.stop(paths, timeout=30, term_grace=1.0)
    assert result.how == "graceful"
    assert jobctl.group_members(proc.pid) == []


def test_what_runs_is_read_from_proc_when_not_spawned_here(tmp_path: Path, paths: StreamPaths) -> None:
    proc = start(paths, "import time; time.sleep(60)", "stream", "--config", str(tmp_path / "x.yaml"))
    try:
        # On a loaded machine a process just started may not show in /proc at once (seen once on
        # both cores under the parallel suite): ask again for a few seconds, never longer.
        deadline = time.monotonic() + 5
        record = jobctl.describe_running(paths)
        while record is None and time.monotonic() < deadline:
            time.sleep(0.1)
            record = jobctl.describe_running(paths)
        assert record is not None
        assert (record.pid, record.python, record.config) == (
            proc.pid,
            sys.executable,
            str(tmp_path / "x.yaml"),
        )
    finally:
        proc.kill()
        proc.wait(5)
    assert jobctl.describe_running(paths) is None


def test_the_config_chooses_the_job_control(tmp_path: Path) -> None:
    local = tmp_path / "local.yaml"
    local.write_text(f"state_dir: {tmp_path}\n")
    assert isinstance(jobctl.control_for(str(local)), jobctl.LocalControl)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        f"state_dir: {tmp_path}\nstream:\n  master: spark://m.example:7077\ndeploy:\n  target: standalone\n"
    )
    control = jobctl.control_for(str(cluster))
    assert isinstance(control, jobctl.StandaloneControl)
    assert control.rest.url == "http://m.example:6066"


def test_a_record_written_before_targets_existed_is_a_local_process(tmp_path: Path) -> None:
    old = {"pid": 123, "python": sys.executable, "config": "c.yaml", "log": "l", "started_at": 1.0}
    record = jobctl.JobRecord.from_dict(old)
    assert (record.target, record.driver_id, record.handle) == ("local", "", "123")
    remote = jobctl.JobRecord(0, sys.executable, "c.yaml", "", 1.0, {}, "standalone", "driver-1-0000")
    assert jobctl.JobRecord.from_dict(remote.to_dict()) == remote and remote.handle == "driver-1-0000"


def test_the_local_control_finds_and_stops_the_process(paths: StreamPaths) -> None:
    proc = start(
        paths,
        """
        import os, sys, time
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        """,
        str(paths.stop_marker),
    )
    control = jobctl.LocalControl()
    record = control.describe_running(paths)
    assert record is not None and record.handle == str(proc.pid) and control.is_running(record)
    result = control.stop(paths, record, timeout=30)
    assert (result.how, result.pid) == ("graceful", proc.pid)
    assert not control.is_running(record) and control.describe_running(paths) is None


RECORDED_RM = Path(__file__).resolve().parents[1] / "data" / "yarn" / "rm-state-exchanges.json"
YARN_APP = "application_1795880000000_0007"


def yarn_config(tmp_path: Path, rm_url: str) -> Path:
    path = tmp_path / "yarn.yaml"
    path.write_text(
        f"state_dir: {tmp_path}\nstream:\n  master: yarn\n  checkpoint_dir: hdfs:///kpmon/ckpt\n"
        f"deploy:\n  target: yarn\n  rest_url: {rm_url}\n"
    )
    return path


@pytest.mark.parametrize(
    ("script", "how"), [("graceful", "graceful"), ("killed", "killed"), ("unknown", "not running")]
)
def test_the_yarn_control_stops_through_the_marker_then_the_resourcemanager(
    tmp_path: Path, script: str, how: str
) -> None:
    """Against RECORDED ResourceManager exchanges (tests/data/yarn, labelled there), not a live one."""
    import json

    from tests.airflow_dags.recorded import Replay

    recording = json.loads(RECORDED_RM.read_text())
    assert recording["label"].startswith("RECORDING")
    with Replay(recording["scripts"][script]) as rm:
        config = yarn_config(tmp_path, rm.url)
        control = jobctl.control_for(str(config))
        assert isinstance(control, jobctl.YarnControl)
        control.poll = 0.01
        paths = StreamPaths.of(jobctl.load(config))
        paths.make()
        record = jobctl.JobRecord(0, sys.executable, str(config), "", 1.0, {}, "yarn", YARN_APP)
        jobctl.write_record(paths, record)
        # The graceful script's driver ends on the marker; the others get no time to.
        result = control.stop(paths, record, timeout=30.0 if script == "graceful" else 0.0, term_grace=5.0)
        assert result.how == how
        assert rm.unexpected == [] and rm.unplayed == []
        assert not paths.stop_marker.exists()


def test_the_yarn_control_submits_in_cluster_mode_with_the_builds_python(tmp_path: Path) -> None:
    config = jobctl.load(yarn_config(tmp_path, "http://rm.example:8088"))
    paths = StreamPaths.of(config)
    plan = jobctl.YarnControl.plan(jobctl.JobSpec("/opt/build-b/bin/python", "b.yaml"), config, paths)
    argv = plan.argv
    assert argv[argv.index("--master") + 1] == "yarn" and argv[argv.index("--deploy-mode") + 1] == "cluster"
    confs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")
    assert confs["spark.yarn.submit.waitAppCompletion"] == "false"
    assert (
        confs["spark.pyspark.python"]
        == confs["spark.yarn.appMasterEnv.PYSPARK_PYTHON"]
        == "/opt/build-b/bin/python"
    )
    assert plan.config_file.parent == paths.root / "submit"
    found = jobctl._YARN_APP.search(f"INFO Client: Submitted application {YARN_APP}")
    assert found is not None and found.group(1) == YARN_APP
