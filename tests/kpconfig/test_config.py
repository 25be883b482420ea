from __future__ import annotations

from pathlib import Path

import pytest

from kpconfig.model import ConfigError, load_config


def test_defaults_run_the_embedded_stack() -> None:
    config = load_config(environ={})
    assert config.tap.capture == "headers" and config.stack.brokers == 1
    assert config.tap_cluster == config.kafka


def test_file_then_environment_overrides(tmp_path: Path) -> None:
    path = tmp_path / "kpmon.yaml"
    path.write_text("tap:\n  topic: frames\n  queue_max_frames: 10\n")
    config = load_config(path, environ={"KPMON__TAP__QUEUE_MAX_FRAMES": "5000", "KPMON__STACK__SASL": "true"})
    assert config.tap.topic == "frames" and config.tap.queue_max_frames == 5000 and config.stack.sasl is True


def test_errors_name_the_bad_key(tmp_path: Path) -> None:
    path = tmp_path / "kpmon.yaml"
    path.write_text("tap:\n  capture: everything\n")
    with pytest.raises(ConfigError, match=r"tap\.capture"):
        load_config(path, environ={})
    with pytest.raises(ConfigError, match=r"unknown|Extra"):
        load_config(None, environ={"KPMON__TAP__NOPE": "1"})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", environ={})


def test_an_environment_value_that_is_not_yaml_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="KPMON__TAP__TOPIC"):
        load_config(environ={"KPMON__TAP__TOPIC": "*not-an-alias"})


def test_a_standalone_deploy_needs_a_spark_master_and_a_shared_absolute_state_dir(tmp_path: Path) -> None:
    path = tmp_path / "kpmon.yaml"
    env = {"KPMON__DEPLOY__TARGET": "standalone"}
    path.write_text(f"state_dir: {tmp_path}\nstream:\n  master: local[2]\n")
    with pytest.raises(ConfigError, match="spark://"):
        load_config(path, environ=env)
    path.write_text("state_dir: relative\nstream:\n  master: spark://m:7077\n")
    with pytest.raises(ConfigError, match="absolute state_dir"):
        load_config(path, environ=env)
    path.write_text(f"state_dir: {tmp_path}\nstream:\n  master: spark://m:7077\n")
    assert load_config(path, environ=env).deploy.target == "standalone"
    with pytest.raises(ConfigError, match="rest_url"):
        load_config(path, environ={**env, "KPMON__DEPLOY__REST_URL": "m:6066"})
    assert load_config(path, environ={}).deploy.target == "local"


def test_a_yarn_deploy_needs_the_yarn_master_and_the_resourcemanager(tmp_path: Path) -> None:
    path = tmp_path / "kpmon.yaml"
    env = {"KPMON__DEPLOY__TARGET": "yarn"}
    path.write_text(f"state_dir: {tmp_path}\nstream:\n  master: spark://m:7077\n")
    with pytest.raises(ConfigError, match=r"stream\.master yarn"):
        load_config(path, environ=env)
    path.write_text(f"state_dir: {tmp_path}\nstream:\n  master: yarn\n")
    with pytest.raises(ConfigError, match="ResourceManager"):
        load_config(path, environ=env)
    config = load_config(path, environ={**env, "KPMON__DEPLOY__REST_URL": "http://rm:8088"})
    assert (config.deploy.target, config.deploy.rest_url) == ("yarn", "http://rm:8088")


def test_a_kubernetes_deploy_needs_a_k8s_master_a_shared_state_dir_and_no_local_jars(tmp_path: Path) -> None:
    path = tmp_path / "kpmon.yaml"
    env = {"KPMON__DEPLOY__TARGET": "kubernetes"}
    path.write_text(f"state_dir: {tmp_path}\nstream:\n  master: yarn\n")
    with pytest.raises(ConfigError, match=r"stream\.master k8s://"):
        load_config(path, environ=env)
    path.write_text("state_dir: relative\nstream:\n  master: k8s://https://api:6443\n")
    with pytest.raises(ConfigError, match="absolute state_dir"):
        load_config(path, environ=env)
    path.write_text(f"state_dir: {tmp_path}\nstream:\n  master: k8s://https://api:6443\n")
    with pytest.raises(ConfigError, match="not from jars"):
        load_config(path, environ={**env, "KPMON__DEPLOY__CONNECTOR": "jars"})
    for key, value in (("APPLICATION", "Kpmon_Stream"), ("APPLICATION", "k" * 31), ("NAMESPACE", "a.b")):
        with pytest.raises(ConfigError, match=f"deploy.kubernetes.{key.lower()}"):
            load_config(path, environ={**env, f"KPMON__DEPLOY__KUBERNETES__{key}": value})
    config = load_config(path, environ={**env, "KPMON__DEPLOY__KUBERNETES__AUTH": "kubeconfig"})
    kube = config.deploy.kubernetes
    assert (config.deploy.target, kube.auth, kube.namespace, kube.application) == (
        "kubernetes",
        "kubeconfig",
        "kpmon",
        "kpmon-stream",
    )
    assert (kube.kubeconfig, kube.context, kube.image, kube.mount_path) == (None, None, None, None)
