"""Stack logic that needs no JVM: config rendering, port and Java checks, tool table."""

from __future__ import annotations

import socket
import zipfile
from pathlib import Path

import pytest

from deploy.local import distribution, tools
from deploy.local import stack as stack_module
from deploy.local.process import JavaNotFoundError, PortInUseError, StackError
from deploy.local.stack import CONTROLLER_ID, LocalStack
from deploy.versions import KAFKA_LATEST, KAFKA_LEGACY


def test_combined_node_properties(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, base_port=20000)
    props = stack.properties(1)
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:20000,BROKER://127.0.0.1:20001,CONTROLLER://127.0.0.1:20002"
    )
    assert props["controller.quorum.voters"] == "1@127.0.0.1:20002"
    assert props["inter.broker.listener.name"] == "BROKER"
    assert stack.bootstrap_servers == "127.0.0.1:20000"
    assert [(b.node_id, b.port) for b in stack.brokers] == [(1, 20000)]
    assert stack.sasl_users == {}


@pytest.mark.parametrize(("sasl", "protocol"), [(True, "SASL_SSL"), (False, "SSL")])
def test_tls_client_listener_from_pem_files(tmp_path: Path, sasl: bool, protocol: str) -> None:
    from deploy.local.properties import TlsSpec

    tls = TlsSpec("/certs/broker-keystore.pem", "/certs/ca.pem", client_auth="required")
    stack = LocalStack(tmp_path, base_port=20100, sasl=sasl, tls=tls)
    props = stack.properties(1)
    assert props["listeners"].startswith(f"{protocol}://127.0.0.1:20100,BROKER://")
    assert f"{protocol}:{protocol}" in props["listener.security.protocol.map"]
    prefix = f"listener.name.{protocol.lower()}."
    assert props[prefix + "ssl.keystore.type"] == "PEM" == props[prefix + "ssl.truststore.type"]
    assert props[prefix + "ssl.keystore.location"] == "/certs/broker-keystore.pem"
    assert props[prefix + "ssl.client.auth"] == "required"
    client = stack.client_config("SCRAM-SHA-256")
    assert client["security.protocol"] == protocol and client["ssl.ca.location"] == "/certs/ca.pem"
    # The inter-broker listener (readiness checks, the tests' direct reads) stays plaintext.
    assert "BROKER:PLAINTEXT" in props["listener.security.protocol.map"]


def test_three_brokers_and_a_controller(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, brokers=3, base_port=21000)
    assert stack.bootstrap_servers == "127.0.0.1:21000,127.0.0.1:21001,127.0.0.1:21002"
    controller = stack.properties(CONTROLLER_ID)
    assert controller["process.roles"] == "controller"
    assert controller["listeners"] == "CONTROLLER://127.0.0.1:21006"
    broker = stack.properties(3)
    assert broker["process.roles"] == "broker"
    assert broker["controller.quorum.voters"] == f"{CONTROLLER_ID}@127.0.0.1:21006"
    assert broker["offsets.topic.replication.factor"] == "3"


def test_advertised_addresses_are_the_taps(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, brokers=3, base_port=22000, advertised={2: ("10.0.0.5", 29092)})
    props = stack.properties(2)
    assert props["listeners"].startswith("PLAINTEXT://127.0.0.1:22001,")
    # Inter-broker traffic stays direct; only the client listener points at the tap.
    assert props["advertised.listeners"] == "PLAINTEXT://10.0.0.5:29092,BROKER://127.0.0.1:22004"
    assert stack.brokers[1].address == "10.0.0.5:29092"
    assert stack.listen_endpoints[1].address == "127.0.0.1:22001"


def test_sasl_listener_and_users(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, sasl=True, base_port=23000)
    props = stack.properties(1)
    assert props["listener.security.protocol.map"].endswith("SASL_PLAINTEXT:SASL_PLAINTEXT")
    user, password = stack.sasl_users["PLAIN"]
    assert f'user_{user}="{password}"' in props["listener.name.sasl_plaintext.plain.sasl.jaas.config"]
    assert set(stack.sasl_users) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert stack.client_config("SCRAM-SHA-512")["sasl.username"] == stack.sasl_users["SCRAM-SHA-512"][0]


def test_only_one_or_three_brokers(tmp_path: Path) -> None:
    with pytest.raises(StackError, match=r"1 .* or 3"):
        LocalStack(tmp_path, brokers=2)


@pytest.fixture
def no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_module, "fetch_distribution", lambda version: Path("/nonexistent"))
    monkeypatch.setattr(tools, "fetch_distribution", lambda version: Path("/nonexistent"))


def test_port_taken_is_a_clear_error(tmp_path: Path, no_download: None) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        stack = LocalStack(tmp_path, base_port=port)
        with pytest.raises(PortInUseError, match=f"{port} \\(client\\)"):
            stack.up(timeout=5)


def test_java_missing_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_download: None
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(JavaNotFoundError, match="JAVA_HOME"):
        LocalStack(tmp_path / "stack").up(timeout=5)
    with pytest.raises(JavaNotFoundError):
        tools.run_tool(KAFKA_LATEST, "kafka-topics", ["--version"], timeout=5)


def test_unknown_tool(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="kafka-topics"):
        tools.main_class(KAFKA_LATEST, "kafka-nope")


def _classes(version: str) -> set[str]:
    classes: set[str] = set()
    for jar in distribution.libs_dir(version).glob("kafka*.jar"):
        with zipfile.ZipFile(jar) as archive:
            classes.update(archive.namelist())
    return classes


@pytest.mark.parametrize("version", [KAFKA_LATEST, KAFKA_LEGACY])
def test_tool_classes_exist_in_the_jars(version: str) -> None:
    runtimes = {version, distribution.tools_version(version)}
    if not all(distribution.is_fetched(v) for v in runtimes):
        pytest.skip(f"Kafka {version} jars not cached (run `make jars`)")
    classes = {v: _classes(v) for v in runtimes}
    for tool in tools.MAIN_CLASSES[distribution.major(version)]:
        runtime = tools._runtime(version, tool)
        assert tools.main_class(version, tool).replace(".", "/") + ".class" in classes[runtime], tool
    # The broker libs carry no mismatched kafka-tools jar that could shadow the fallback's classes.
    tools_jars = list(distribution.libs_dir(version).glob("kafka-tools-[0-9]*.jar"))
    assert all(jar.name == f"kafka-tools-{version}.jar" for jar in tools_jars)


def test_fetch_without_maven_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kpconfig.mvn import FetchError

    monkeypatch.setenv("KPMON_HOME", str(tmp_path))  # an empty cache, so a download is needed
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(FetchError, match="mvn"):
        distribution.fetch_distribution(KAFKA_LATEST)
    assert not distribution.distribution_dir(KAFKA_LATEST).exists()
