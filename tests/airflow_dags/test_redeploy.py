"""The redeploy steps without Airflow and without Spark: validation decisions, manifests, the journal,
and a rollback that has nothing to undo. The steps against a real running job are in
test_kpmon_redeploy.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_dags import redeploy
from airflow_dags.redeploy import DeployError, Journal, Params
from kpconfig.model import load_config
from streaming.compat import query_shape, shape_path
from streaming.paths import StreamPaths

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, data: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture
def configs(tmp_path: Path) -> tuple[str, str]:
    state = str(tmp_path / "state")
    base = {"state_dir": state, "tap": {"topic": "tap"}, "stream": {"shuffle_partitions": 2}}
    current = write(tmp_path / "current.yaml", base)
    new = write(tmp_path / "new.yaml", {**base, "stream": {"shuffle_partitions": 2, "trigger_seconds": 2.0}})
    return current, new


def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal.json")


def running_checkpoint(config_path: str, shape: dict[str, Any] | None = None) -> Path:
    """A checkpoint with committed batches and, optionally, the shape its job recorded."""
    config = load_config(config_path)
    paths = StreamPaths.of(config)
    checkpoint = Path(paths.checkpoint(config))
    (checkpoint / "offsets").mkdir(parents=True)
    if shape is not None:
        record = {"checkpoint": str(checkpoint), "shape": shape}
        shape_path(paths).write_text(json.dumps(record))
    return checkpoint


def _record(sent: list[Any], alerts: list[Any]) -> dict[str, Any]:
    """A stand-in for the ops-alert publisher: keeps what it was given."""
    sent.append(alerts)
    return {}


def test_params_need_both_configs() -> None:
    with pytest.raises(DeployError, match="new_config"):
        Params.from_mapping({"current_config": "x"})
    params = Params.from_mapping(
        {"new_config": "n", "current_config": "c", "current_python": "", "canary_minutes": 0}
    )
    assert params.current_python == "" and params.canary_minutes == 0 and params.new_python == sys.executable


def test_journal_keeps_results_and_failures(tmp_path: Path) -> None:
    j = journal(tmp_path)
    assert redeploy._journaled(j, "one", lambda: {"x": 1}) == {"x": 1}
    with pytest.raises(ZeroDivisionError):
        redeploy._journaled(j, "two", lambda: {"y": 1 // 0})
    data = j.read()
    assert data["one"]["x"] == 1 and data["two.failed"]["type"] == "ZeroDivisionError"
    assert redeploy._failure(j) == ("unknown", "a step failed without a journal entry")
    j.write("health_gate.failed", {"error": "stalled"})
    assert redeploy._failure(j) == ("health_gate", "stalled")
    run = Journal.for_run(
        str(write(tmp_path / "c.yaml", {"state_dir": str(tmp_path / "s")})),
        "manual__2025-01-01T00:00:00+00:00",
    )
    assert run.path == tmp_path / "s" / "stream" / "redeploy" / "manual__2025-01-01T00_00_00_00_00.json"


def test_nothing_running_nothing_to_resume(tmp_path: Path, configs: tuple[str, str]) -> None:
    current, new = configs
    plan = redeploy.validate(Params(new, current), journal(tmp_path), "run1")
    assert plan["problems"] == [] and plan["new"]["fresh_start"] is False
    assert plan["new"]["resumes"] is False and plan["current"]["running"] is False
    assert plan["new"]["config"] == new
    # This repository's own manifests were found through the build's interpreter and validate.
    assert plan["manifests"] == str(REPO / "deploy" / "k8s")
    assert journal(tmp_path).get("validate") == {**plan, "at": journal(tmp_path).get("validate")["at"]}  # type: ignore[index]


def test_a_compatible_checkpoint_is_resumed(tmp_path: Path, configs: tuple[str, str]) -> None:
    current, new = configs
    running_checkpoint(current, query_shape(load_config(current)))
    plan = redeploy.validate(Params(new, current), journal(tmp_path), "run1")
    assert plan["problems"] == [] and plan["new"]["resumes"] is True
    assert plan["new"]["checkpoint"] == plan["current"]["checkpoint"]


def test_an_incompatible_checkpoint_needs_a_fresh_start_decision(
    tmp_path: Path, configs: tuple[str, str]
) -> None:
    current, _new = configs
    checkpoint = running_checkpoint(current, query_shape(load_config(current)))
    changed = write(
        tmp_path / "changed.yaml",
        {**yaml.safe_load(Path(current).read_text()), "stream": {"shuffle_partitions": 8}},
    )
    with pytest.raises(DeployError) as failed:
        redeploy.validate(Params(changed, current), journal(tmp_path), "run1")
    message = str(failed.value)
    assert "cannot resume" in message and "shuffle_partitions changed 2 -> 8" in message
    assert "allow_fresh_start" in message
    assert journal(tmp_path).get("validate.failed") is not None

    plan = redeploy.validate(Params(changed, current, allow_fresh_start=True), journal(tmp_path), "run/2")
    fresh = load_config(plan["new"]["config"])
    assert plan["new"]["fresh_start"] is True and plan["new"]["resumes"] is False
    assert fresh.stream.shuffle_partitions == 8
    assert fresh.state_dir == str(tmp_path / "state" / "fresh-run_2")
    assert StreamPaths.of(fresh).checkpoint(fresh) != str(checkpoint)
    assert (checkpoint / "offsets").is_dir()  # the old checkpoint is kept for a rollback


def test_a_newer_state_format_cannot_be_rolled_back_in_place(
    tmp_path: Path, configs: tuple[str, str]
) -> None:
    current, new = configs
    older = query_shape(load_config(current))
    older["state_format"] -= 1  # the running build writes an older format than the new one reads
    running_checkpoint(current, older)
    with pytest.raises(DeployError, match="rollback: monitor state format"):
        redeploy.validate(Params(new, current), journal(tmp_path), "run1")


def test_without_a_recorded_shape_the_running_build_is_asked(
    tmp_path: Path, configs: tuple[str, str]
) -> None:
    current, new = configs
    running_checkpoint(current, shape=None)
    plan = redeploy.validate(Params(new, current), journal(tmp_path), "run1")
    assert plan["problems"] == [] and any("current build computed it" in n for n in plan["notes"])
    broken = redeploy.validate
    with pytest.raises(DeployError, match="query shape is unknown"):
        broken(Params(new, current, current_python=str(tmp_path / "no-python")), journal(tmp_path), "run2")


def test_a_config_the_new_build_rejects(tmp_path: Path, configs: tuple[str, str]) -> None:
    current, _new = configs
    bad = write(tmp_path / "bad.yaml", {"stream": {"trigger_seconds": 0}})
    with pytest.raises(DeployError, match="trigger_seconds"):
        redeploy.validate(Params(bad, current), journal(tmp_path), "run1")


def test_a_different_checkpoint_is_a_fresh_start(tmp_path: Path, configs: tuple[str, str]) -> None:
    current, _new = configs
    running_checkpoint(current, query_shape(load_config(current)))
    elsewhere = write(
        tmp_path / "elsewhere.yaml", {"state_dir": str(tmp_path / "other"), "tap": {"topic": "tap"}}
    )
    with pytest.raises(DeployError, match="that is a fresh start"):
        redeploy.validate(Params(elsewhere, current), journal(tmp_path), "run1")


def test_manifest_problems_are_named(tmp_path: Path) -> None:
    k8s = tmp_path / "k8s"
    (k8s / "sidecar").mkdir(parents=True)
    (k8s / "broken.yaml").write_text("kind: [unclosed\n")
    (k8s / "nameless.yaml").write_text("apiVersion: v1\nkind: Service\n")
    (k8s / "sidecar" / "patch.yaml").write_text("spec: {}\n")  # a patch names only what it changes
    (k8s / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
    )
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kpmon-config"},
        "data": {"kpmon.yaml": "stream: {shuffle_partitions: 0}\n", "other.txt": "x"},
    }
    (k8s / "configmap.yaml").write_text(yaml.safe_dump(configmap))
    problems = redeploy.validate_manifests(k8s)
    assert len(problems) == 3
    assert any("broken.yaml" in p for p in problems)
    assert any("nameless.yaml" in p and "metadata.name" in p for p in problems)
    assert any("ConfigMap kpmon-config kpmon.yaml" in p and "shuffle_partitions" in p for p in problems)
    assert redeploy.validate_manifests(REPO / "deploy" / "k8s") == []


def test_rollback_after_a_failure_before_the_swap_touches_nothing(
    tmp_path: Path, configs: tuple[str, str]
) -> None:
    current, new = configs
    params = Params(new, current)
    sent: list[Any] = []
    j = journal(tmp_path)
    assert redeploy.rollback(params, j, "run1", publish=lambda c, a: _record(sent, a))["rolled_back"] is False
    # A validated plan whose job is still running (the canary failed): still nothing to undo.
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        paths = StreamPaths.of(load_config(current))
        paths.make()
        paths.pid_file.write_text(f"{job.pid}\n")
        redeploy.validate(params, j, "run1")
        j.write("canary.failed", {"error": "lost alerts"})
        result = redeploy.rollback(params, j, "run1", publish=lambda c, a: _record(sent, a))
        assert result["rolled_back"] is False and "canary failed" in result["reason"]
        assert job.poll() is None and sent == []
    finally:
        job.kill()
        job.wait(5)


def test_a_redeploy_under_way_is_visible_until_its_gate_or_rollback(tmp_path: Path) -> None:
    paths = StreamPaths(tmp_path / "stream")
    assert redeploy.active_run(paths) is None
    j = Journal(paths.root / "redeploy" / "run1.json")
    j.write("validate", {"current": {}})
    assert redeploy.active_run(paths) == "run1"
    assert redeploy.active_run(paths, now=time.time() + 4 * 3600) is None  # its worker died long ago
    j.write("health_gate", {"outcome": "pass"})
    assert redeploy.active_run(paths) is None
    failed = Journal(paths.root / "redeploy" / "run2.json")
    failed.write("validate", {"current": {}})
    failed.write("health_gate.failed", {"error": "stalled"})
    assert redeploy.active_run(paths) == "run2"  # the rollback is still to come
    failed.write("rollback", {"rolled_back": True})
    assert redeploy.active_run(paths) is None
