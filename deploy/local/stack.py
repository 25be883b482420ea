"""A real local Kafka (KRaft) stack on loopback: one combined node, or three brokers and a controller.

Everything lives under one directory (``home``)::

    home/stack.json            what was started: version, sizes, ports, cluster id
    home/node-<id>/server.properties, data/, kafka.log, pid

A running stack is recognised from its pid files plus a liveness check, so ``up`` is idempotent and
``down`` works from another process (the CLI).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.local import process
from deploy.local.distribution import fetch_distribution, libs_dir, logging_jvm_args
from deploy.local.process import StackError
from deploy.local.properties import (
    HOST,
    ClusterSpec,
    NodeSpec,
    SaslUsers,
    TlsSpec,
    node_properties,
    render,
)
from deploy.versions import KAFKA_LATEST
from kpconfig.model import write_private

__all__ = ["BrokerEndpoint", "LocalStack", "StackError"]

STATE_FILE = "stack.json"
#: In 3-broker mode the controller gets an id no broker uses, so broker ids stay 1..N.
CONTROLLER_ID = 100


@dataclass(frozen=True)
class BrokerEndpoint:
    """Where clients reach a broker (its advertised client listener)."""

    node_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class _Ports:
    client: tuple[int, ...]
    broker: tuple[int, ...]
    controller: int

    @classmethod
    def contiguous(cls, base: int, brokers: int) -> _Ports:
        """Clients on ``base..``, then the inter-broker listeners, then the controller."""
        return cls(
            client=tuple(range(base, base + brokers)),
            broker=tuple(range(base + brokers, base + 2 * brokers)),
            controller=base + 2 * brokers,
        )

    @classmethod
    def free(cls, brokers: int) -> _Ports:
        ports = process.free_ports(2 * brokers + 1)
        return cls(tuple(ports[:brokers]), tuple(ports[brokers : 2 * brokers]), ports[-1])

    def all(self) -> list[int]:
        return [*self.client, *self.broker, self.controller]


def _cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _log(message: str) -> None:
    print(f"kpmon stack: {message}", file=sys.stderr, flush=True)


class LocalStack:
    """Start, inspect and stop a local Kafka cluster whose state lives in ``home``."""

    def __init__(
        self,
        home: Path,
        version: str = KAFKA_LATEST,
        brokers: int = 1,
        sasl: bool = False,
        base_port: int | None = None,
        advertised: dict[int, tuple[str, int]] | None = None,
        tls: TlsSpec | None = None,
    ) -> None:
        if brokers not in (1, 3):
            raise StackError("brokers must be 1 (combined node) or 3 (separate controller quorum)")
        self.home = Path(home).resolve()
        self.version = version
        self.broker_count = brokers
        self.sasl = sasl
        #: TLS on the client listener (SSL, or SASL_SSL with ``sasl``); the inter-broker one stays plaintext.
        self.tls = tls
        self.advertised = dict(advertised or {})
        self.users = SaslUsers()
        self.last_start_seconds: float | None = None
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        state = self._read_state()
        if base_port is not None:
            self._ports = _Ports.contiguous(base_port, brokers)
        elif state is not None and len(state["ports"]["client"]) == brokers:
            # Reuse the ports of an earlier run, so `up` twice (or `down` from the CLI) finds the same stack.
            p = state["ports"]
            self._ports = _Ports(tuple(p["client"]), tuple(p["broker"]), p["controller"])
        else:
            self._ports = _Ports.free(brokers)

    @classmethod
    def open(cls, home: Path) -> LocalStack:
        """The stack recorded in ``home`` (as started earlier, possibly by another process)."""
        state = cls._state_at(Path(home))
        if state is None:
            raise StackError(f"no stack in {home} (nothing was started there)")
        advertised = {int(k): (v[0], int(v[1])) for k, v in state.get("advertised", {}).items()}
        tls = TlsSpec(**state["tls"]) if state.get("tls") else None
        return cls(
            home, state["version"], len(state["ports"]["client"]), state["sasl"], None, advertised, tls
        )

    # ----- topology -------------------------------------------------------------------------------

    @property
    def broker_ids(self) -> list[int]:
        return list(range(1, self.broker_count + 1))

    def _nodes(self) -> list[NodeSpec]:
        nodes: list[NodeSpec] = []
        combined = self.broker_count == 1
        if not combined:
            nodes.append(
                NodeSpec(
                    CONTROLLER_ID,
                    ("controller",),
                    str(self._node_dir(CONTROLLER_ID) / "data"),
                    controller_port=self._ports.controller,
                )
            )
        for index, node_id in enumerate(self.broker_ids):
            nodes.append(
                NodeSpec(
                    node_id,
                    ("broker", "controller") if combined else ("broker",),
                    str(self._node_dir(node_id) / "data"),
                    client_port=self._ports.client[index],
                    broker_port=self._ports.broker[index],
                    controller_port=self._ports.controller if combined else None,
                    advertised=self.advertised.get(node_id),
                )
            )
        return nodes

    def _cluster(self) -> ClusterSpec:
        voter = 1 if self.broker_count == 1 else CONTROLLER_ID
        return ClusterSpec(
            ((voter, self._ports.controller),), self.broker_count, self.sasl, self.users, self.tls
        )

    def properties(self, node_id: int) -> dict[str, str]:
        """The ``server.properties`` a node gets (for inspection and tests)."""
        for node in self._nodes():
            if node.node_id == node_id:
                return node_properties(node, self._cluster())
        raise StackError(f"no node {node_id} in this stack")

    @property
    def brokers(self) -> list[BrokerEndpoint]:
        """The client-facing endpoints, as advertised (the tap's addresses when ``advertised`` is set)."""
        out = []
        for index, node_id in enumerate(self.broker_ids):
            host, port = self.advertised.get(node_id, (HOST, self._ports.client[index]))
            out.append(BrokerEndpoint(node_id, host, port))
        return out

    @property
    def listen_endpoints(self) -> list[BrokerEndpoint]:
        """Where each broker's client listener actually binds (what a tap forwards to)."""
        return [BrokerEndpoint(n, HOST, p) for n, p in zip(self.broker_ids, self._ports.client, strict=True)]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.address for b in self.listen_endpoints)

    @property
    def internal_bootstrap_servers(self) -> str:
        """The plaintext inter-broker listeners: always the brokers themselves, never authenticated."""
        return ",".join(f"{HOST}:{p}" for p in self._ports.broker)

    @property
    def sasl_users(self) -> dict[str, tuple[str, str]]:
        """Mechanism -> (username, password) on the SASL listener; empty without ``sasl``."""
        return self.users.by_mechanism() if self.sasl else {}

    def client_config(self, mechanism: str = "PLAIN") -> dict[str, Any]:
        """librdkafka settings to reach the client listener (with ``mechanism``'s user under SASL).

        Typed ``Any`` so callers can add callbacks (``error_cb``) and numbers without casts.
        """
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        if self.tls:
            config |= {"security.protocol": "SSL", "ssl.ca.location": self.tls.truststore}
        if self.sasl:
            user, password = self.sasl_users[mechanism]
            config |= {
                "security.protocol": self._cluster().client_listener,
                "sasl.mechanism": mechanism,
                "sasl.username": user,
                "sasl.password": password,
            }
        return config

    # ----- files ----------------------------------------------------------------------------------

    def _node_dir(self, node_id: int) -> Path:
        return self.home / f"node-{node_id}"

    def _pid_file(self, node_id: int) -> Path:
        return self._node_dir(node_id) / "pid"

    def _marker(self, node_id: int) -> str:
        return str(self._node_dir(node_id) / "server.properties")

    def log_file(self, node_id: int) -> Path:
        return self._node_dir(node_id) / "kafka.log"

    @staticmethod
    def _state_at(home: Path) -> dict[str, Any] | None:
        try:
            state: dict[str, Any] = json.loads((Path(home) / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return state

    def _read_state(self) -> dict[str, Any] | None:
        return self._state_at(self.home)

    def _state(self, cluster_id: str) -> dict[str, Any]:
        return {
            "version": self.version,
            "sasl": self.sasl,
            "tls": self.tls.to_dict() if self.tls else None,
            "cluster_id": cluster_id,
            "ports": {
                "client": list(self._ports.client),
                "broker": list(self._ports.broker),
                "controller": self._ports.controller,
            },
            "advertised": {str(k): list(v) for k, v in self.advertised.items()},
        }

    def _pid(self, node_id: int) -> int | None:
        try:
            return int(self._pid_file(node_id).read_text().strip())
        except (OSError, ValueError):
            return None

    def _alive(self, node_id: int) -> bool:
        proc = self._procs.get(node_id)
        if proc is not None:
            # Our own child: poll() is exact, and reaps it so a dead broker is not taken for a live
            # zombie. The marker check below would also misfire between fork and exec.
            return proc.poll() is None
        pid = self._pid(node_id)
        return pid is not None and process.is_alive(pid, self._marker(node_id))

    def _all_node_ids(self) -> list[int]:
        return [n.node_id for n in self._nodes()]

    def is_running(self) -> bool:
        return all(self._alive(n) for n in self._all_node_ids())

    # ----- lifecycle ------------------------------------------------------------------------------

    def _java(self, version: str) -> list[str]:
        return [process.find_java(), "-cp", str(libs_dir(version) / "*")]

    def up(self, timeout: float = 90) -> None:
        """Start the stack and return once every broker answers a metadata request.

        Harmless when this stack is already running. Raises ``StackError`` (``JavaNotFoundError``,
        ``PortInUseError``) with a message saying what to fix.
        """
        started = time.monotonic()
        process.find_java()
        state = self._read_state()
        if self.is_running() and state is not None:
            if (state["version"], state["sasl"]) != (self.version, self.sasl):
                raise StackError(
                    f"a different stack (Kafka {state['version']}, sasl={state['sasl']}) is running in "
                    f"{self.home}; run `kpmon stack down` first"
                )
            _log(f"already running in {self.home}")
            self._wait_ready(timeout)
            return
        if state is not None and len(state["ports"]["client"]) != self.broker_count:
            recorded = LocalStack.open(self.home)
            if any(recorded._alive(n) for n in recorded._all_node_ids()):
                raise StackError(
                    f"a {recorded.broker_count}-broker stack is running in {self.home}; "
                    "run `kpmon stack down` first"
                )
        self._stop_nodes(self._all_node_ids())  # leftovers of a half-dead stack
        fetch_distribution(self.version)
        self._check_ports()
        cluster_id = self._prepare(state)
        self._format(cluster_id)
        nodes = self._nodes()
        _log(f"starting Kafka {self.version}: {len(nodes)} process(es) in {self.home}")
        for node in nodes:
            self._spawn(node.node_id)
        self._wait_ready(timeout)
        self.last_start_seconds = time.monotonic() - started
        _log(f"ready in {self.last_start_seconds:.1f}s, bootstrap servers {self.bootstrap_servers}")

    def _check_ports(self) -> None:
        roles = [("client", p) for p in self._ports.client]
        roles += [("inter-broker", p) for p in self._ports.broker] + [("controller", self._ports.controller)]
        taken = [f"{port} ({role})" for role, port in roles if not process.port_is_free(port)]
        if taken:
            raise process.PortInUseError(
                f"port(s) already in use on {HOST}: {', '.join(taken)}. Stop whatever holds them, or pick "
                "other ports (--base-port / stack.base_port)."
            )

    def _prepare(self, state: dict[str, Any] | None) -> str:
        """Write state and configs; wipe data made by a different version or topology (not reusable)."""
        same = state is not None and (
            state["version"],
            state["sasl"],
            len(state["ports"]["client"]),
        ) == (self.version, self.sasl, self.broker_count)
        if not same:
            for old in self.home.glob("node-*"):
                shutil.rmtree(old, ignore_errors=True)
        cluster_id = str(state["cluster_id"]) if same and state is not None else _cluster_id()
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / STATE_FILE).write_text(json.dumps(self._state(cluster_id), indent=2) + "\n")
        cluster = self._cluster()
        for node in self._nodes():
            node_dir = self._node_dir(node.node_id)
            (node_dir / "data").mkdir(parents=True, exist_ok=True)
            # Holds the SASL users' JAAS passwords (and keystore passwords with TLS): owner-only.
            write_private(node_dir / "server.properties", render(node_properties(node, cluster)))
        return cluster_id

    def _format(self, cluster_id: str) -> None:
        """Run the release's StorageTool on every unformatted node, in parallel (each is a JVM start)."""
        pending = [n for n in self._nodes() if not (Path(n.data_dir) / "meta.properties").exists()]
        if not pending:
            return
        _log(f"formatting KRaft storage for {len(pending)} node(s)")
        extra = self.users.add_scram_args() if self.sasl else []
        jobs = []
        for node in pending:
            props = self._node_dir(node.node_id) / "server.properties"
            cmd = [
                *self._java(self.version),
                *process.TOOL_JVM_OPTS,
                *logging_jvm_args(self.version, "WARN"),
                "kafka.tools.StorageTool",
                "format",
                # One argument, not two: a random id may start with "-", which argparse takes for a flag.
                f"--cluster-id={cluster_id}",
                "-c",
                str(props),
                "--ignore-formatted",
                *extra,
            ]
            jobs.append(
                (node.node_id, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            )
        for node_id, job in jobs:
            out, _ = job.communicate(timeout=120)
            if job.returncode != 0:
                raise StackError(f"formatting node {node_id} failed:\n{out.decode(errors='replace')[-3000:]}")

    def _spawn(self, node_id: int) -> None:
        node_dir = self._node_dir(node_id)
        cmd = [
            *self._java(self.version),
            *process.BROKER_JVM_OPTS,
            *logging_jvm_args(self.version, "INFO"),
            f"-Dkafka.logs.dir={node_dir}",
            "kafka.Kafka",
            str(node_dir / "server.properties"),
        ]
        proc = process.spawn(cmd, self.log_file(node_id), node_dir)
        self._procs[node_id] = proc
        self._pid_file(node_id).write_text(f"{proc.pid}\n")

    def _wait_ready(self, timeout: float) -> None:
        """Poll until every broker is registered and serving metadata; fail fast if a JVM dies."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin: AdminClient | None = None
        last = "no answer yet"
        while time.monotonic() < deadline:
            dead = [n for n in self._all_node_ids() if not self._alive(n)]
            if dead:
                raise StackError(f"node {dead[0]} exited during start-up:\n{self.logs(dead[0], 40)}")
            ports = [*self._ports.broker, *self._ports.client]
            if all(process.port_open(p) for p in ports):
                if admin is None:
                    # The plaintext inter-broker listener: no credentials, and never the tap's address.
                    admin = AdminClient(
                        {"bootstrap.servers": self.internal_bootstrap_servers, "log_level": 0}
                    )
                try:
                    metadata = admin.list_topics(timeout=2)
                    registered = sorted(metadata.brokers)
                    if registered == self.broker_ids:
                        return
                    last = f"brokers registered: {registered}"
                except Exception as exc:  # KafkaException while the broker is still starting
                    last = str(exc)
            time.sleep(0.2)
        raise StackError(
            f"stack in {self.home} not ready after {timeout:.0f}s ({last}); see `kpmon stack logs`"
        )

    def _stop_nodes(self, node_ids: list[int], grace: float = 20.0) -> None:
        targets = [(pid, self._marker(n)) for n in node_ids if (pid := self._pid(n)) is not None]
        process.terminate(targets, grace)
        for node_id in node_ids:
            self._procs.pop(node_id, None)
            self._pid_file(node_id).unlink(missing_ok=True)

    def down(self) -> None:
        """Stop brokers (controlled shutdown needs the controller), then the controller. No orphans."""
        brokers = self.broker_ids
        controllers = [n for n in self._all_node_ids() if n not in brokers]
        self._stop_nodes(brokers)
        self._stop_nodes(controllers)

    def kill_broker(self, node_id: int, graceful: bool = False) -> None:
        """Stop one broker: SIGKILL (a crash) by default, SIGTERM (controlled shutdown) if ``graceful``."""
        if node_id not in self.broker_ids:
            raise StackError(f"no broker {node_id}; brokers are {self.broker_ids}")
        pid = self._pid(node_id)
        if pid is None:
            return
        if graceful:
            process.terminate([(pid, self._marker(node_id))])
        else:
            process.kill(pid, self._marker(node_id))
        self._procs.pop(node_id, None)
        self._pid_file(node_id).unlink(missing_ok=True)

    def start_broker(self, node_id: int, timeout: float = 60) -> None:
        """Restart a broker stopped with ``kill_broker`` and wait until the cluster is whole again."""
        if node_id not in self.broker_ids:
            raise StackError(f"no broker {node_id}; brokers are {self.broker_ids}")
        if not self._alive(node_id):
            self._spawn(node_id)
        self._wait_ready(timeout)

    # ----- inspection -----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        nodes = []
        for node in self._nodes():
            nodes.append(
                {
                    "node_id": node.node_id,
                    "roles": list(node.roles),
                    "pid": self._pid(node.node_id),
                    "alive": self._alive(node.node_id),
                    "client_port": node.client_port,
                    "advertised": "{}:{}".format(*node.advertised) if node.advertised else None,
                    "log": str(self.log_file(node.node_id)),
                }
            )
        alive = [n["alive"] for n in nodes]
        return {
            "home": str(self.home),
            "kafka_version": self.version,
            "brokers": self.broker_count,
            "sasl": self.sasl,
            "state": "running" if all(alive) else ("degraded" if any(alive) else "stopped"),
            "bootstrap_servers": self.bootstrap_servers,
            "nodes": nodes,
            "sasl_users": {m: {"username": u, "password": p} for m, (u, p) in self.sasl_users.items()},
        }

    def logs(self, node_id: int | None = None, lines: int = 100) -> str:
        """The last ``lines`` of one node's log, or of every node's (each under a header)."""
        ids = [node_id] if node_id is not None else self._all_node_ids()
        parts = []
        for nid in ids:
            try:
                text = self.log_file(nid).read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                text = ["(no log yet)"]
            header = [f"==> node {nid}: {self.log_file(nid)} <=="] if node_id is None else []
            parts.append("\n".join(header + text))
        return "\n".join(parts)
