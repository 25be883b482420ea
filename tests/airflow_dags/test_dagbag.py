"""The DAG folder imports cleanly in the real Airflow: both DAGs, no import errors, no cycles, the
intended wiring (a failure anywhere triggers the rollback, and the run ends failed)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.airflow_dags.conftest import DAGS


@pytest.fixture(scope="module")
def dagbag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(DAGS))


def test_no_import_errors_and_only_the_two_dags(dagbag: Any) -> None:
    assert dagbag.import_errors == {}
    assert sorted(dagbag.dag_ids) == ["kpmon_health", "kpmon_redeploy"]
    # The helper modules are skipped by .airflowignore, not parsed as DAG files.
    parsed = {stat.file.rsplit("/", 1)[-1] for stat in dagbag.dagbag_stats}
    assert parsed == {"kpmon_health.py", "kpmon_redeploy.py"}


def test_no_cycles(dagbag: Any) -> None:
    for dag in dagbag.dags.values():
        dag.check_cycle()
        dag.validate()


def test_redeploy_wiring(dagbag: Any) -> None:
    dag = dagbag.dags["kpmon_redeploy"]
    chain = ["validate", "canary", "stop_current", "start_new", "health_gate"]
    for upstream, downstream in itertools.pairwise(chain):
        assert dag.get_task(upstream).downstream_task_ids == {downstream}
    assert dag.get_task("rollback").upstream_task_ids == {"health_gate"}
    assert dag.get_task("deploy_failed").upstream_task_ids == {"health_gate", "rollback"}
    rules = {t.task_id: getattr(t.trigger_rule, "value", t.trigger_rule) for t in dag.tasks}
    assert {task for task, rule in rules.items() if rule != "all_success"} == {"rollback", "deploy_failed"}
    assert rules["rollback"] == rules["deploy_failed"] == "one_failed"
    assert not dag.timetable.can_be_scheduled  # manual trigger only
    assert set(dag.params.keys()) >= {
        "new_config",
        "new_python",
        "current_config",
        "canary_minutes",
        "health_batches",
        "allow_fresh_start",
    }


def test_health_dag_is_periodic_with_independent_tasks(dagbag: Any) -> None:
    dag = dagbag.dags["kpmon_health"]
    assert {t.task_id for t in dag.tasks} == {
        "check_and_heal",
        "storage_report",
        "data_docs",
        "kip896_report",
    }
    assert all(not t.upstream_task_ids for t in dag.tasks)
    from datetime import timedelta

    assert dag.timetable.can_be_scheduled
    assert dag.schedule == timedelta(minutes=10)
