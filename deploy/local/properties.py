"""Rendering of KRaft ``server.properties`` for the local stack (pure: no I/O, unit-testable).

Every node has up to three listeners on loopback:

* the client listener (``PLAINTEXT``, ``SASL_PLAINTEXT``, or with ``tls`` ``SSL`` / ``SASL_SSL``), the
  one clients, the tap and tests use; it may advertise another address (the tap's) than the one it binds;
* ``BROKER``, plaintext inter-broker traffic, always advertised as itself so replication and readiness
  checks never depend on the tap being up;
* ``CONTROLLER``, the KRaft quorum (static ``controller.quorum.voters`` works on 3.9 and 4.x alike).
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOST = "127.0.0.1"


@dataclass(frozen=True)
class SaslUsers:
    """Credentials configured on the SASL listener; deliberately recognisable for redaction tests."""

    plain: tuple[str, str] = ("kpmon-plain", "plain-secret-Pw1")
    scram_sha_256: tuple[str, str] = ("kpmon-scram256", "scram256-secret-Pw2")
    scram_sha_512: tuple[str, str] = ("kpmon-scram512", "scram512-secret-Pw3")

    def by_mechanism(self) -> dict[str, tuple[str, str]]:
        return {
            "PLAIN": self.plain,
            "SCRAM-SHA-256": self.scram_sha_256,
            "SCRAM-SHA-512": self.scram_sha_512,
        }

    def add_scram_args(self) -> list[str]:
        """``--add-scram`` arguments for the StorageTool: SCRAM users exist from the first start."""
        args: list[str] = []
        for mechanism, (user, password) in self.by_mechanism().items():
            if mechanism.startswith("SCRAM"):
                args += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
        return args


@dataclass(frozen=True)
class TlsSpec:
    """TLS on the client listener, from PEM files (Kafka's ``PEM`` store type: no keytool needed)."""

    #: The broker's private key (PKCS#8, unencrypted) followed by its certificate chain.
    keystore: str
    #: CA certificates the broker trusts for client certificates.
    truststore: str
    #: ``required``: mTLS, clients must present a certificate the truststore vouches for.
    client_auth: str = "none"

    def to_dict(self) -> dict[str, str]:
        return {"keystore": self.keystore, "truststore": self.truststore, "client_auth": self.client_auth}


@dataclass(frozen=True)
class NodeSpec:
    """One KRaft process: a combined broker+controller, a broker, or a controller."""

    node_id: int
    roles: tuple[str, ...]
    data_dir: str
    client_port: int | None = None
    broker_port: int | None = None
    controller_port: int | None = None
    advertised: tuple[str, int] | None = None

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles


@dataclass(frozen=True)
class ClusterSpec:
    controller_voters: tuple[tuple[int, int], ...]  # (node_id, port)
    brokers: int
    sasl: bool = False
    users: SaslUsers = field(default_factory=SaslUsers)
    tls: TlsSpec | None = None

    @property
    def client_listener(self) -> str:
        return ("SASL_" if self.sasl else "") + ("SSL" if self.tls else "PLAINTEXT")


def _jaas(spec: ClusterSpec) -> dict[str, str]:
    listener = spec.client_listener.lower()
    plain_user, plain_password = spec.users.plain
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    mechanisms = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER"
    return {
        "sasl.enabled.mechanisms": mechanisms,
        f"listener.name.{listener}.sasl.enabled.mechanisms": mechanisms,
        f"listener.name.{listener}.plain.sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{plain_user}" password="{plain_password}" user_{plain_user}="{plain_password}";'
        ),
        f"listener.name.{listener}.scram-sha-256.sasl.jaas.config": scram,
        f"listener.name.{listener}.scram-sha-512.sasl.jaas.config": scram,
        # OAUTHBEARER with unsecured JWS tokens (alg "none"): Kafka's default validator for the mechanism
        # (OAuthBearerUnsecuredValidatorCallbackHandler) accepts any well-formed token with a "sub". A
        # development stack only: whoever connects names their own principal.
        f"listener.name.{listener}.oauthbearer.sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredLoginStringClaim_sub="kpmon-broker";'
        ),
    }


def node_properties(node: NodeSpec, spec: ClusterSpec) -> dict[str, str]:
    voters = ",".join(f"{nid}@{HOST}:{port}" for nid, port in spec.controller_voters)
    listeners: list[str] = []
    advertised: list[str] = []
    protocols = ["CONTROLLER:PLAINTEXT", "BROKER:PLAINTEXT"]
    if node.is_broker:
        assert node.client_port is not None and node.broker_port is not None
        client = spec.client_listener
        adv_host, adv_port = node.advertised or (HOST, node.client_port)
        listeners += [f"{client}://{HOST}:{node.client_port}", f"BROKER://{HOST}:{node.broker_port}"]
        advertised += [f"{client}://{adv_host}:{adv_port}", f"BROKER://{HOST}:{node.broker_port}"]
        protocols.append(f"{client}:{client}")
    if "controller" in node.roles:
        assert node.controller_port is not None
        listeners.append(f"CONTROLLER://{HOST}:{node.controller_port}")
    replication = str(min(3, spec.brokers))
    props = {
        "process.roles": ",".join(node.roles),
        "node.id": str(node.node_id),
        "controller.quorum.voters": voters,
        "controller.listener.names": "CONTROLLER",
        "listeners": ",".join(listeners),
        "listener.security.protocol.map": ",".join(protocols),
        "log.dirs": node.data_dir,
        # Two cores are shared with Spark: few threads, few internal partitions, no rebalance delay.
        "num.network.threads": "2",
        "num.io.threads": "2",
        "background.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "num.partitions": "1",
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.num.partitions": "8",
        "offsets.topic.replication.factor": replication,
        "transaction.state.log.replication.factor": replication,
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": replication,
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
    }
    if node.is_broker:
        props["advertised.listeners"] = ",".join(advertised)
        props["inter.broker.listener.name"] = "BROKER"
        if spec.sasl:
            props.update(_jaas(spec))
        if spec.tls:
            props.update(_tls(spec, spec.tls))
    return props


def _tls(spec: ClusterSpec, tls: TlsSpec) -> dict[str, str]:
    prefix = f"listener.name.{spec.client_listener.lower()}."
    return {
        prefix + "ssl.keystore.type": "PEM",
        prefix + "ssl.keystore.location": tls.keystore,
        prefix + "ssl.truststore.type": "PEM",
        prefix + "ssl.truststore.location": tls.truststore,
        prefix + "ssl.client.auth": tls.client_auth,
    }


def render(props: dict[str, str]) -> str:
    """Java properties text. Values never contain newlines; backslashes are escaped for Java's parser."""
    lines = ["# Written by kpmon stack; regenerated on every `up`."]
    lines += [f"{key}={value.replace(chr(92), chr(92) * 2)}" for key, value in props.items()]
    return "\n".join(lines) + "\n"
