"""``deploy.target: kubernetes``: the job as a spark-operator SparkApplication, created, watched and deleted
through the Kubernetes API by the official client.

Against RECORDED API exchanges (tests/data/kubernetes, labelled there), served on loopback: no API server
or spark-operator can run on this machine (docs/decisions.md). The client, its kubeconfig auth, the
control's decisions and the DAG step are real; every SparkApplication the control creates is validated
against deploy/k8s/schemas/ with kubeconform, as the shipped manifests are.
"""

from __future__ import annotations

import calendar
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_dags import health, jobctl
from airflow_dags.health import HealthParams
from streaming.paths import StreamPaths
from tests.airflow_dags.recorded import Replay
from tests.deploy.k8s_schema import assert_valid

RECORDING = json.loads(
    (
        Path(__file__).resolve().parents[1] / "data" / "kubernetes" / "sparkapplication-exchanges.json"
    ).read_text()
)
RUNNING = RECORDING["names"]["running"]
CREATED = RECORDING["names"]["created"]
#: The clock that names the created application ``CREATED``.
CREATED_AT = float(calendar.timegm(time.strptime(CREATED.rsplit("-", 1)[1], "%Y%m%d%H%M%S")))
TOKEN = "kpmon-airflow-token"


def script(name: str) -> list[dict[str, Any]]:
    assert RECORDING["label"].startswith("RECORDING")
    return list(RECORDING["scripts"][name])


def kube_config(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": server}}],
                "users": [{"name": "airflow", "user": {"token": TOKEN}}],
                "contexts": [{"name": "kpmon", "context": {"cluster": "test", "user": "airflow"}}],
                "current-context": "kpmon",
            }
        )
    )
    return path


def config_file(tmp_path: Path, server: str, **kubernetes: Any) -> Path:
    """A config whose state directory is on the application's claim, mounted here at ``<tmp>/claim``."""
    claim = tmp_path / "claim"
    data = {
        "state_dir": str(claim / "state"),
        "stream": {
            "master": "k8s://https://kubernetes.default.svc:443",
            "checkpoint_dir": str(claim / "checkpoints" / "stream"),
            "stall_seconds": 60,
        },
        "deploy": {
            "target": "kubernetes",
            "kubernetes": {
                "auth": "kubeconfig",
                "kubeconfig": str(kube_config(tmp_path, server)),
                "namespace": RECORDING["namespace"],
                "image": "kpmon:0.2.0",
                "mount_path": str(claim),
                **kubernetes,
            },
        },
    }
    path = tmp_path / "kpmon.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def paths(tmp_path: Path) -> StreamPaths:
    p = StreamPaths(tmp_path / "claim" / "state" / "stream")
    p.make()
    return p


@pytest.fixture
def api(request: pytest.FixtureRequest, paths: StreamPaths) -> Iterator[Replay]:
    """The recorded script named by the test's parameter; each request notes whether the stop marker
    was there when it came."""
    with Replay(script(request.param), probe=lambda _method, _path: paths.stop_marker.exists()) as replay:
        yield replay
        assert replay.unexpected == [] and replay.unplayed == []


def control_of(config: Path) -> jobctl.KubernetesControl:
    control = jobctl.control_for(str(config))
    assert isinstance(control, jobctl.KubernetesControl)
    control.poll = 0.01
    control.clock = lambda: CREATED_AT
    return control


def record_of(config: Path, name: str = RUNNING) -> jobctl.JobRecord:
    return jobctl.JobRecord(0, sys.executable, str(config), "", 1.0, {}, "kubernetes", name)


def created(replay: Replay) -> list[dict[str, Any]]:
    return [r["body"] for r in replay.received if r["method"] == "POST"]


@pytest.mark.parametrize("api", ["start"], indirect=True)
def test_start_creates_a_valid_sparkapplication_and_watches_it(
    tmp_path: Path, paths: StreamPaths, api: Replay
) -> None:
    config = config_file(tmp_path, api.url)
    control = control_of(config)
    record = control.start(jobctl.JobSpec("/opt/build-b/bin/python", str(config), {"KPMON_X": "1"}), paths)
    assert (record.target, record.driver_id, record.handle, record.pid) == ("kubernetes", CREATED, CREATED, 0)
    assert jobctl.read_record(paths) == record
    (app,) = created(api)
    assert_valid([app], tmp_path)
    assert (app["metadata"]["name"], app["metadata"]["namespace"]) == (CREATED, "kpmon")
    assert app["spec"]["image"] == "kpmon:0.2.0"
    # The driver reads the config shipped on the claim, where the DAGs read its progress and write STOP.
    shipped = Path(app["spec"]["arguments"][1])
    assert app["spec"]["arguments"][0] == "--config" and shipped.parent == paths.root / "submit"
    assert yaml.safe_load(shipped.read_text())["state_dir"] == str(paths.root.parent)
    assert shipped.stat().st_mode & 0o077 == 0  # it may hold SASL or TLS secrets
    assert {m["mountPath"] for m in app["spec"]["driver"]["volumeMounts"]} >= {str(tmp_path / "claim")}
    # The kubeconfig's credentials reach the API server.
    assert {r["authorization"] for r in api.received} == {f"Bearer {TOKEN}"}
    # No status yet (the operator has not seen it), then SUBMITTED, then RUNNING: all active.
    assert control.state(CREATED) == "NEW"
    assert control.is_running(record)
    assert control.describe_running(paths) == record


@pytest.mark.parametrize("api", ["states"], indirect=True)
def test_the_operators_states_map_to_running_or_ended(tmp_path: Path, api: Replay) -> None:
    control = control_of(config_file(tmp_path, api.url))
    seen = []
    for _ in range(11):
        status = control.apps.status(RUNNING)
        assert status.active == (status.state in control.active_states)  # what is_running asks
        seen.append((status.state, status.active, status.deleting, status.message))
    assert seen == [
        ("SUBMITTED", True, False, None),
        ("RUNNING", True, False, None),
        # Under restartPolicy OnFailure the operator resubmits a failed driver: still the running job.
        ("PENDING_RERUN", True, False, None),
        ("FAILING", True, False, None),
        ("UNKNOWN", True, False, None),
        ("COMPLETED", False, False, None),
        ("FAILED", False, False, "driver container failed with ExitCode: 1, Reason: Error"),
        ("SUBMISSION_FAILED", False, False, "failed to run spark-submit: exit status 1"),
        # Being deleted: its pods are still there, so it still runs.
        ("RUNNING", True, True, None),
        # Deleted, but its driver pod is still terminating: it still runs.
        ("DRIVER_TERMINATING", True, False, None),
        ("NOT_FOUND", False, False, None),
    ]
    assert [r["path"].rsplit("/", 2)[-2] for r in api.received][-4:] == [
        "sparkapplications",
        "pods",
        "sparkapplications",
        "pods",
    ]


@pytest.mark.parametrize("api", ["graceful"], indirect=True)
def test_the_driver_stops_on_the_marker_and_its_application_is_deleted(
    tmp_path: Path, paths: StreamPaths, api: Replay
) -> None:
    config = config_file(tmp_path, api.url)
    result = control_of(config).stop(paths, record_of(config), timeout=30.0)
    assert result.how == "graceful" and result.graceful
    # Watched while the marker was there; the ended application deleted (with its pods) after it went.
    assert [(r["method"], r["probe"]) for r in api.received] == [
        ("GET", False),
        ("GET", True),
        ("GET", True),
        ("DELETE", False),
    ]
    assert not paths.stop_marker.exists()


@pytest.mark.parametrize("api", ["killed"], indirect=True)
def test_a_driver_that_ignores_the_marker_is_deleted_after_the_timeout(
    tmp_path: Path, paths: StreamPaths, api: Replay
) -> None:
    config = config_file(tmp_path, api.url)
    result = control_of(config).stop(paths, record_of(config), timeout=0.0, term_grace=5.0)
    assert result.how == "killed" and not result.graceful
    delete = next(r for r in api.received if r["method"] == "DELETE")
    # The marker first, the deletion past the timeout (in the foreground); the stop returns only once
    # the object and then its driver pod are gone.
    assert delete["probe"] is True and delete["body"] == {"propagationPolicy": "Foreground"}
    after = [r["path"].rsplit("/", 2)[-2] for r in api.received[api.received.index(delete) + 1 :]]
    assert after == ["sparkapplications", "sparkapplications", "pods", "sparkapplications", "pods"]
    assert not paths.stop_marker.exists()


@pytest.mark.parametrize("api", ["forbidden"], indirect=True)
def test_an_api_error_is_a_job_control_error_that_says_what_the_server_said(
    tmp_path: Path, paths: StreamPaths, api: Replay
) -> None:
    config = config_file(tmp_path, api.url)
    with pytest.raises(jobctl.JobControlError) as raised:
        control_of(config).start(jobctl.JobSpec(sys.executable, str(config)), paths)
    message = str(raised.value)
    assert message.startswith(f"create SparkApplication {CREATED} in namespace kpmon: HTTP 403 Forbidden: ")
    assert 'cannot create resource "sparkapplications"' in message
    assert jobctl.read_record(paths) is None  # nothing was started
    assert_valid(created(api), tmp_path)


def test_an_unreachable_api_server_or_missing_credentials_are_job_control_errors(
    tmp_path: Path, paths: StreamPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Replay([]) as closed:
        url = closed.url
    config = config_file(tmp_path, url)
    with pytest.raises(
        jobctl.JobControlError, match=rf"read SparkApplication {RUNNING} in namespace kpmon: "
    ):
        control_of(config).is_running(record_of(config))
    # In-cluster auth outside a pod: the service account's environment and token are missing.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    in_cluster = control_of(config_file(tmp_path, url, auth="in_cluster"))
    with pytest.raises(
        jobctl.JobControlError, match=r"cannot authenticate to the Kubernetes API \(in-cluster"
    ):
        in_cluster.is_running(record_of(config))


@pytest.mark.parametrize("api", ["health_restart"], indirect=True)
def test_kpmon_health_alerts_and_replaces_a_failed_application(
    tmp_path: Path, paths: StreamPaths, api: Replay
) -> None:
    config = config_file(tmp_path, api.url)
    jobctl.write_record(paths, record_of(config))
    # The job's last word: running. Its application has FAILED since (out of the operator's retries).
    paths.progress.write_text(
        json.dumps({"batchId": 41, "kpmon": {"written_at": time.time(), "state": "running"}})
    )
    sent: list[Any] = []

    def publish(_config: Any, alerts: list[Any]) -> dict[str, Any]:
        sent.extend(alerts)
        return {"delivered": True}

    result = health.check_and_heal(
        HealthParams(config=str(config), stop_timeout_seconds=5.0), publish=publish
    )
    assert result["status"] == "died" and [a.rule for a in sent] == ["ops.stream_unhealthy"]
    assert sent[0].evidence[0]["target"] == "kubernetes"
    restart = result["restart"]
    # The failed application is deleted (not left to pile up) and a new one created with the same build.
    assert [r["method"] for r in api.received] == ["GET", "GET", "GET", "DELETE", "POST"]
    assert api.received[3]["path"].endswith(f"/sparkapplications/{RUNNING}")
    (app,) = created(api)
    assert restart["stopped"] == "not running" and restart["target"] == "kubernetes"
    assert restart["handle"] == app["metadata"]["name"] != RUNNING
    assert restart["handle"].startswith("kpmon-stream-") and restart["python"] == sys.executable
    recorded = jobctl.read_record(paths)
    assert recorded is not None and recorded.driver_id == restart["handle"]
    assert_valid([app], tmp_path)


def test_kpmon_redeploy_swaps_the_application_and_rolls_back_to_the_previous_image(
    tmp_path: Path, paths: StreamPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redeploy DAG's steps with this target: build A's application stops on the marker, build B's
    is created from the new config, B fails its health gate, and the rollback deletes B and creates A's
    image again from the current config."""
    from airflow_dags import redeploy

    restored = RECORDING["names"]["restored"]
    names = iter([CREATED, restored])
    monkeypatch.setattr(jobctl.KubernetesControl, "application_name", lambda self: next(names))

    def world(method: str, path: str) -> bool:
        # The restored driver reports its started query, as the real one would by then.
        if method == "GET" and path.endswith(f"/{restored}"):
            progress = {"batchId": 12, "kpmon": {"written_at": time.time(), "state": "running"}}
            paths.progress.write_text(json.dumps(progress))
        return paths.stop_marker.exists()

    with Replay(script("redeploy_rollback"), probe=world) as api:
        current = config_file(tmp_path, api.url, image="kpmon:0.1.0")
        new = current.with_name("kpmon-next.yaml")
        new.write_text(current.read_text().replace("kpmon:0.1.0", "kpmon:0.2.0"))
        jobctl.write_record(paths, record_of(current))
        params = redeploy.Params(
            new_config=str(new),
            current_config=str(current),
            new_python=sys.executable,
            current_python=sys.executable,
            stop_timeout_seconds=30.0,
            start_timeout_seconds=30.0,
        )
        journal = redeploy.Journal(paths.root / "redeploy" / "run1.json")
        checkpoint = str(tmp_path / "claim" / "checkpoints" / "stream")
        journal.write(
            "validate",
            {
                "current": {
                    "config": str(current),
                    "python": sys.executable,
                    "pid": 0,
                    "handle": RUNNING,
                    "target": "kubernetes",
                    "running": True,
                    "state_root": str(paths.root),
                    "checkpoint": checkpoint,
                    "batch_id": 11,
                },
                "new": {
                    "config": str(new),
                    "requested_config": str(new),
                    "python": sys.executable,
                    "target": "kubernetes",
                    "state_root": str(paths.root),
                    "checkpoint": checkpoint,
                    "fresh_start": False,
                    "resumes": True,
                },
            },
        )
        stopped = redeploy.stop_current(params, journal)
        assert (stopped["how"], stopped["handle"], stopped["target"]) == ("graceful", RUNNING, "kubernetes")
        started = redeploy.start_new(params, journal)
        assert (started["driver_id"], started["baseline_batch"]) == (CREATED, None)
        journal.write("health_gate.failed", {"error": "health gate failed: no batch", "type": "DeployError"})
        sent: list[Any] = []

        def publish(_config: Any, alerts: list[Any]) -> dict[str, Any]:
            sent.extend(alerts)
            return {"delivered": True}

        result = redeploy.rollback(params, journal, "run1", publish=publish)
        assert api.unexpected == [] and api.unplayed == []
    assert result["rolled_back"] and result["restarted"]["driver_id"] == restored
    assert result["restarted"]["confirmed"] is True
    assert result["actions"][0].startswith(f"stopped new job {CREATED} (graceful")
    assert [a.rule for a in sent] == ["ops.redeploy_rolled_back"]
    # A build is an image: B ran the new config's, the rollback runs the current config's again.
    apps = created(api)
    assert [(a["metadata"]["name"], a["spec"]["image"]) for a in apps] == [
        (CREATED, "kpmon:0.2.0"),
        (restored, "kpmon:0.1.0"),
    ]
    # Both stops were graceful: the application ended while the marker was down, and was deleted after.
    deletes = [i for i, r in enumerate(api.received) if r["method"] == "DELETE"]
    assert [(api.received[i - 1]["probe"], api.received[i]["probe"]) for i in deletes] == [(True, False)] * 2
    assert not paths.stop_marker.exists()
    assert_valid(apps, tmp_path)
