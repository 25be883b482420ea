"""The steps of the periodic ``kpmon_health`` DAG as plain functions (docs/operations.md).

* ``check_and_heal``: a stalled, lagging or failed query (or a job whose process died) raises an
  ``ops.stream_unhealthy`` alert through the job's hooks and is restarted with the same build and config;
* ``storage_report``: checkpoint, state store and kpmon's own files, in bytes, written as JSON;
* ``rebuild_data_docs``: the Great Expectations Data Docs site from the stored validation results;
* ``kip896_report``: the KIP-896 readiness report (``checks.report``) over the last minutes of the tap
  topic, published as HTML, PNG and JSON under ``<state_dir>/stream/reports``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_dags import jobctl
from checks.model import Severity
from kpconfig.model import KpmonConfig, load_config
from streaming.paths import StreamPaths
from streaming.status import judge, read_progress

log = logging.getLogger("kpmon.airflow")

#: Readiness reports kept (the oldest are pruned); ``latest.*`` is always the newest.
KEEP_REPORTS = 48
_SEVERITY = {"stalled": Severity.CRITICAL, "failed": Severity.CRITICAL, "died": Severity.CRITICAL}


@dataclass(frozen=True)
class HealthParams:
    config: str
    python: str = ""
    restart: bool = True
    report_minutes: float = 60.0
    stop_timeout_seconds: float = 180.0


def reports_dir(paths: StreamPaths) -> Path:
    return paths.root / "reports"


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    os.replace(tmp, path)


# -- stalled or lagging: alert and restart ---------------------------------------------------------------


def diagnose(
    progress: dict[str, Any] | None, alive: bool, now: float, config: KpmonConfig
) -> tuple[str, str, Any]:
    """(status, reason, batch id). ``died``: the progress says running but no process is left."""
    health = judge(progress, now, config.stream)
    state = ((progress or {}).get("kpmon") or {}).get("state")
    if not alive and state in ("running", "starting"):
        return "died", "the job's process is gone without stopping its query", health.batch_id
    return health.status, health.reason, health.batch_id


def check_and_heal(
    params: HealthParams,
    now: float | None = None,
    publish: Callable[[KpmonConfig, list[Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    from airflow_dags import opsalerts

    config = load_config(params.config)
    paths = StreamPaths.of(config)
    now = time.time() if now is None else now
    from airflow_dags.redeploy import active_run

    redeploying = active_run(paths, now=now)
    if redeploying is not None:
        log.info("health: redeploy %s is under way; not judging the job", redeploying)
        return {"status": "redeploying", "reason": f"redeploy {redeploying} is under way", "pid": None}
    # Liveness from the job's target (its process here, or its driver's state on the cluster); progress
    # from the file the job writes in the state directory, wherever its driver runs.
    control = jobctl.control_for(config)
    running = control.describe_running(paths)
    pid = running.pid if running is not None else None
    status, reason, batch = diagnose(read_progress(paths.progress), running is not None, now, config)
    result: dict[str, Any] = {"status": status, "reason": reason, "batch_id": batch, "pid": pid}
    if running is not None and running.driver_id:
        result["driver"] = running.driver_id
    if status not in ("stalled", "lagging", "failed", "died"):
        log.info("health: %s (%s)", status, reason)
        return result
    subject = f"stream:{paths.root}"
    alert = opsalerts.ops_alert(
        opsalerts.UNHEALTHY,
        _SEVERITY.get(status, Severity.WARNING),
        subject,
        f"streaming job {status}: {reason}" + ("; restarting it" if params.restart else ""),
        # One episode per (status, batch): repeated health runs during one stall re-send the same id.
        episode=f"{status}|{batch}",
        evidence={
            "status": status,
            "reason": reason,
            "batch_id": batch,
            "pid": pid,
            "target": control.target,
            "state_root": str(paths.root),
        },
        context=config.alert_context(),
    )
    result["alert"] = alert.to_dict()
    result["delivery"] = (publish or opsalerts.publish)(config, [alert])
    if params.restart:
        result["restart"] = restart(paths, params, control)
    return result


def restart(
    paths: StreamPaths, params: HealthParams, control: jobctl.JobControl | None = None
) -> dict[str, Any]:
    """Stop whatever is left of the job and start it again with the build and config it ran with."""
    control = control or jobctl.control_for(params.config)
    running = control.describe_running(paths)
    record = running or jobctl.read_record(paths)
    python = params.python or (record.python if record else "") or sys.executable
    config = (record.config if record and record.config else "") or params.config
    stopped = control.stop(paths, running, timeout=params.stop_timeout_seconds)
    started = control.start(jobctl.JobSpec(python, config, dict(record.env) if record else {}), paths)
    log.warning(
        "health: restarted the job (%s) as %s %s, log %s",
        stopped.how,
        control.target,
        started.handle,
        started.log or "on the cluster",
    )
    return {
        "stopped": stopped.how,
        "pid": started.pid,
        "handle": started.handle,
        "target": control.target,
        "python": python,
        "config": config,
        "log": started.log,
    }


# -- storage report -----------------------------------------------------------------------------------


def dir_size(path: Path) -> tuple[int, int]:
    """(bytes, files) under ``path``; (0, 0) if it does not exist."""
    total = files = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += (Path(root) / name).stat().st_size
                files += 1
            except OSError:
                continue
    return total, files


def storage_report(params: HealthParams) -> dict[str, Any]:
    config = load_config(params.config)
    paths = StreamPaths.of(config)
    checkpoint = paths.checkpoint(config)
    report: dict[str, Any] = {"state_root": str(paths.root), "checkpoint": checkpoint, "at": time.time()}
    local = "://" not in checkpoint or checkpoint.startswith("file:")
    if local:
        root = Path(checkpoint.removeprefix("file://").removeprefix("file:"))
        parts = {}
        for name in ("offsets", "commits", "sources", "state"):
            size, files = dir_size(root / name)
            parts[name] = {"bytes": size, "files": files}
        operators = {}
        state = root / "state"
        if state.is_dir():
            for op in sorted(p for p in state.iterdir() if p.is_dir()):
                size, files = dir_size(op)
                operators[op.name] = {"bytes": size, "files": files}
        total, files = dir_size(root)
        report["checkpoint_size"] = {
            "bytes": total,
            "files": files,
            "parts": parts,
            "state_operators": operators,
        }
    else:
        report["checkpoint_size"] = None
        report["note"] = "remote checkpoint: measure it with the filesystem's own tools"
    for name, path in (
        ("batch_results", paths.batches),
        ("alert_books", paths.alert_books),
        ("hook_spool", paths.spool),
        ("data_docs", paths.data_docs),
    ):
        size, files = dir_size(path)
        report[name] = {"bytes": size, "files": files}
    _write_json(reports_dir(paths) / "storage.json", report)
    measured = (report.get("checkpoint_size") or {}).get("bytes")
    log.info("storage: checkpoint %s bytes, state root %s", measured, paths.root)
    return report


# -- Data Docs ----------------------------------------------------------------------------------------------


def rebuild_data_docs(params: HealthParams) -> dict[str, Any]:
    from streaming.quality import QualityGate

    config = load_config(params.config)
    paths = StreamPaths.of(config)
    if not config.quality.data_docs:
        return {"built": False, "reason": "quality.data_docs is off"}
    started = time.perf_counter()
    index = QualityGate(config.quality, paths.data_docs).build_docs()
    return {
        "built": index is not None,
        "index": str(index) if index else None,
        "seconds": time.perf_counter() - started,
    }


# -- KIP-896 readiness ----------------------------------------------------------------------------------------


def kip896_report(params: HealthParams, max_seconds: float = 600.0) -> dict[str, Any]:
    """The readiness report over the last ``report_minutes`` of the tap topic; ``latest.*`` is the newest."""
    from airflow_dags.tapwindow import choose_window, read_window
    from checks.report import build_report, render_coverage_png, render_html, run_checks
    from codec.taprecord import frames_from_record

    config = load_config(params.config)
    paths = StreamPaths.of(config)
    cluster = config.tap_cluster
    window = choose_window(cluster, config.tap.topic, params.report_minutes)
    frames = (
        frame
        for r in read_window(cluster, window, max_seconds)
        for frame in frames_from_record(r.headers, r.value, r.partition, r.offset)
    )
    monitor, findings = run_checks(frames, config.checks.settings())
    source = (
        f"tap topic {config.tap.topic} on {cluster.bootstrap_servers}, last {params.report_minutes:g} minutes"
    )
    report = build_report(monitor.states, findings, monitor.stats, source)
    out = reports_dir(paths) / "kip896"
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    png = render_coverage_png(report.coverage)
    (out / f"report-{stamp}.png").write_bytes(png)
    (out / f"report-{stamp}.html").write_text(
        render_html(report, png, f"report-{stamp}.png"), encoding="utf-8"
    )
    removed = [
        {
            "software": r.software,
            "api": r.api_name,
            "api_key": r.api_key,
            "version": r.version,
            "requests": r.count,
        }
        for r in report.fleet
        if r.removed_in_4_0
    ]
    summary = {
        "source": source,
        "window": window.to_dict(),
        "frames": monitor.stats.frames,
        "ready_for_4_0": not removed,
        "removed_in_4_0": removed,
        "clients": sorted({r.software for r in report.fleet}),
        "html": str(out / f"report-{stamp}.html"),
    }
    _write_json(out / f"report-{stamp}.json", summary)
    for suffix in ("html", "png", "json"):
        shutil.copyfile(out / f"report-{stamp}.{suffix}", out / f"latest.{suffix}")
    for old in sorted(out.glob("report-*.json"))[:-KEEP_REPORTS]:
        for suffix in ("html", "png", "json"):
            old.with_suffix(f".{suffix}").unlink(missing_ok=True)
    log.info(
        "KIP-896: %d frames, %s; %s",
        monitor.stats.frames,
        "ready for Kafka 4.0"
        if not removed
        else f"{len(removed)} (client, API, version) uses removed in 4.0",
        summary["html"],
    )
    return summary
