"""``kpmon_health``: every 10 minutes, look after the running streaming job (docs/operations.md).

* check_and_heal: stalled, lagging or failed query -> ``ops.stream_unhealthy`` alert and a restart;
* storage_report: checkpoint, state store and kpmon's files, sizes as JSON;
* data_docs: rebuild the Great Expectations Data Docs site;
* kip896_report: the KIP-896 readiness report over the last hour of the tap topic, published as HTML.

The four are independent: one failing does not keep the others from running. The step logic is in
airflow_dags/health.py.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

PARAMS = {
    "config": Param(os.environ.get("KPMON_CONFIG", ""), type="string", description="YAML config of the job"),
    "python": Param(
        "", type="string", description="interpreter for a restart (default: the one the job runs with)"
    ),
    "restart": Param(True, type="boolean", description="restart a stalled, lagging or failed job"),
    "report_minutes": Param(
        60, type="number", minimum=1, description="tap-topic minutes in the KIP-896 report"
    ),
    "stop_timeout_seconds": Param(180, type="number", minimum=1),
}


def _params() -> Any:
    from airflow_dags.health import HealthParams

    raw = get_current_context()["params"]
    if not raw.get("config"):
        raise AirflowFailException("parameter config is required (or set KPMON_CONFIG for the DAG processor)")
    return HealthParams(
        config=str(raw["config"]),
        python=str(raw.get("python") or ""),
        restart=bool(raw.get("restart", True)),
        report_minutes=float(raw.get("report_minutes", 60)),
        stop_timeout_seconds=float(raw.get("stop_timeout_seconds", 180)),
    )


@dag(
    dag_id="kpmon_health",
    schedule=timedelta(minutes=10),
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    tags=["kpmon"],
    doc_md=__doc__,
    default_args={"retries": 0},
)
def kpmon_health() -> None:
    @task
    def check_and_heal() -> dict[str, Any]:
        from airflow_dags import health

        return health.check_and_heal(_params())

    @task
    def storage_report() -> dict[str, Any]:
        from airflow_dags import health

        return health.storage_report(_params())

    @task
    def data_docs() -> dict[str, Any]:
        from airflow_dags import health

        return health.rebuild_data_docs(_params())

    @task
    def kip896_report() -> dict[str, Any]:
        from airflow_dags import health

        return health.kip896_report(_params())

    check_and_heal()
    storage_report()
    data_docs()
    kip896_report()


kpmon_health()
