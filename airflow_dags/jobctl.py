"""Process control for the streaming job, for the DAGs: spawn detached, find, stop gracefully.

No Airflow in here, so it is unit-testable on its own. The job contract it relies on is the one of
``kpmon stream`` (kpmon/commands/stream.py, streaming/job.py):

* started as ``<python> -m kpmon.cli stream --config FILE``; ``<python>`` is the interpreter of the build
  to run, so a new build's code runs with that build's dependencies;
* it writes ``<state_dir>/stream/stream.pid`` once its query has started;
* it stops gracefully (finishes the running batch) when ``<state_dir>/stream/STOP`` appears or on
  SIGTERM.

``JobControl`` is the same contract per deploy target (the config's ``deploy.target``): ``LocalControl``
is the process on this host described above; ``StandaloneControl`` a driver on a Spark standalone cluster
(REST submission, status, kill), ``YarnControl`` a YARN application, ``KubernetesControl`` a spark-operator
SparkApplication: each reads the same stop marker and writes the same progress file in a state directory
shared with the DAGs. ``control_for`` picks one from a config.

Each spawn is also recorded in ``<state_dir>/stream/jobctl.json`` (interpreter, config, log), which is how
a later DAG run knows what to restart on rollback. Relative ``state_dir`` values resolve against the
working directory of whoever reads them: give Airflow-managed configs an absolute ``state_dir``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from deploy.local import process
from kpconfig.model import KpmonConfig, load_config, write_private
from streaming.paths import StreamPaths

RECORD_FILE = "jobctl.json"
#: Environment variables that would make the job's Spark workers run another build's interpreter.
_INHERITED_PYSPARK = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


class JobControlError(RuntimeError):
    """The job could not be started or stopped as asked; the message says what was seen."""


@dataclass(frozen=True)
class JobSpec:
    """Which build runs with which config."""

    python: str
    config: str
    #: Extra environment for the job (e.g. ``KPMON__...`` overrides).
    env: dict[str, str] = field(default_factory=dict)

    def argv(self) -> list[str]:
        return [self.python, "-m", "kpmon.cli", "stream", "--config", self.config]


@dataclass
class JobRecord:
    #: The job's process on this host; 0 for a driver on a cluster.
    pid: int
    python: str
    config: str
    log: str
    started_at: float
    env: dict[str, str] = field(default_factory=dict)
    #: The deploy target that started it (``deploy.target``).
    target: str = "local"
    #: The cluster's id of the driver (a standalone submission id); empty for a local process.
    driver_id: str = ""

    @property
    def spec(self) -> JobSpec:
        return JobSpec(self.python, self.config, dict(self.env))

    @property
    def handle(self) -> str:
        """What identifies this run of the job on its target: the driver id, else the pid."""
        return self.driver_id or str(self.pid)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> JobRecord:
        return JobRecord(
            pid=int(data["pid"]),
            python=str(data["python"]),
            config=str(data["config"]),
            log=str(data.get("log", "")),
            started_at=float(data.get("started_at", 0.0)),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            target=str(data.get("target") or "local"),
            driver_id=str(data.get("driver_id") or ""),
        )


@dataclass
class StopResult:
    #: "not running", "graceful" (the STOP marker), "sigterm" or "sigkill"; on a cluster, "killed"
    #: (through the cluster's API).
    how: str
    seconds: float
    pid: int | None = None

    @property
    def graceful(self) -> bool:
        return self.how in ("not running", "graceful")


def load(config_path: str | os.PathLike[str]) -> KpmonConfig:
    return load_config(Path(config_path))


def paths_of(config: KpmonConfig | str | os.PathLike[str]) -> StreamPaths:
    return StreamPaths.of(config if isinstance(config, KpmonConfig) else load(config))


def record_path(paths: StreamPaths) -> Path:
    return paths.root / RECORD_FILE


# -- probing ----------------------------------------------------------------------------------------


def is_alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie does not). Reaps it first if it is our own exited child."""
    if not pid or pid <= 0:
        return False
    try:
        reaped, _status = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    except ChildProcessError:
        pass
    return process.is_alive(pid)


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` (the job and its JVM); Linux /proc only, else a probe."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(entry.name))
    return sorted(members)


def read_pid(paths: StreamPaths) -> int | None:
    try:
        return int(paths.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def read_record(paths: StreamPaths) -> JobRecord | None:
    try:
        return JobRecord.from_dict(json.loads(record_path(paths).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_record(paths: StreamPaths, record: JobRecord) -> None:
    path = record_path(paths)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record.to_dict(), indent=1, sort_keys=True))
    os.replace(tmp, path)


def running_pid(paths: StreamPaths) -> int | None:
    """The pid of the job running on these paths: its pid file, else the last spawn's record."""
    for pid in (read_pid(paths), getattr(read_record(paths), "pid", None)):
        if pid is not None and is_alive(pid):
            return pid
    return None


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def describe_running(paths: StreamPaths) -> JobRecord | None:
    """What runs on these paths, as a record: the spawn record if it is that process, else read from /proc
    (a job started by hand: its interpreter is argv[0], which for the ``kpmon`` script is the shebang's)."""
    pid = running_pid(paths)
    if pid is None:
        return None
    record = read_record(paths)
    if record is not None and record.pid == pid:
        return record
    argv = cmdline(pid)
    if not argv:
        return None
    config = ""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            config = argv[i + 1]
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
    return JobRecord(pid=pid, python=argv[0], config=config, log="", started_at=0.0)


# -- spawning and stopping --------------------------------------------------------------------------


def spawn(spec: JobSpec, paths: StreamPaths | None = None, log_path: Path | None = None) -> JobRecord:
    """Start the job in its own session (so it outlives the Airflow task, and its JVM can be signalled as
    one group); its console output goes to ``log_path`` (default ``<state>/stream/job-<time>.log``)."""
    paths = paths or paths_of(spec.config)
    paths.make()
    started = time.time()
    log_path = log_path or paths.root / f"job-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(started))}.log"
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED_PYSPARK}
    env.update(spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PYSPARK_PYTHON"] = spec.python
    with log_path.open("ab") as log:
        try:
            proc = subprocess.Popen(
                spec.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise JobControlError(f"cannot start {spec.python}: {exc.strerror or exc}") from exc
    record = JobRecord(proc.pid, spec.python, spec.config, str(log_path), started, dict(spec.env))
    write_record(paths, record)
    return record


def _wait_gone(pid: int, deadline: float, poll: float) -> bool:
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(poll)
    return not is_alive(pid)


def _signal_group(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(
    paths: StreamPaths,
    pid: int | None = None,
    timeout: float = 180.0,
    term_grace: float = 30.0,
    poll: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
) -> StopResult:
    """Stop the job gracefully: the STOP marker (the running batch finishes), then SIGTERM after
    ``timeout``, then SIGKILL of its process group after ``term_grace``. Returns once nothing of it is left
    (its JVM included), so the next job can take the checkpoint and the ports."""
    started = clock()
    pid = pid if pid is not None else running_pid(paths)
    if pid is None or not is_alive(pid):
        return StopResult("not running", 0.0, pid)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.stop_marker.touch()
    how = "graceful"
    try:
        if not _wait_gone(pid, started + timeout, poll):
            how = "sigterm"
            _signal_group(pid, signal.SIGTERM)
            if not _wait_gone(pid, clock() + term_grace, poll):
                how = "sigkill"
                _signal_group(pid, signal.SIGKILL)
                if not _wait_gone(pid, clock() + 30.0, poll):
                    raise JobControlError(f"job {pid} survived SIGKILL")
        # The driver is gone; its JVM (same process group) follows within moments, or is made to.
        deadline = clock() + term_grace
        while group_members(pid) and clock() < deadline:
            time.sleep(poll)
        if group_members(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            # SIGKILL is delivered at once but a busy machine takes a moment to tear the process
            # down: "nothing left" is what callers rely on (the next job takes the ports).
            gone_by = clock() + 30.0
            while group_members(pid) and clock() < gone_by:
                time.sleep(poll)
    finally:
        paths.stop_marker.unlink(missing_ok=True)
    return StopResult(how, clock() - started, pid)


def tail(path: str | os.PathLike[str], lines: int = 30) -> str:
    """The end of a log file, for error messages."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# -- one interface per deploy target ------------------------------------------------------------------------


class JobControl(Protocol):
    """Start, find and stop the job on one deploy target (``deploy.target`` of its config)."""

    target: str

    def describe_running(self, paths: StreamPaths) -> JobRecord | None:
        """What runs on these paths, or None."""
        ...

    def is_running(self, record: JobRecord) -> bool: ...

    def start(self, spec: JobSpec, paths: StreamPaths | None = None) -> JobRecord: ...

    def stop(
        self,
        paths: StreamPaths,
        record: JobRecord | None = None,
        timeout: float = 180.0,
        term_grace: float = 30.0,
    ) -> StopResult:
        """The stop marker first (the running batch finishes and commits); the target's own kill after
        ``timeout``. Returns once the job is gone."""
        ...


class LocalControl:
    """A detached process on this host (``spawn``, ``stop``)."""

    target = "local"

    def describe_running(self, paths: StreamPaths) -> JobRecord | None:
        pid = running_pid(paths)
        if pid is None:
            return None
        # A live process whose command line cannot be read is still the job: it must be stopped.
        return describe_running(paths) or JobRecord(pid, "", "", "", 0.0)

    def is_running(self, record: JobRecord) -> bool:
        return is_alive(record.pid)

    def start(self, spec: JobSpec, paths: StreamPaths | None = None) -> JobRecord:
        return spawn(spec, paths)

    def stop(
        self,
        paths: StreamPaths,
        record: JobRecord | None = None,
        timeout: float = 180.0,
        term_grace: float = 30.0,
    ) -> StopResult:
        return stop(paths, record.pid if record else None, timeout=timeout, term_grace=term_grace)


class ClusterControl:
    """A driver on a cluster, which the cluster's API submits, reports on and kills.

    The driver runs on another host and reads and writes the same state directory as the DAGs (a
    shared mount, which the config requires to be absolute): the shipped config, ``progress.json`` and
    the stop marker are where they are for a local job. Subclasses say how to submit, ask and kill.
    """

    target = ""
    #: The cluster's states of a driver that runs or is about to.
    active_states: frozenset[str] = frozenset()

    def __init__(self, poll: float = 1.0) -> None:
        self.poll = poll

    def _submit(self, spec: JobSpec, config: KpmonConfig, paths: StreamPaths) -> str:
        raise NotImplementedError

    def state(self, driver_id: str) -> str:
        raise NotImplementedError

    def _kill(self, driver_id: str) -> None:
        raise NotImplementedError

    def describe_running(self, paths: StreamPaths) -> JobRecord | None:
        """The last recorded submission, if the cluster says it is still active. A driver submitted by
        other means is not known here."""
        record = read_record(paths)
        if record is None or record.target != self.target or not record.driver_id:
            return None
        return record if self.is_running(record) else None

    def is_running(self, record: JobRecord) -> bool:
        return bool(record.driver_id) and self.state(record.driver_id) in self.active_states

    def start(self, spec: JobSpec, paths: StreamPaths | None = None) -> JobRecord:
        config = load(spec.config)
        paths = paths or StreamPaths.of(config)
        paths.make()
        started = time.time()
        driver = self._submit(spec, config, paths)
        # The driver's console output stays on the cluster (its worker's or container's log).
        record = JobRecord(0, spec.python, spec.config, "", started, dict(spec.env), self.target, driver)
        write_record(paths, record)
        return record

    def _wait_ended(self, record: JobRecord, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if not self.is_running(record):
                return True
            time.sleep(self.poll)
        return not self.is_running(record)

    def stop(
        self,
        paths: StreamPaths,
        record: JobRecord | None = None,
        timeout: float = 180.0,
        term_grace: float = 30.0,
    ) -> StopResult:
        started = time.monotonic()
        record = record or self.describe_running(paths)
        if record is None or not self.is_running(record):
            return StopResult("not running", 0.0, None)
        paths.root.mkdir(parents=True, exist_ok=True)
        paths.stop_marker.touch()
        how = "graceful"
        try:
            if not self._wait_ended(record, started + timeout):
                how = "killed"
                self._kill(record.driver_id)
                if not self._wait_ended(record, time.monotonic() + term_grace + 30.0):
                    raise JobControlError(f"driver {record.driver_id} is still active after its kill")
        finally:
            paths.stop_marker.unlink(missing_ok=True)
        return StopResult(how, time.monotonic() - started, None)


class StandaloneControl(ClusterControl):
    """A driver on a Spark standalone cluster, through the master's REST submission server."""

    target = "standalone"

    def __init__(self, config: KpmonConfig, poll: float = 1.0) -> None:
        from deploy.spark.rest import ACTIVE_STATES, StandaloneRest, rest_url_of

        super().__init__(poll)
        self.active_states = ACTIVE_STATES
        self.rest = StandaloneRest(
            rest_url_of(config.stream.master, config.deploy.rest_url), config.deploy.request_timeout_seconds
        )

    def state(self, driver_id: str) -> str:
        from deploy.spark.rest import RestError

        try:
            return self.rest.status(driver_id).state
        except RestError as exc:
            raise JobControlError(f"driver {driver_id}: {exc}") from exc

    def _kill(self, driver_id: str) -> None:
        from deploy.spark.rest import RestError

        try:
            self.rest.kill(driver_id)
        except RestError as exc:
            raise JobControlError(f"cannot kill driver {driver_id}: {exc}") from exc

    def _submit(self, spec: JobSpec, config: KpmonConfig, paths: StreamPaths) -> str:
        from deploy.spark.rest import RestError, create_request
        from deploy.spark.submit import DRIVER_FILE, SubmitError, plan_cluster_submission
        from streaming.connector import spark_version

        try:
            plan = plan_cluster_submission(config, spec.python, paths.root / "submit")
        except SubmitError as exc:
            raise JobControlError(str(exc)) from exc
        write_private(plan.config_file, plan.config_yaml)
        request = create_request(
            str(DRIVER_FILE), ["--config", str(plan.config_file)], plan.properties, spec.env, spark_version()
        )
        try:
            return self.rest.submit(request)
        except RestError as exc:
            raise JobControlError(str(exc)) from exc


#: spark-submit's YARN client names the application it submitted in its log.
_YARN_APP = re.compile(r"\bSubmitted application (application_\d+_\d+)")


class YarnControl(ClusterControl):
    """An application on YARN: spark-submit in cluster mode (``kpmon deploy submit``'s plan, returning
    once the application is accepted), its state and kill through the ResourceManager's REST API."""

    target = "yarn"

    def __init__(self, config: KpmonConfig, poll: float = 1.0, submit_timeout: float = 600.0) -> None:
        from deploy.spark.rest import YARN_ACTIVE_STATES, ResourceManagerRest

        super().__init__(poll)
        self.active_states = YARN_ACTIVE_STATES
        assert config.deploy.rest_url is not None  # the config requires it for this target
        self.rm = ResourceManagerRest(config.deploy.rest_url, config.deploy.request_timeout_seconds)
        self.submit_timeout = submit_timeout

    def state(self, driver_id: str) -> str:
        from deploy.spark.rest import RestError

        try:
            return self.rm.state(driver_id)
        except RestError as exc:
            raise JobControlError(f"application {driver_id}: {exc}") from exc

    def _kill(self, driver_id: str) -> None:
        from deploy.spark.rest import RestError

        try:
            self.rm.kill(driver_id)
        except RestError as exc:
            raise JobControlError(f"cannot kill application {driver_id}: {exc}") from exc

    @staticmethod
    def plan(spec: JobSpec, config: KpmonConfig, paths: StreamPaths) -> Any:
        """The spark-submit plan: cluster mode, the build's interpreter on every node."""
        from deploy.spark.submit import SubmitError, SubmitOptions, plan_submit

        deploy = config.deploy
        options = SubmitOptions(
            target="yarn",
            deploy_mode="cluster",
            connector=deploy.connector,
            jars_dir=Path(deploy.jars_dir) if deploy.jars_dir else None,
            executor_python=spec.python,
            shared_checkpoint=True,
            conf={
                "spark.yarn.submit.waitAppCompletion": "false",
                "spark.driver.cores": str(deploy.driver_cores),
                "spark.driver.memory": deploy.driver_memory,
                **deploy.spark_conf,
            },
        )
        try:
            return plan_submit(config, options, paths.root / "submit")
        except SubmitError as exc:
            raise JobControlError(str(exc)) from exc

    def _submit(self, spec: JobSpec, config: KpmonConfig, paths: StreamPaths) -> str:
        from deploy.spark.submit import materialize

        plan = self.plan(spec, config, paths)
        materialize(plan)
        try:
            done = subprocess.run(
                plan.argv,
                env={**os.environ, **plan.env, **spec.env},
                cwd=plan.workdir,
                capture_output=True,
                text=True,
                timeout=self.submit_timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise JobControlError(f"spark-submit: {exc}") from exc
        found = _YARN_APP.search(done.stdout + done.stderr)
        if done.returncode != 0 or found is None:
            tail_lines = (done.stderr or done.stdout).strip().splitlines()[-8:]
            raise JobControlError(f"spark-submit exited {done.returncode}: {' / '.join(tail_lines)}")
        return found.group(1)


class KubernetesControl(ClusterControl):
    """A spark-operator SparkApplication, created, watched (``.status.applicationState.state``) and
    deleted through the Kubernetes API (``deploy/spark/sparkapplication.py``).

    Each start creates a new application, ``<deploy.kubernetes.application>-<UTC time>``, so a
    rollback never mistakes the new build's application for the old one. The driver reads the stop
    marker and writes its progress on the SparkApplication's claim, which the Airflow worker mounts at
    the same path (``state_dir``). The kill is the deletion of the application, in the foreground; the
    application counts as running until both the object and its driver pod are gone.
    """

    target = "kubernetes"

    def __init__(
        self, config: KpmonConfig, poll: float = 1.0, clock: Callable[[], float] = time.time
    ) -> None:
        from deploy.spark.sparkapplication import ACTIVE_STATES

        super().__init__(poll)
        self.active_states = ACTIVE_STATES
        self.settings = config.deploy.kubernetes
        self.request_timeout = config.deploy.request_timeout_seconds
        #: Names the applications (their UTC start time).
        self.clock = clock
        self._apps: Any = None

    @property
    def apps(self) -> Any:
        """The API client, connected on first use (a config is read in many places that never call it)."""
        from deploy.spark.sparkapplication import OperatorError, SparkApplications

        if self._apps is None:
            try:
                self._apps = SparkApplications.connect(self.settings, self.request_timeout)
            except OperatorError as exc:
                raise JobControlError(str(exc)) from exc
        return self._apps

    def _api(self, call: Callable[[Any], Any]) -> Any:
        from deploy.spark.sparkapplication import OperatorError

        try:
            return call(self.apps)
        except OperatorError as exc:
            raise JobControlError(str(exc)) from exc

    def state(self, driver_id: str) -> str:
        return str(self._api(lambda apps: apps.status(driver_id).state))

    def _kill(self, driver_id: str) -> None:
        self._api(lambda apps: apps.delete(driver_id))

    def application_name(self) -> str:
        return f"{self.settings.application}-{time.strftime('%Y%m%d%H%M%S', time.gmtime(self.clock()))}"

    def _submit(self, spec: JobSpec, config: KpmonConfig, paths: StreamPaths) -> str:
        from deploy.spark.sparkapplication import plan_application
        from deploy.spark.submit import SubmitError

        try:
            plan = plan_application(config, self.application_name(), paths.root / "submit")
        except SubmitError as exc:
            raise JobControlError(str(exc)) from exc
        write_private(plan.config_file, plan.config_yaml)
        return str(self._api(lambda apps: apps.create(plan.application)))

    def stop(
        self,
        paths: StreamPaths,
        record: JobRecord | None = None,
        timeout: float = 180.0,
        term_grace: float = 30.0,
    ) -> StopResult:
        """As for every cluster target; then an application that ended by itself (on the marker, or
        failed) is deleted too, so ended applications do not pile up in the namespace. Its driver has
        exited already: nothing waits for the deletion."""
        recorded = record or read_record(paths)
        result = super().stop(paths, record, timeout=timeout, term_grace=term_grace)
        if result.how != "killed" and recorded is not None and recorded.target == self.target:
            name = recorded.driver_id
            if name:
                self._api(lambda apps: apps.delete(name))
        return result


def control_for(config: KpmonConfig | str | os.PathLike[str]) -> JobControl:
    """The job control of a config's ``deploy.target``."""
    config = config if isinstance(config, KpmonConfig) else load(config)
    if config.deploy.target == "standalone":
        return StandaloneControl(config)
    if config.deploy.target == "yarn":
        return YarnControl(config)
    if config.deploy.target == "kubernetes":
        return KubernetesControl(config)
    return LocalControl()
