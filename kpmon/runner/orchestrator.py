"""Start everything ``kpmon run`` needs, watch it, and stop it in order.

Start: (local stack) -> tap -> streaming job -> (demo traffic) -> live report.
Stop, on Ctrl-C, SIGTERM, ``--duration`` or a failed part: demo traffic -> streaming job (gracefully:
it finishes its running batch) -> tap -> final report -> (local stack, unless ``--keep-stack``).
A second Ctrl-C during the stop skips the graceful waits. Nothing is left running either way: every
subprocess is the leader of its own process group, and the group is what gets stopped.

Whatever happens to the terminal, the stop runs to the end: SIGHUP stops like SIGTERM, and output that
cannot be written (the pipe to ``tee`` closed by the same Ctrl-C, a terminal that hung up) is dropped
instead of aborting the stop; every line also goes to ``<state_dir>/run/run.log``. If ``kpmon run``
itself is killed (SIGKILL), its watchdog (``kpmon.runner.watchdog``) stops what it started, and the
next ``kpmon run`` on the same state directory cleans up whatever is still left before it starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from kpconfig.model import KpmonConfig, StackConfig, write_private
from kpmon.runner.children import Child
from kpmon.runner.demo import DemoSchedule, DemoTraffic
from kpmon.runner.plan import Broker, RunLayout, config_yaml, embedded_config, tap_ports
from kpmon.runner.progress import (
    AlertLine,
    BatchLine,
    InfoLine,
    Progress,
    format_alert,
    parse_line,
    watermark_delay,
)
from kpmon.runner.watchdog import RunRegistry, Watchdog, clean_up

#: With ``--duration``, a streaming query that is not running after this long starts the clock anyway.
STARTUP_CAP = 600.0


class RunFailed(RuntimeError):
    """A part of the run could not start or died; the message says which and where its log is."""


class _Interrupted(Exception):
    """A signal arrived while starting: abandon the start-up and stop what is already running."""


@dataclass(frozen=True)
class RunOptions:
    state_dir: Path
    embedded: bool
    duration: float | None = None
    demo: bool = True
    violation_every: float = 60.0
    keep_stack: bool = False
    report_every: float = 120.0
    tap_port: int = 29092
    status_every: float = 10.0
    verbose: bool = False
    fresh: bool = False


def child_env() -> dict[str, str]:
    """The subprocesses' environment: the generated config is the whole effective config, so KPMON__*
    overrides (already applied to it) are dropped instead of being applied twice."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KPMON__")}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


class Orchestrator:
    def __init__(
        self,
        base: KpmonConfig,
        options: RunOptions,
        out: TextIO | None = None,
        stack_config: StackConfig | None = None,
    ) -> None:
        self.base = base
        self.options = options
        self.layout = RunLayout(options.state_dir.resolve())
        self.stack_config = stack_config or base.stack
        self._out = out
        # Re-entrant: the signal handler prints, and may run while the main thread is inside say().
        self._print_lock = threading.RLock()
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._stop_reason = ""
        self._hurry = False
        self._starting = False
        self._signals = 0
        self.config: KpmonConfig = base
        self.stack: Any = None
        self.tap: Child | None = None
        self.stream: Child | None = None
        self.demo: DemoTraffic | None = None
        self.report: Any = None
        self.progress = Progress()
        self._threads: list[threading.Thread] = []
        self.failure: str | None = None
        self._saved_stderr_fd: int | None = None
        self._saved_stderr: TextIO = sys.stderr
        self._stream_started = time.monotonic()
        self._query_running_at: float | None = None
        self._out_broken = False
        self._run_log: TextIO | None = None
        self.registry = RunRegistry(self.layout.processes)
        self.watchdog: Watchdog | None = None

    # ----- output -----------------------------------------------------------------------------------

    def say(self, message: str) -> None:
        """One line to the terminal and the run log. Never raises: a closed pipe or a hung-up terminal
        must not stop the run from stopping what it started."""
        elapsed = int(time.monotonic() - self._started)
        line = f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {message}"
        with self._print_lock:
            if self._run_log is not None:
                try:
                    self._run_log.write(line + "\n")
                    self._run_log.flush()
                except (OSError, ValueError):
                    self._run_log = None
            if self._out_broken:
                return
            out = self._out or sys.stdout
            try:
                print(line, file=out, flush=True)
            except (OSError, ValueError):  # EPIPE, EIO, or a closed file
                self._output_gone(out)

    def _output_gone(self, out: TextIO) -> None:
        """Stop writing to ``out``; point its descriptor at /dev/null so the interpreter's last flush
        does not fail either (it would print a traceback and exit 120)."""
        self._out_broken = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
            os.close(devnull)

    def _timed(self, what: str, since: float) -> str:
        return f"{what} in {time.monotonic() - since:.1f} s"

    # ----- signals ----------------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals > 1 or self._stop.is_set():  # already stopping: this one means "hurry"
            self._hurry = True
            self.say(f"{name} while stopping: stopping without waiting")
            return
        self.request_stop(f"{name} received")
        if self._starting:
            raise _Interrupted(name)

    def request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()

    # ----- the run ----------------------------------------------------------------------------------

    def run(self) -> int:
        owner = self.registry.live_owner()
        if owner is not None:
            with contextlib.suppress(OSError):
                print(
                    f"kpmon run: another kpmon run (pid {owner}) is using {self.layout.state_dir}; stop it "
                    "first or give this one another --state-dir",
                    file=sys.stderr,
                    flush=True,
                )
            return 1
        self.layout.root.mkdir(parents=True, exist_ok=True)
        self._run_log = self.layout.run_log.open("a", encoding="utf-8")
        signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.signal(s, self._on_signal) for s in signals}
        try:
            try:
                self._starting = True
                self._guard()
                self._start_all()
                self._starting = False
                self._watch()
            except _Interrupted:
                pass
            except RunFailed as exc:
                self.failure = str(exc)
            finally:
                self._starting = False
                self._stop_all()
                self.registry.finish()
        finally:
            if self.watchdog is not None:
                self.watchdog.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.failure:
            with contextlib.suppress(OSError, ValueError):
                print(f"kpmon run: {self.failure}", file=sys.stderr, flush=True)
            return 1
        return 0

    def _guard(self) -> None:
        """Clean up after a run that was killed, record this one, and start its watchdog."""
        if self.registry.leftovers() or (self.registry.read() or {}).get("state") == "running":
            self.say("a previous kpmon run here did not stop (killed?): stopping what it left first")
            clean_up(self.registry, self.say, grace=30.0)
        self.registry.begin()
        self.watchdog = Watchdog(self.registry, self.layout.watchdog_log).start()

    def _started_child(self, child: Child) -> Child:
        self.registry.add_group(child.name, child.pid)
        return child

    def _start_all(self) -> None:
        o = self.options
        mode = "embedded local stack" if o.embedded else "existing cluster (--config)"
        self.say(f"kpmon run: {mode}; state in {self.layout.state_dir}; Ctrl-C stops everything")
        if o.embedded:
            self._start_stack()
        write_private(self.layout.config_file, config_yaml(self.config))  # may hold secrets
        self._prefetch_connector()
        self._start_tap()
        self._check_checkpoint()
        self._start_stream()
        if o.embedded and o.demo:
            self._start_demo()
        self._start_reporting()
        if o.duration:
            self.say(f"will stop {o.duration:.0f} s after the streaming query is running (--duration)")

    # ----- parts --------------------------------------------------------------------------------------

    def _start_stack(self) -> None:
        from deploy.local.distribution import fetch_distribution
        from deploy.local.stack import LocalStack, StackError
        from kpconfig.mvn import FetchError

        sc = self.stack_config
        if sc.sasl:
            raise RunFailed("stack.sasl: true is not supported by kpmon run (the demo clients use PLAINTEXT)")
        ports = tap_ports(self.options.tap_port, sc.brokers)
        advertised = {
            node: ("127.0.0.1", port) for node, port in zip(range(1, sc.brokers + 1), ports, strict=True)
        }
        home = self.layout.stack_home
        since = time.monotonic()
        self.say(f"Kafka {sc.kafka_version}: jars (fetched from Maven Central on the first run only)...")
        try:
            fetch_distribution(sc.kafka_version)
        except FetchError as exc:
            raise RunFailed(f"cannot fetch the Kafka {sc.kafka_version} jars: {exc}") from exc
        self.say(self._timed(f"Kafka {sc.kafka_version} jars ready", since))
        try:
            existing = LocalStack.open(home)
        except StackError:
            existing = None
        if existing is not None and existing.is_running() and existing.advertised != advertised:
            self.say(f"a stack with other tap ports runs in {home}: restarting it for tap ports {ports}")
            existing.down()
        stack = LocalStack(home, sc.kafka_version, sc.brokers, False, sc.base_port, advertised)
        self.stack = stack
        if self._stops_stack():
            self.registry.set_stack(home)
        since = time.monotonic()
        reused = stack.is_running()
        self.say(
            f"Kafka: {'reusing the running' if reused else 'starting a'} KRaft stack "
            f"({sc.brokers} broker(s), ports from {sc.base_port}) in {home}..."
        )
        try:
            stack.up(timeout=sc.startup_timeout)
        except StackError as exc:
            raise RunFailed(f"the local Kafka stack did not start: {exc}") from exc
        self.say(self._timed("Kafka ready", since) + f": brokers {stack.bootstrap_servers}")
        brokers = [Broker(b.node_id, b.host, b.port) for b in stack.listen_endpoints]
        self.config = embedded_config(
            self.base, self.layout.state_dir, brokers, stack.internal_bootstrap_servers, self.options.tap_port
        )

    def _prefetch_connector(self) -> None:
        """Fetch Spark's Kafka connector here, where its progress can be said, not inside the job."""
        from kpconfig.mvn import FetchError
        from streaming.connector import connector_jars

        if (
            "spark.jars" in self.config.stream.spark_conf
            or "spark.jars.packages" in self.config.stream.spark_conf
        ):
            return
        since = time.monotonic()
        self.say("Spark's Kafka connector jars (fetched from Maven Central on the first run only)...")
        try:
            connector_jars()
        except FetchError as exc:
            raise RunFailed(f"cannot fetch Spark's Kafka connector: {exc}") from exc
        self.say(self._timed("connector jars ready", since))

    def _command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "kpmon.cli", *args, "--config", str(self.layout.config_file)]

    def _start_tap(self) -> None:
        from deploy.local.process import port_open
        from tap.proxy import parse_hostport

        since = time.monotonic()
        listeners = self.config.tap.listeners
        self.tap = self._started_child(
            Child("tap", self._command("tap"), child_env(), self.layout.tap_log).start()
        )
        addresses = [parse_hostport(listener.listen) for listener in listeners]
        deadline = time.monotonic() + 60
        while not all(
            port_open(port, "127.0.0.1" if host in ("", "0.0.0.0") else host) for host, port in addresses
        ):
            if not self.tap.running():
                raise RunFailed(
                    f"the tap exited with {self.tap.returncode}; its log ({self.layout.tap_log}):\n{self.tap.tail()}"
                )
            if time.monotonic() > deadline:
                raise RunFailed(f"the tap did not listen within 60 s; see {self.layout.tap_log}")
            time.sleep(0.2)
        routes = ", ".join(f"{x.listen} -> broker {x.broker}" for x in listeners)
        self.say(self._timed("tap listening", since) + f": {routes}")
        self.say(
            f"tap: mirroring every frame to topic {self.config.tap.topic!r} on "
            f"{self.config.tap_cluster.bootstrap_servers}; clients connect to "
            + ", ".join(listener.advertise or listener.listen for listener in listeners)
        )

    def _check_checkpoint(self) -> None:
        """``--fresh`` moves the job's old state aside; otherwise a checkpoint this build cannot resume
        (streaming.compat: source, stages, state schemas, partitions) stops the run before Spark starts."""
        from streaming.compat import IncompatibleCheckpoint, refuse_incompatible
        from streaming.paths import StreamPaths

        paths = StreamPaths.of(self.config)
        if self.options.fresh and paths.root.exists():
            aside = paths.root.with_name(f"stream.{time.strftime('%Y%m%d-%H%M%S')}")
            paths.root.rename(aside)
            self.say(f"--fresh: the streaming job's old state (checkpoint, batch results) moved to {aside}")
            return
        try:
            refuse_incompatible(
                self.config,
                "Run again with --fresh to start a new checkpoint (the old state is moved aside, not deleted).",
            )
        except IncompatibleCheckpoint as exc:
            raise RunFailed(str(exc)) from exc

    def _start_stream(self) -> None:
        from streaming.paths import StreamPaths

        self._stream_started = time.monotonic()
        paths = StreamPaths.of(self.config)
        self.say(
            f"streaming monitor: starting Spark on {self.config.stream.master} (start-up takes 30-90 s on a "
            f"small machine; Spark's own log: {paths.spark_log})..."
        )
        self.stream = Child(
            "stream", self._command("stream"), child_env(), self.layout.stream_log, pipe_stdout=True
        )
        self._started_child(self.stream.start())
        relay = threading.Thread(target=self._relay, name="stream-relay", daemon=True)
        relay.start()
        self._threads.append(relay)

    def _relay(self) -> None:
        assert (
            self.stream is not None and self.stream.proc is not None and self.stream.proc.stdout is not None
        )
        for line in self.stream.proc.stdout:
            event = parse_line(line)
            now = time.monotonic()
            if isinstance(event, BatchLine):
                self._query_running_at = self._query_running_at or now
                if self.progress.on_batch(event, now):
                    self.say(
                        self._timed("streaming monitor up: first batch", self._stream_started)
                        + f" ({event.frames} frames)"
                    )
                if self.options.verbose:
                    self.say(f"stream: {line.strip()}")
            elif isinstance(event, AlertLine):
                self.progress.on_alert(event)
                self.say(format_alert(event))
            elif isinstance(event, InfoLine):
                if event.text.startswith("running (query"):
                    self._query_running_at = self._query_running_at or now
                if event.text.startswith("{") and not self.options.verbose:
                    continue  # the log hook's JSON copy of an alert already shown as an ALERT line
                # The job's own hint ("Ctrl-C or `kpmon stream stop`") is not how this run stops.
                self.say(f"stream: {event.text.split('; Ctrl-C')[0]}")

    def _start_demo(self) -> None:
        self._quiet_client_logs()
        schedule = DemoSchedule(self.options.violation_every)
        bootstrap = self.config.kafka.bootstrap_servers
        self.demo = DemoTraffic(bootstrap, schedule, self.say).start()
        self.say(
            f"demo: real clients through the tap at {bootstrap}: a clean workload, and a catalogue violation "
            f"every {schedule.every:.0f} s (first in {schedule.first:.0f} s), rotating "
            + ", ".join(s.label for s in schedule.scenarios)
        )

    def _quiet_client_logs(self) -> None:
        """librdkafka logs straight to file descriptor 2 (a fenced zombie logs FATAL, as it should): send
        it to a file so the terminal shows the monitor, and point Python's stderr at the terminal."""
        self._saved_stderr_fd = os.dup(2)
        log = os.open(self.layout.clients_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 2)
        os.close(log)
        self._saved_stderr = sys.stderr
        sys.stderr = os.fdopen(self._saved_stderr_fd, "w", buffering=1, closefd=False)
        self.say(f"demo: the clients' own librdkafka log lines go to {self.layout.clients_log}")

    def _restore_stderr(self) -> None:
        fd = self._saved_stderr_fd
        if fd is None:
            return
        sys.stderr.flush()
        os.dup2(fd, 2)
        os.close(fd)
        sys.stderr = self._saved_stderr
        self._saved_stderr_fd = None

    def _start_reporting(self) -> None:
        from kpmon.runner.reporting import LiveReport

        self.report = LiveReport(self.config, self.layout.report)
        self.say(
            f"report: {self.layout.report} (rewritten every {self.options.report_every:.0f} s and at exit)"
        )
        thread = threading.Thread(target=self._report_loop, name="report", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _report_loop(self) -> None:
        while not self._stop.wait(self.options.report_every):
            self._write_report(final=False)

    def _write_report(self, final: bool) -> None:
        from kpmon.runner.reporting import InputError

        report = self.report
        if report is None:
            return
        since = time.monotonic()
        try:
            path = report.write(final=final)
        except InputError as exc:
            self.say(f"report: not written ({exc})")
        except Exception as exc:  # a report is a view: its failure must never stop the monitor
            self.say(f"report: failed: {type(exc).__name__}: {exc}")
        else:
            self.say(self._timed(f"report: wrote {path}", since))

    # ----- watching -----------------------------------------------------------------------------------

    def _watch(self) -> None:
        from streaming.paths import StreamPaths
        from streaming.status import read_progress

        paths = StreamPaths.of(self.config)
        next_status = time.monotonic() + self.options.status_every
        while not self._stop.wait(0.5):
            now = time.monotonic()
            for child in (self.tap, self.stream):
                if child is not None and not child.running():
                    log = paths.spark_log if child is self.stream else child.log_path
                    hint = (
                        "\n(a checkpoint written by an older kpmon can do this: `kpmon run --fresh` starts "
                        "a new one)"
                        if child is self.stream
                        else ""
                    )
                    raise RunFailed(
                        f"the {child.name} exited unexpectedly (code {child.returncode}); see {log}:\n"
                        + child.tail(15, log)
                        + hint
                    )
            deadline = self._deadline()
            if deadline is not None and now >= deadline:
                self.request_stop(f"--duration {self.options.duration:.0f} s reached")
                break
            if now >= next_status:
                next_status = now + self.options.status_every
                waited = now - self._stream_started
                if self._query_running_at is None:
                    self.say(f"monitor: Spark starting ({waited:.0f} s so far)")
                elif self.progress.last is None:
                    self.say(f"monitor: query running, its first batch in progress ({waited:.0f} s so far)")
                else:
                    delay = watermark_delay(read_progress(paths.progress), time.time())
                    self.say(self.progress.status_line(now, delay))

    def _deadline(self) -> float | None:
        """``--duration`` counts from when the streaming query runs: Spark's start-up (30-150 s on a
        loaded small machine) is not monitoring time. A Spark that never starts does not hold the run
        beyond ``STARTUP_CAP`` seconds more."""
        if not self.options.duration:
            return None
        start = self._query_running_at or self._stream_started + STARTUP_CAP
        return start + self.options.duration

    # ----- stopping ---------------------------------------------------------------------------------

    def _stop_all(self) -> None:
        reason = self._stop_reason or ("a part failed" if self.failure else "start-up ended")
        since = time.monotonic()
        self._stop.set()
        steps: list[tuple[str, Callable[[], object]]] = []
        if self.demo is not None:
            steps.append(("demo traffic", self._stop_demo))
        if self.stream is not None:
            steps.append(("streaming monitor", self._stop_stream))
        if self.tap is not None:
            steps.append(("tap", self._stop_tap))
        if self._stops_stack():
            steps.append(("Kafka", self.stack.down))
        self.say(f"stopping ({reason}): {', '.join(name for name, _ in steps) or 'nothing was running'}")
        for name, action in steps:
            if name == "Kafka":
                # The last report reads the tap topic: before the broker holding it goes.
                self._final_report()
            self._step(name, action)
        self._final_report()
        if self.stack is not None and self.options.keep_stack:
            self.say(
                f"Kafka left running (--keep-stack) in {self.layout.stack_home}: it advertises the tap's "
                f"address, so clients reach it with the next `kpmon run`; `kpmon stack down --home "
                f"{self.layout.stack_home}` stops it"
            )
        for thread in self._threads:
            thread.join(5)
        self._restore_stderr()
        self.say(self._timed("stopped", since))
        if self.layout.report.exists():
            self.say(f"report: {self.layout.report}")
        if self._run_log is not None:
            with contextlib.suppress(OSError):
                self._run_log.close()
            self._run_log = None

    def _final_report(self) -> None:
        if self.report is None:
            return
        if self._hurry:
            self.say("report: not rewritten (stopping without waiting)")
        else:
            self._write_report(final=True)
        self.report.close()
        self.report = None

    def _stops_stack(self) -> bool:
        return self.stack is not None and not self.options.keep_stack

    def _step(self, name: str, action: Callable[[], object]) -> None:
        since = time.monotonic()
        try:
            action()
        except Exception as exc:  # one part failing to stop must not leave the later ones running
            self.say(f"stopping {name} failed: {type(exc).__name__}: {exc}")
            return
        self.say(self._timed(f"{name} stopped", since))

    def _stop_demo(self) -> None:
        if self.demo is not None and not self.demo.stop(timeout=5 if self._hurry else 90):
            self.say("demo: a step is still running; its clients end with the run")

    def _stop_stream(self) -> None:
        from streaming.paths import StreamPaths

        if self.stream is None:
            return
        stream = self.stream
        if self._query_running_at is None:
            # Still starting Spark: no batch to finish and nothing in the checkpoint to protect yet.
            self.say("streaming monitor: still starting, stopped without waiting")
            stream.stop(lambda: stream.signal_group(signal.SIGTERM), 15, lambda: self._hurry)
            return
        marker = StreamPaths.of(self.config).stop_marker
        grace = self.config.stream.stop_timeout_seconds + 60
        if stream.running() and not self._hurry:
            self.say(
                f"streaming monitor: finishing its running batch (up to {grace:.0f} s; Ctrl-C again to stop "
                "at once: the next start replays that batch from the checkpoint)"
            )
        code = stream.stop(marker.touch, grace, lambda: self._hurry)
        if code not in (0, None) and self.failure is None and not self._hurry:
            self.say(f"streaming monitor exited with {code}; see {StreamPaths.of(self.config).spark_log}")

    def _stop_tap(self) -> None:
        if self.tap is not None:
            self.tap.stop(None, 30, lambda: self._hurry)
