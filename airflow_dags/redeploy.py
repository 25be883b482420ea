"""The steps of the ``kpmon_redeploy`` DAG as plain functions (the DAG file only wires them up).

Every step appends what it saw and did to a *journal*, ``<state_dir>/stream/redeploy/<run id>.json`` of
the current config: the rollback reads it to know what was changed (a failed task pushes no XCom), and
an operator reads it to know what happened. See docs/operations.md for the semantics of each step.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from airflow_dags import jobctl
from airflow_dags.canary import alert_keys, compare, processed_offsets, running_alerts
from airflow_dags.gate import FAIL, PASS, HealthGate
from airflow_dags.tapwindow import Window
from checks.model import Severity
from kpconfig.model import ConfigError, KpmonConfig, load_config, write_private
from streaming.compat import check_compatible, describe_changes, read_shape, shape_path
from streaming.paths import StreamPaths
from streaming.sink import read_batches
from streaming.status import judge, read_progress

log = logging.getLogger("kpmon.airflow")


class DeployError(RuntimeError):
    """A redeploy step failed; the message is what the operator needs to read."""


@dataclass(frozen=True)
class Params:
    new_config: str
    current_config: str
    new_python: str = sys.executable
    current_python: str = ""
    canary_minutes: float = 10.0
    canary_gate: str = "critical"
    health_batches: int = 3
    allow_fresh_start: bool = False
    start_timeout_seconds: float = 300.0
    health_timeout_seconds: float = 600.0
    stop_timeout_seconds: float = 180.0
    subprocess_timeout_seconds: float = 600.0

    @staticmethod
    def from_mapping(data: Mapping[str, Any]) -> Params:
        names = Params.__dataclass_fields__
        known = {k: v for k, v in data.items() if k in names and v not in (None, "")}
        for required in ("new_config", "current_config"):
            if not known.get(required):
                raise DeployError(f"parameter {required} is required")
        params = Params(**known)
        return params


# -- the journal ----------------------------------------------------------------------------------------


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_run(cls, current_config: str, run_id: str) -> Journal:
        paths = StreamPaths.of(load_config(current_config))
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)
        return cls(paths.root / "redeploy" / f"{safe}.json")

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write(self, step: str, data: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        journal = self.read()
        journal[step] = {**data, "at": time.time()}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(journal, indent=1, sort_keys=True, default=str))
        os.replace(tmp, self.path)

    def get(self, step: str) -> dict[str, Any] | None:
        value = self.read().get(step)
        return value if isinstance(value, dict) else None


def active_run(paths: StreamPaths, max_age: float = 3 * 3600.0, now: float | None = None) -> str | None:
    """The journal of a redeploy still under way on these paths (validated, neither through its health
    gate nor rolled back), so ``kpmon_health`` does not restart a job in the middle of a swap. A journal
    untouched for ``max_age`` seconds belongs to a run that died with its worker."""
    now = time.time() if now is None else now
    for path in sorted(
        (paths.root / "redeploy").glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True
    ):
        if now - path.stat().st_mtime > max_age:
            break
        steps = Journal(path).read()
        if "validate" in steps and "health_gate" not in steps and "rollback" not in steps:
            return path.stem
    return None


def _journaled(journal: Journal, step: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a step; its result or its failure goes in the journal either way."""
    try:
        result = body()
    except Exception as exc:
        journal.write(f"{step}.failed", {"error": str(exc), "type": type(exc).__name__})
        raise
    journal.write(step, result)
    return result


# -- helpers -------------------------------------------------------------------------------------------


def _load(path: str, what: str) -> KpmonConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        raise DeployError(f"{what} config {path}: {exc}") from exc


def run_build(python: str, args: list[str], timeout: float) -> dict[str, Any]:
    """``<python> -m <args>`` of another build; its one-line JSON answer, or DeployError with its stderr."""
    try:
        done = subprocess.run(
            [python, "-m", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeployError(f"{python} -m {' '.join(args[:1])}: {exc}") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()[-8:]
        raise DeployError(f"{python} -m {args[0]} exited {done.returncode}: {' / '.join(detail)}")
    try:
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1])
    except (IndexError, ValueError) as exc:
        raise DeployError(f"{python} -m {args[0]} printed no JSON: {done.stdout[-500:]}") from exc
    if not isinstance(result, dict):
        raise DeployError(f"{python} -m {args[0]} printed {type(result).__name__}, not an object")
    return result


def checkpoint_exists(location: str) -> bool:
    """A local checkpoint directory with committed batches; remote URIs are assumed to exist."""
    if "://" in location and not location.startswith("file:"):
        return True
    path = Path(location.removeprefix("file://").removeprefix("file:"))
    return (path / "offsets").is_dir() or (path / "commits").is_dir()


def validate_manifests(k8s_dir: Path) -> list[str]:
    """Problems in a build's Kubernetes manifests: unparsable YAML, objects without apiVersion/kind/name,
    a shared-config ConfigMap whose kpmon.yaml does not load. kubeconform checks them against the
    Kubernetes schemas when installed (deploy/manifests.py)."""
    problems: list[str] = []
    files = sorted(k8s_dir.rglob("*.yaml"))
    for path in files:
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except (OSError, yaml.YAMLError) as exc:
            problems.append(f"{path}: {exc}")
            continue
        for doc in docs:
            if not isinstance(doc, dict):
                problems.append(f"{path}: a document is not a mapping")
                continue
            name = (doc.get("metadata") or {}).get("name")
            if doc.get("kind") == "Kustomization":
                continue
            if not doc.get("apiVersion") or not doc.get("kind") or not name:
                # A strategic-merge patch (the sidecar variant) names only what it changes.
                if "sidecar" not in path.parts:
                    problems.append(f"{path}: object without apiVersion, kind or metadata.name")
                continue
            if doc["kind"] == "ConfigMap":
                for key, text in (doc.get("data") or {}).items():
                    if key.endswith((".yaml", ".yml")) and "kpmon" in key:
                        problems += _configmap_config(path, name, key, text)
    return problems


def _configmap_config(path: Path, name: str, key: str, text: str) -> list[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(text)
    try:
        load_config(handle.name, environ={})
    except ConfigError as exc:
        return [f"{path}: ConfigMap {name} {key}: {exc}"]
    finally:
        os.unlink(handle.name)
    return []


def _build_k8s_dir(python: str, timeout: float) -> Path | None:
    """Where the build's deploy/k8s manifests are (installed as package data), if it has them."""
    code = (
        "import json, pathlib, deploy; print(json.dumps({'dir': str(pathlib.Path(deploy.__file__).parent)}))"
    )
    try:
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
        )
        found = json.loads(done.stdout.strip().splitlines()[-1])["dir"] if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError):
        return None
    k8s = Path(found) / "k8s" if found else None
    return k8s if k8s is not None and k8s.is_dir() else None


def _kubeconform(k8s_dir: Path) -> list[str]:
    try:
        from deploy import manifests
    except ImportError:
        return []
    binary, schemas = manifests.find_kubeconform(), manifests.bundled_schemas()
    if binary is None or schemas is None:
        return []
    from kpconfig.paths import kpmon_home

    target = kpmon_home() / "cache" / "k8s-schemas" / f"v{manifests.KUBERNETES_VERSION}"
    schema_dir = manifests.prepare_schemas(schemas, target)
    files = [
        str(p)
        for p in sorted(k8s_dir.rglob("*.yaml"))
        if not any(part in p.relative_to(k8s_dir).as_posix() for part in ("kustomization.yaml", "sidecar/"))
    ]
    done = subprocess.run(
        manifests.kubeconform_argv(binary, schema_dir, files), capture_output=True, text=True, check=False
    )
    if done.returncode == 0:
        return []
    return [
        f"kubeconform: {line}" for line in (done.stdout + done.stderr).splitlines() if "error" in line.lower()
    ]


def fresh_start_config(new_config: str, stamp: str) -> str:
    """The new config moved to a state directory (and checkpoint) of its own; the old ones stay untouched
    for a rollback. Returns the path of the derived config file."""
    config = _load(new_config, "new")
    stamp = re.sub(r"[^A-Za-z0-9_.-]+", "_", stamp)
    raw = yaml.safe_load(Path(new_config).read_text()) or {}
    state_dir = Path(config.state_dir).resolve() / f"fresh-{stamp}"
    raw["state_dir"] = str(state_dir)
    if config.stream.checkpoint_dir:
        raw.setdefault("stream", {})["checkpoint_dir"] = (
            f"{config.stream.checkpoint_dir.rstrip('/')}-fresh-{stamp}"
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    derived = state_dir / "kpmon.yaml"
    write_private(derived, yaml.safe_dump(raw, sort_keys=False))  # may hold secrets
    return str(derived)


# -- step 1: validate ------------------------------------------------------------------------------------


def validate(params: Params, journal: Journal, run_stamp: str) -> dict[str, Any]:
    return _journaled(journal, "validate", lambda: _validate(params, run_stamp))


def _validate(params: Params, run_stamp: str) -> dict[str, Any]:
    current = _load(params.current_config, "current")
    new = _load(params.new_config, "new")
    notes: list[str] = []
    for which, cfg in (("current", current), ("new", new)):
        if not Path(cfg.state_dir).is_absolute():
            notes.append(
                f"{which} config has a relative state_dir ({cfg.state_dir}): it resolves from {os.getcwd()}"
            )
    cur_paths, new_paths = StreamPaths.of(current), StreamPaths.of(new)
    running = jobctl.control_for(current).describe_running(cur_paths)
    recorded = jobctl.read_record(cur_paths)
    current_python = (
        params.current_python or (running.python if running else "") or (recorded.python if recorded else "")
    )
    if not current_python:
        current_python = sys.executable
        notes.append(f"the current build's interpreter is unknown; rollback would use {current_python}")
    progress = read_progress(cur_paths.progress) or {}
    # The new build checks its own config and tells its own shape: its code is what will run.
    new_record = run_build(
        params.new_python,
        ["streaming.compat", "--config", params.new_config],
        params.subprocess_timeout_seconds,
    )
    new_shape = new_record["shape"]
    cur_checkpoint = cur_paths.checkpoint(current)
    new_checkpoint = new_paths.checkpoint(new)
    saved = read_shape(shape_path(cur_paths))
    saved_shape: dict[str, Any] | None = None
    if saved is not None and saved.get("checkpoint") == cur_checkpoint:
        saved_shape = saved["shape"]
    problems: list[str] = []
    rollback_problems: list[str] = []
    has_state = checkpoint_exists(cur_checkpoint)
    if new_checkpoint != cur_checkpoint:
        problems.append(
            f"the new config uses checkpoint {new_checkpoint}, not the running one ({cur_checkpoint}): "
            "that is a fresh start"
        )
    elif has_state:
        if saved_shape is None:
            # Written by a build before query shapes were recorded: ask the running build itself.
            try:
                saved_shape = run_build(
                    current_python,
                    ["streaming.compat", "--config", params.current_config],
                    params.subprocess_timeout_seconds,
                )["shape"]
                notes.append("no recorded query shape: the current build computed it")
            except DeployError as exc:
                problems.append(f"the running checkpoint's query shape is unknown ({exc})")
        if saved_shape is not None:
            problems += check_compatible(saved_shape, new_shape)
            rollback_problems = [f"rollback: {p}" for p in check_compatible(new_shape, saved_shape)]
            notes += describe_changes(saved_shape, new_shape)
    k8s = _build_k8s_dir(params.new_python, params.subprocess_timeout_seconds)
    manifest_problems: list[str] = []
    if k8s is not None:
        manifest_problems = validate_manifests(k8s) + _kubeconform(k8s)
    if manifest_problems:
        raise DeployError(
            "the new build's Kubernetes manifests do not validate: " + "; ".join(manifest_problems)
        )
    fresh = False
    effective = params.new_config
    if problems or rollback_problems:
        listed = "; ".join(problems + rollback_problems)
        if not params.allow_fresh_start:
            raise DeployError(
                f"the new build cannot resume the running checkpoint {cur_checkpoint}: {listed}. "
                "Fix the config, or trigger again with allow_fresh_start=true to start from a new checkpoint "
                "(the old one is kept for rollback)."
            )
        fresh = True
        effective = fresh_start_config(params.new_config, run_stamp)
        notes.append(f"fresh start decided ({listed}); the new job runs with {effective}")
    batch = progress.get("batchId")
    effective_config = _load(effective, "new")
    effective_paths = StreamPaths.of(effective_config)
    plan = {
        "current": {
            "config": params.current_config,
            "python": current_python,
            "pid": running.pid if running else None,
            "handle": running.handle if running else None,
            "target": current.deploy.target,
            "running": running is not None,
            "state_root": str(cur_paths.root),
            "checkpoint": cur_checkpoint,
            "batch_id": batch if isinstance(batch, int) else None,
        },
        "new": {
            "config": effective,
            "requested_config": params.new_config,
            "python": params.new_python,
            "target": effective_config.deploy.target,
            "state_root": str(effective_paths.root),
            "checkpoint": effective_paths.checkpoint(effective_config),
            "fresh_start": fresh,
            "resumes": not fresh and has_state,
        },
        "problems": problems + rollback_problems,
        "notes": notes,
        "manifests": str(k8s) if k8s else None,
    }
    for note in notes:
        log.info("validate: %s", note)
    return plan


def _plan(journal: Journal) -> dict[str, Any]:
    plan = journal.get("validate")
    if plan is None:
        raise DeployError(f"no validated plan in {journal.path}: run the validate step first")
    return plan


# -- step 2: canary ---------------------------------------------------------------------------------------


def canary(params: Params, journal: Journal) -> dict[str, Any]:
    return _journaled(journal, "canary", lambda: _canary(params, _plan(journal)))


def _canary(params: Params, plan: dict[str, Any]) -> dict[str, Any]:
    if params.canary_minutes <= 0:
        return {"skipped": "canary_minutes is 0"}
    current = _load(plan["current"]["config"], "current")
    cur_paths = StreamPaths.of(current)
    processed = processed_offsets(read_progress(cur_paths.progress), current.tap.topic)
    args = [
        "airflow_dags.canary",
        "--config",
        plan["new"]["config"],
        "--source-config",
        plan["current"]["config"],
        "--minutes",
        str(params.canary_minutes),
    ]
    if processed:
        args += ["--end-offsets", json.dumps({str(p): o for p, o in processed.items()})]
    new_run = run_build(plan["new"]["python"], args, params.subprocess_timeout_seconds)
    window = Window.from_dict(new_run["window"])
    replay = new_run["replay"]
    ts_range = (replay["ts_min"], replay["ts_max"]) if replay["ts_min"] is not None else None
    baseline: dict[Any, str] | None = None
    baseline_note = None
    try:
        base_run = run_build(
            plan["current"]["python"],
            [
                "airflow_dags.canary",
                "--config",
                plan["current"]["config"],
                "--window",
                json.dumps(new_run["window"]),
            ],
            params.subprocess_timeout_seconds,
        )
        baseline = alert_keys(base_run["replay"]["alerts"])
    except DeployError as exc:
        baseline_note = f"the running build could not replay the window ({exc}): every lost alert counts"
        log.warning("canary: %s", baseline_note)
    running = running_alerts(read_batches(cur_paths), window, ts_range)
    comparison = compare(running, alert_keys(replay["alerts"]), baseline)
    result = {
        "window": new_run["window"],
        "records": replay["records"],
        "comparison": comparison.to_dict(),
        "baseline_note": baseline_note,
        "gate": params.canary_gate,
    }
    log.info(
        "canary: %d records; running %d alerts, new %d, matched %d, missing %d, extra %d",
        replay["records"],
        comparison.running,
        comparison.new,
        comparison.matched,
        len(comparison.missing),
        len(comparison.extra),
    )
    for diff in comparison.missing:
        log.info("canary: missing %s %s on %s (%s)", diff.severity, diff.rule, diff.subject, diff.cause)
    for diff in comparison.extra:
        log.info("canary: extra %s %s on %s", diff.severity, diff.rule, diff.subject)
    failures = comparison.failures(params.canary_gate)
    if failures:
        raise DeployError(f"canary: the new build loses alerts the running one raises: {'; '.join(failures)}")
    return result


# -- step 3: graceful stop ----------------------------------------------------------------------------------


def stop_current(params: Params, journal: Journal) -> dict[str, Any]:
    return _journaled(journal, "stop_current", lambda: _stop_current(params, _plan(journal)))


def _stop_current(params: Params, plan: dict[str, Any]) -> dict[str, Any]:
    paths = StreamPaths(Path(plan["current"]["state_root"]))
    control = jobctl.control_for(plan["current"]["config"])
    running = control.describe_running(paths)
    if running is None:
        return {"was_running": False, "how": "not running", "batch_id": plan["current"]["batch_id"]}
    result = control.stop(paths, running, timeout=params.stop_timeout_seconds)
    progress = read_progress(paths.progress) or {}
    batch = progress.get("batchId")
    log.info(
        "stop: job %s stopped (%s) in %.1f s after batch %s",
        running.handle,
        result.how,
        result.seconds,
        batch,
    )
    return {
        "was_running": True,
        "pid": running.pid,
        "handle": running.handle,
        "target": control.target,
        "how": result.how,
        "seconds": round(result.seconds, 3),
        "batch_id": batch if isinstance(batch, int) else None,
    }


# -- step 4: start the new version ---------------------------------------------------------------------------


def start_new(params: Params, journal: Journal) -> dict[str, Any]:
    def body() -> dict[str, Any]:
        plan = _plan(journal)
        stopped = journal.get("stop_current") or {}
        paths = StreamPaths(Path(plan["new"]["state_root"]))
        control = jobctl.control_for(plan["new"]["config"])
        if control.describe_running(paths) is not None:
            raise DeployError(f"a job is already running on {paths.root}: the old one did not stop")
        try:
            record = control.start(jobctl.JobSpec(plan["new"]["python"], plan["new"]["config"]), paths)
        except jobctl.JobControlError as exc:
            raise DeployError(f"cannot start the new job on {control.target}: {exc}") from exc
        log.info(
            "start: new job %s on %s (%s, %s), log %s",
            record.handle,
            control.target,
            record.python,
            record.config,
            record.log or "on the cluster",
        )
        baseline = stopped.get("batch_id") if plan["new"]["resumes"] else None
        return {**record.to_dict(), "baseline_batch": baseline}

    return _journaled(journal, "start_new", body)


# -- step 5: health gate -----------------------------------------------------------------------------------


def health_gate(
    params: Params,
    journal: Journal,
    poll: float = 1.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    def body() -> dict[str, Any]:
        plan = _plan(journal)
        started = journal.get("start_new")
        if started is None:
            raise DeployError("the new job was not started")
        config = _load(plan["new"]["config"], "new")
        paths = StreamPaths.of(config)
        control = jobctl.control_for(config)
        record = jobctl.JobRecord.from_dict(started)
        gate = HealthGate(
            params.health_batches,
            since=float(started["started_at"]),
            baseline_batch=started.get("baseline_batch"),
            start_timeout=params.start_timeout_seconds,
            timeout=params.health_timeout_seconds,
        )
        last_reason = ""
        while True:
            now = clock()
            progress = read_progress(paths.progress)
            health = judge(progress, now, config.stream)
            verdict = gate.observe(now, control.is_running(record), progress, health)
            if verdict.reason != last_reason:
                log.info("health gate: %s (%s)", verdict.outcome, verdict.reason)
                last_reason = verdict.reason
            if verdict.outcome == FAIL:
                raise DeployError(f"health gate failed: {verdict.reason}. {_job_log(record)}")
            if verdict.outcome == PASS:
                break
            sleep(poll)
        floor = started.get("baseline_batch")
        floor = floor if isinstance(floor, int) else -1
        new_batches = [b for b in read_batches(paths) if int(b.get("batch_id", -1)) > floor]
        errors = {
            key: sum(int((b.get("stats") or {}).get(key, 0)) for b in new_batches)
            for key in ("hook_errors", "quality_errors")
        }
        return {
            "outcome": verdict.outcome,
            "reason": verdict.reason,
            "batches": verdict.batches,
            "health": health.to_dict(),
            "batch_files": len(new_batches),
            "frames": sum(int(b.get("frames", 0)) for b in new_batches),
            "errors": errors,
        }

    return _journaled(journal, "health_gate", body)


# -- step 6: rollback --------------------------------------------------------------------------------------


def _failure(journal: Journal) -> tuple[str, str]:
    data = journal.read()
    for step in ("health_gate", "start_new", "stop_current", "canary", "validate"):
        failed = data.get(f"{step}.failed")
        if failed:
            return step, str(failed.get("error", ""))
    return "unknown", "a step failed without a journal entry"


def rollback(
    params: Params,
    journal: Journal,
    run_id: str,
    restart_timeout: float | None = None,
    publish: Callable[[KpmonConfig, list[Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Undo what the run changed: stop the new job, restart the previous build with its config (from the
    checkpoint as the new one left it), and alert. A run that failed before touching the running job has
    nothing to undo and sends nothing."""

    def body() -> dict[str, Any]:
        from airflow_dags import opsalerts

        plan = journal.get("validate")
        if plan is None:
            return {"rolled_back": False, "reason": "validation failed: the running job was never touched"}
        stopped = journal.get("stop_current")
        started = journal.get("start_new")
        failed_step, reason = _failure(journal)
        old_pid = plan["current"]["pid"]
        old_handle = plan["current"].get("handle") or (str(old_pid) if old_pid else None)
        actions: list[str] = []
        new_paths = StreamPaths(Path(plan["new"]["state_root"]))
        old_paths = StreamPaths(Path(plan["current"]["state_root"]))
        new_control = jobctl.control_for(plan["new"]["config"])
        old_control = jobctl.control_for(plan["current"]["config"])
        candidates: dict[str, jobctl.JobRecord] = {}
        for record in (
            new_control.describe_running(new_paths),
            jobctl.JobRecord.from_dict(started) if started else None,
        ):
            if record is not None and record.handle != old_handle:
                candidates[record.handle] = record
        for handle, record in sorted(candidates.items()):
            if not new_control.is_running(record):
                continue
            result = new_control.stop(new_paths, record, timeout=params.stop_timeout_seconds, term_grace=15.0)
            actions.append(f"stopped new job {handle} ({result.how}, {result.seconds:.1f} s)")
        restarted: dict[str, Any] | None = None
        old_alive = old_control.describe_running(old_paths)
        if plan["current"]["running"] and old_alive is None:
            spec = jobctl.JobSpec(plan["current"]["python"], plan["current"]["config"])
            record = old_control.start(spec, old_paths)
            confirmed = _wait_started(
                old_control, old_paths, record, restart_timeout or params.start_timeout_seconds
            )
            restarted = {**record.to_dict(), "confirmed": confirmed}
            actions.append(
                f"restarted the previous build ({old_control.target} {record.handle}, {spec.python}, "
                f"{spec.config})"
                + ("" if confirmed else f"; it has not reported progress yet. {_job_log(record)}")
            )
        if not actions:
            return {
                "rolled_back": False,
                "reason": f"{failed_step} failed before the running job was touched: {reason}",
                "stopped": stopped,
            }
        current = _load(plan["current"]["config"], "current")
        summary = (
            f"redeploy rolled back: {failed_step} failed ({reason.splitlines()[0][:300]}); "
            f"{'; '.join(actions)}"
        )
        alert = opsalerts.ops_alert(
            opsalerts.ROLLED_BACK,
            Severity.CRITICAL,
            f"stream:{old_paths.root}",
            summary,
            episode=run_id,
            evidence={
                "run_id": run_id,
                "failed_step": failed_step,
                "reason": reason[:2000],
                "new": {k: plan["new"][k] for k in ("config", "python", "fresh_start")},
                "previous": {k: plan["current"][k] for k in ("config", "python")},
                "actions": actions,
            },
            context=current.alert_context(),
        )
        delivery = (publish or opsalerts.publish)(current, [alert])
        return {
            "rolled_back": True,
            "failed_step": failed_step,
            "reason": reason,
            "actions": actions,
            "restarted": restarted,
            "alert": alert.to_dict(),
            "delivery": delivery,
        }

    return _journaled(journal, "rollback", body)


def _job_log(record: jobctl.JobRecord) -> str:
    """Where to read what the job said: the end of its log here, or where its driver keeps it."""
    if record.target == "kubernetes":
        return f"See the driver pod's log: kubectl logs {record.driver_id}-driver."
    if record.target == "yarn":
        return f"See the application's logs: yarn logs -applicationId {record.driver_id}."
    if record.driver_id:
        return f"See driver {record.driver_id}'s stderr in its worker's work directory."
    return f"Last lines of {record.log}:\n{jobctl.tail(record.log, 15)}"


def _wait_started(
    control: jobctl.JobControl, paths: StreamPaths, record: jobctl.JobRecord, timeout: float
) -> bool:
    """Whether the restarted job reports its query started (a progress file newer than the spawn)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not control.is_running(record):
            return False
        progress = read_progress(paths.progress) or {}
        if float((progress.get("kpmon") or {}).get("written_at", 0.0)) >= record.started_at:
            return True
        time.sleep(1.0)
    return False
