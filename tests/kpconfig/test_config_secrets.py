"""Secrets from files, owner-only config copies, and the Java client's properties (kpconfig/model.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kpconfig.model import (
    ConfigError,
    KafkaClusterConfig,
    java_properties_from_librdkafka,
    load_config,
    write_private,
)

#: A value the YAML parser would have cut at ``#`` or rejected for the leading ``*``.
AWKWARD = "*p@ss #word: {x}"


def test_a_file_env_var_sets_the_key_to_the_files_content(tmp_path: Path) -> None:
    secret = tmp_path / "sasl-password"
    secret.write_text(AWKWARD + "\n")
    config = load_config(environ={"KPMON__KAFKA__PROPERTIES__sasl.password_FILE": str(secret)})
    assert config.kafka.properties == {"sasl.password": AWKWARD}


def test_a_secrets_directory_sets_one_key_per_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "tap__cluster__properties__sasl.password").write_text(AWKWARD)
    (secrets / "..data").mkdir()  # Kubernetes' own bookkeeping next to the keys
    (secrets / ".hidden").write_text("not a key")
    yaml_file = tmp_path / "kpmon.yaml"
    yaml_file.write_text(
        "tap:\n  cluster:\n    bootstrap_servers: k:9093\n    properties: {sasl.username: kpmon}\n"
    )
    config = load_config(yaml_file, environ={"KPMON_SECRETS_DIR": str(secrets)})
    assert config.tap_cluster.bootstrap_servers == "k:9093"
    assert config.tap_cluster.properties == {"sasl.username": "kpmon", "sasl.password": AWKWARD}


def test_the_environment_wins_over_the_secrets_directory(tmp_path: Path) -> None:
    (tmp_path / "kafka__bootstrap_servers").write_text("from-dir:9092")
    config = load_config(
        environ={"KPMON_SECRETS_DIR": str(tmp_path), "KPMON__KAFKA__BOOTSTRAP_SERVERS": "from-env:9092"}
    )
    assert config.kafka.bootstrap_servers == "from-env:9092"


def test_secret_file_errors_name_the_variable_and_path_never_the_content(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"KPMON__KAFKA__PROPERTIES__sasl\.password_FILE.*cannot read"):
        load_config(environ={"KPMON__KAFKA__PROPERTIES__sasl.password_FILE": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="both set"):
        load_config(environ={"KPMON__TAP__TOPIC": "a", "KPMON__TAP__TOPIC_FILE": str(tmp_path / "x")})
    with pytest.raises(ConfigError, match=r"KPMON_SECRETS_DIR.*not a directory"):
        load_config(environ={"KPMON_SECRETS_DIR": str(tmp_path / "nope")})
    bad = tmp_path / "kafka__properties__sasl.password"
    bad.write_text(AWKWARD)
    (tmp_path / "tap__topic__x").write_text("x")  # tap.topic is a string, not a section
    yaml_file = tmp_path / "kpmon.yaml"
    yaml_file.write_text("tap: {topic: t}\n")
    with pytest.raises(ConfigError, match=r"tap__topic__x.*not a section") as err:
        load_config(yaml_file, environ={"KPMON_SECRETS_DIR": str(tmp_path)})
    assert AWKWARD not in str(err.value)


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_config_copies_are_written_owner_only(tmp_path: Path, umask: int) -> None:
    existing = tmp_path / "run" / "kpmon.yaml"
    existing.parent.mkdir()
    existing.write_text("old")
    existing.chmod(0o644)
    old = os.umask(umask)
    try:
        for path in (existing, tmp_path / "fresh-1" / "kpmon.yaml"):
            write_private(path, "kafka: {properties: {sasl.password: x}}\n")
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert "sasl.password" in path.read_text()
    finally:
        os.umask(old)


def test_kpmon_run_and_the_fresh_start_redeploy_write_their_copies_owner_only(tmp_path: Path) -> None:
    from airflow_dags.redeploy import fresh_start_config

    source = tmp_path / "new.yaml"
    source.write_text(f"state_dir: {tmp_path / 'state'}\nkafka:\n  properties: {{sasl.password: s}}\n")
    old = os.umask(0o022)
    try:
        derived = Path(fresh_start_config(str(source), "run-1"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(derived.stat().st_mode) == 0o600
    assert load_config(derived, environ={}).kafka.properties == {"sasl.password": "s"}


# ----- the Java client's properties -------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_credentials_become_a_jaas_config(mechanism: str) -> None:
    java = java_properties_from_librdkafka(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": "kpmon",
            "sasl.password": 'p"w\\d',
            "ssl.ca.location": "/etc/kpmon/ca.pem",
            "ssl.endpoint.identification.algorithm": "none",
            "linger.ms": "5",
        }
    )
    module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": mechanism,
        "sasl.jaas.config": (
            f'org.apache.kafka.common.security.{module} required username="kpmon" password="p\\"w\\\\d";'
        ),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/kpmon/ca.pem",
        "ssl.endpoint.identification.algorithm": "",
        "linger.ms": "5",
    }


def test_unsecured_oauthbearer_becomes_the_login_modules_unsecured_options() -> None:
    java = java_properties_from_librdkafka(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "enable.sasl.oauthbearer.unsecure.jwt": "true",
            "sasl.oauthbearer.config": "principal=kpmon scope=read,write lifeSeconds=600 extension_traceId=42",
        }
    )
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredLoginStringClaim_sub="kpmon" unsecuredLoginListClaim_scope=",read,write" '
            'unsecuredLoginLifetimeSeconds="600" unsecuredLoginExtension_traceId="42";'
        ),
    }


@pytest.mark.parametrize("config", ["scope=read", "principal=kpmon unknownOption=1", "principal"])
def test_an_unsecured_oauthbearer_config_without_a_translation_is_a_config_error(config: str) -> None:
    props = {
        "sasl.mechanism": "OAUTHBEARER",
        "enable.sasl.oauthbearer.unsecure.jwt": "true",
        "sasl.oauthbearer.config": config,
    }
    with pytest.raises(ConfigError, match=r"sasl\.oauthbearer\.config"):
        java_properties_from_librdkafka(props)


def test_a_client_certificate_becomes_a_pem_keystore(tmp_path: Path) -> None:
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n")
    java = java_properties_from_librdkafka(
        {"security.protocol": "SSL", "ssl.certificate.location": str(cert), "ssl.key.location": str(key)}
    )
    assert java["ssl.keystore.type"] == "PEM"
    assert java["ssl.keystore.certificate.chain"] == cert.read_text()
    assert java["ssl.keystore.key"] == key.read_text()
    assert "ssl.certificate.location" not in java and "ssl.key.location" not in java
    with pytest.raises(ConfigError, match="go together"):
        java_properties_from_librdkafka({"ssl.certificate.location": str(cert)})


def test_what_has_no_translation_is_a_config_error_that_names_keys_only() -> None:
    with pytest.raises(ConfigError, match="GSSAPI") as err:
        java_properties_from_librdkafka({"sasl.mechanism": "GSSAPI", "sasl.password": AWKWARD})
    assert AWKWARD not in str(err.value)


def test_java_properties_override_the_translation() -> None:
    cluster = KafkaClusterConfig(
        properties={
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
        },
        java_properties={"sasl.jaas.config": "custom required;", "ssl.truststore.location": "/t.jks"},
    )
    java = cluster.java_client_properties()
    assert java["sasl.jaas.config"] == "custom required;" and java["ssl.truststore.location"] == "/t.jks"
    assert java["security.protocol"] == "SASL_SSL"


def test_the_spark_source_gets_the_java_properties_and_the_readers_the_librdkafka_ones() -> None:
    import argparse

    from kpconfig.model import KpmonConfig
    from kpmon.commands.topicopts import consumer_config, resolve_cluster
    from streaming.job import source_options

    librdkafka = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u"}
    config = KpmonConfig.model_validate(
        {
            "tap": {
                "cluster": {"bootstrap_servers": "k:9094", "properties": {**librdkafka, "sasl.password": "p"}}
            }
        }
    )
    options = source_options(config)
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.scram.ScramLoginModule"
    )
    assert not any(k in options for k in ("kafka.sasl.username", "kafka.sasl.password"))
    args = argparse.Namespace(bootstrap_servers=None, property=["sasl.password=override"])
    resolve_cluster(args, config)
    consumer = consumer_config(args, "kpmon-decode")
    assert consumer["bootstrap.servers"] == "k:9094"
    assert consumer["sasl.username"] == "u" and consumer["sasl.password"] == "override"
    assert "sasl.jaas.config" not in consumer
    with pytest.raises(ValueError, match="NAME=VALUE"):
        resolve_cluster(argparse.Namespace(bootstrap_servers=None, property=["oops"]), config)


def test_the_spark_source_fetches_without_kafkas_half_second_wait() -> None:
    from kpconfig.model import KpmonConfig
    from streaming.job import source_options

    assert source_options(KpmonConfig())["kafka.fetch.max.wait.ms"] == "20"
    tuned = KpmonConfig.model_validate({"stream": {"fetch_max_wait_ms": 100}})
    assert source_options(tuned)["kafka.fetch.max.wait.ms"] == "100"
    # The cluster's own client properties are the operator's last word.
    own = KpmonConfig.model_validate(
        {"tap": {"cluster": {"bootstrap_servers": "k:9092", "java_properties": {"fetch.max.wait.ms": "250"}}}}
    )
    assert source_options(own)["kafka.fetch.max.wait.ms"] == "250"
