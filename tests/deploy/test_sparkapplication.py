"""The SparkApplication builder (deploy/spark/sparkapplication.py): one description of the job's object,
deploy/k8s/sparkapplication.yaml, which the builder reproduces for the shipped config and changes only
where a config says so. Every object built here is validated against the CRD schema (kubeconform)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import manifests
from deploy.spark import sparkapplication as sa
from deploy.spark.submit import SubmitError
from kpconfig.model import KpmonConfig, load_config
from tests.deploy.k8s_schema import assert_valid, kubeconform

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def configmap_config(tmp_path: Path, **overrides: str) -> KpmonConfig:
    """The ConfigMap's kpmon.yaml (what the pods read), with ``KPMON__*`` overrides."""
    configmap = next(d for d in manifests.load_documents(K8S / "configmap.yaml") if d["kind"] == "ConfigMap")
    path = tmp_path / "kpmon.yaml"
    path.write_text(configmap["data"]["kpmon.yaml"])
    return load_config(path, environ={f"KPMON__{k.upper()}": v for k, v in overrides.items()})


def mounts(app: dict[str, Any], role: str) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in app["spec"][role]["volumeMounts"]}


def test_the_shipped_config_builds_exactly_the_shipped_manifest(tmp_path: Path) -> None:
    """`kubectl apply -k deploy/k8s/spark` and the DAGs run the same object: no second description to drift."""
    (manifest,) = manifests.load_documents(K8S / "spark" / "sparkapplication.yaml")
    built = sa.build(configmap_config(tmp_path), "kpmon-stream", "/etc/kpmon/kpmon.yaml")
    assert built == manifest
    assert sa.template() == manifest and sa.template() is not sa.template()


def test_a_config_changes_only_what_it_decides(tmp_path: Path) -> None:
    config = configmap_config(
        tmp_path,
        deploy__kubernetes__image="registry.example/kpmon:0.2.0",
        deploy__kubernetes__namespace="streaming",
        deploy__kubernetes__mount_path="/mnt/kpmon",
        deploy__driver_cores="2",
        deploy__driver_memory="3g",
        deploy__spark_conf="{spark.executor.instances: '4', spark.ui.showConsoleProgress: 'true'}",
        deploy__connector="provided",
    )
    app = sa.build(config, "kpmon-stream-20261128200000", "/mnt/kpmon/state/stream/submit/k.yaml")
    template = sa.template()
    assert app["metadata"]["name"] == "kpmon-stream-20261128200000"
    assert app["metadata"]["namespace"] == "streaming"
    assert app["metadata"]["labels"] == template["metadata"]["labels"]
    spec = app["spec"]
    assert spec["image"] == "registry.example/kpmon:0.2.0"
    assert spec["arguments"] == ["--config", "/mnt/kpmon/state/stream/submit/k.yaml"]
    assert (spec["driver"]["cores"], spec["driver"]["memory"]) == (2, "3g")
    assert spec["sparkConf"] == {
        **template["spec"]["sparkConf"],
        "spark.executor.instances": "4",
        "spark.ui.showConsoleProgress": "true",
    }
    assert "deps" not in spec and sa.connector_packages(app) == ""
    # The claim moves for driver and executors alike; the ConfigMap mount stays where it was.
    assert mounts(app, "driver") == {"kpmon-config": "/etc/kpmon", "checkpoints": "/mnt/kpmon"}
    assert mounts(app, "executor") == {"checkpoints": "/mnt/kpmon"}
    assert [str(p) for p in sa.claim_mounts(app, "executor")] == ["/mnt/kpmon"]
    untouched = ("type", "mode", "sparkVersion", "mainApplicationFile", "restartPolicy", "volumes")
    assert {k: spec[k] for k in untouched} == {k: template["spec"][k] for k in untouched}
    assert_valid([app, sa.build(configmap_config(tmp_path), "kpmon-stream-1", "/x.yaml")], tmp_path)


def test_the_schema_check_rejects_a_broken_build(tmp_path: Path) -> None:
    """The validation the control tests rely on fails on a bad object (it is not a formality)."""
    app = sa.build(configmap_config(tmp_path, deploy__driver_cores="1"), "kpmon-stream-1", "/x.yaml")
    app["spec"]["driver"]["cores"] = 0
    app["spec"]["restartPolicy"]["type"] = "Sometimes"
    done = kubeconform([app], tmp_path)
    assert done.returncode == 1
    assert "/spec/driver/cores" in done.stdout and "/spec/restartPolicy/type" in done.stdout


def claim_config(tmp_path: Path, checkpoint: str | None = None, **deploy: Any) -> KpmonConfig:
    claim = tmp_path / "claim"
    data: dict[str, Any] = {
        "state_dir": str(claim / "state"),
        "stream": {"master": "k8s://https://kubernetes.default.svc:443"},
        "deploy": {"target": "kubernetes", "kubernetes": {"mount_path": str(claim)}, **deploy},
    }
    if checkpoint:
        data["stream"]["checkpoint_dir"] = checkpoint
    path = tmp_path / "kpmon.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path, environ={})


def test_the_plan_ships_the_config_on_the_claim(tmp_path: Path) -> None:
    config = claim_config(tmp_path)
    staging = Path(config.state_dir) / "stream" / "submit"
    plan = sa.plan_application(config, "kpmon-stream-1", staging)
    assert plan.config_file.parent == staging and plan.notes == []
    assert plan.application["spec"]["arguments"] == ["--config", str(plan.config_file)]
    shipped = yaml.safe_load(plan.config_yaml)
    assert shipped["state_dir"] == config.state_dir
    # The job must not fetch the connector the operator resolves for it (deps.packages).
    assert shipped["stream"]["spark_conf"]["spark.jars.packages"] == sa.connector_packages(plan.application)
    assert sa.connector_packages(plan.application).startswith("org.apache.spark:spark-sql-kafka-0-10_")
    provided = sa.plan_application(claim_config(tmp_path, connector="provided"), "kpmon-stream-1", staging)
    assert yaml.safe_load(provided.config_yaml)["stream"]["spark_conf"]["spark.jars.packages"] == ""
    assert_valid([plan.application, provided.application], tmp_path)


def test_the_plan_refuses_what_the_driver_and_the_dags_cannot_share(tmp_path: Path) -> None:
    config = claim_config(tmp_path)
    with pytest.raises(SubmitError, match="shipped config's directory /elsewhere is not on"):
        sa.plan_application(config, "kpmon-stream-1", Path("/elsewhere"))
    outside = config.model_copy(update={"state_dir": "/var/tmp/kpmon"})
    with pytest.raises(SubmitError, match=r"state_dir /var/tmp/kpmon is not on the SparkApplication's claim"):
        sa.plan_application(outside, "kpmon-stream-1", Path(config.state_dir))
    off_claim = claim_config(tmp_path, checkpoint="/var/tmp/checkpoint")
    with pytest.raises(SubmitError, match="not under a PersistentVolumeClaim mount"):
        sa.plan_application(off_claim, "kpmon-stream-1", Path(config.state_dir))
    on_store = claim_config(tmp_path, checkpoint="s3a://bucket/kpmon")
    assert sa.plan_application(on_store, "kpmon-stream-1", Path(config.state_dir)).notes == []
