"""``kpmon_redeploy``: swap the running streaming job for a new build or config without losing findings.

validate >> canary >> stop_current >> start_new >> health_gate, then on any failure rollback, and
deploy_failed marks the run failed. Trigger it by hand (or from CI) with the new config and the new
build's interpreter; docs/operations.md has what each step checks and what a rollback does. The step logic
lives in airflow_dags/redeploy.py; this file only wires it into Airflow.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

PARAMS = {
    "new_config": Param(
        os.environ.get("KPMON_CONFIG", ""), type="string", description="YAML config of the new version"
    ),
    "current_config": Param(
        os.environ.get("KPMON_CONFIG", ""), type="string", description="YAML config the job runs with now"
    ),
    "new_python": Param(
        sys.executable, type="string", description="interpreter of the new build (its venv's python)"
    ),
    "current_python": Param(
        "", type="string", description="interpreter of the running build (default: read from the running job)"
    ),
    "canary_minutes": Param(
        10, type="number", minimum=0, description="tap-topic minutes to replay (0: skip)"
    ),
    "canary_gate": Param(
        "critical",
        enum=["critical", "any", "report"],
        description="fail on lost critical alerts, on any lost alert, or only report",
    ),
    "health_batches": Param(3, type="integer", minimum=0, description="healthy batches the new job must run"),
    "allow_fresh_start": Param(
        False, type="boolean", description="if the checkpoint cannot be resumed, start from a new one"
    ),
    "start_timeout_seconds": Param(300, type="number", minimum=1),
    "health_timeout_seconds": Param(600, type="number", minimum=1),
    "stop_timeout_seconds": Param(180, type="number", minimum=1),
}


def _context() -> tuple[Any, Any, str]:
    from airflow_dags.redeploy import DeployError, Journal, Params

    context = get_current_context()
    try:
        params = Params.from_mapping(context["params"])
    except DeployError as exc:
        raise AirflowFailException(str(exc)) from exc
    run_id = str(context["run_id"])
    return params, Journal.for_run(params.current_config, run_id), run_id


def _step(name: str) -> dict[str, Any]:
    from airflow_dags import redeploy

    params, journal, run_id = _context()
    try:
        if name == "validate":
            return redeploy.validate(params, journal, run_id)
        if name == "health_gate":
            return redeploy.health_gate(params, journal)
        if name == "rollback":
            return redeploy.rollback(params, journal, run_id)
        result: dict[str, Any] = getattr(redeploy, name)(params, journal)
        return result
    except redeploy.DeployError as exc:
        # Retrying would not help: the message says what to fix.
        raise AirflowFailException(str(exc)) from exc


@dag(
    dag_id="kpmon_redeploy",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    tags=["kpmon"],
    doc_md=__doc__,
    default_args={"retries": 0},
)
def kpmon_redeploy() -> None:
    @task
    def validate() -> dict[str, Any]:
        """Configs, manifests and whether the new build can resume the running checkpoint."""
        return _step("validate")

    @task
    def canary() -> dict[str, Any]:
        """The last N minutes of the tap topic through the new build's checks, against the running alerts."""
        return _step("canary")

    @task
    def stop_current() -> dict[str, Any]:
        """Graceful stop: the running batch finishes."""
        return _step("stop_current")

    @task
    def start_new() -> dict[str, Any]:
        """The new build from the same checkpoint (or a new one, after a fresh-start decision)."""
        return _step("start_new")

    @task
    def health_gate() -> dict[str, Any]:
        """Progress advancing, lag bounded, no failed batch, for K batches."""
        return _step("health_gate")

    @task(trigger_rule="one_failed")
    def rollback() -> dict[str, Any]:
        """Stop the new job, restart the previous build and config, alert (ops.redeploy_rolled_back)."""
        return _step("rollback")

    @task(trigger_rule="one_failed")
    def deploy_failed() -> None:
        """Marks the run failed when any step failed, whether or not the rollback succeeded."""
        _params, journal, _run_id = _context()
        steps = journal.read()
        failed = [
            f"{k.removesuffix('.failed')}: {v.get('error')}"
            for k, v in steps.items()
            if k.endswith(".failed")
        ]
        rolled = (steps.get("rollback") or {}).get("rolled_back")
        raise AirflowFailException(
            f"redeploy failed ({'; '.join(failed) or 'see the task logs'}); "
            f"{'rolled back to the previous version' if rolled else 'the running job was left as it was'}"
        )

    gate = health_gate()
    failed = deploy_failed()
    # A failure anywhere reaches health_gate as upstream_failed, which is what fires the rollback.
    validate() >> canary() >> stop_current() >> start_new() >> gate >> rollback() >> failed
    gate >> failed


kpmon_redeploy()
