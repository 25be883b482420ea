"""Shared pytest fixtures. Keep them grouped by area, one section each, with a short note on cost.

Stack fixtures are session-scoped (a JVM start costs seconds) and start lazily: a run that selects no
integration test never starts Java. Each stack gets a fresh directory and kernel-chosen free ports, so
nothing needs to be running beforehand and parallel runs do not collide.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from deploy.local.stack import LocalStack
from deploy.versions import KAFKA_LATEST, KAFKA_LEGACY
from tap.proxy import parse_hostport
from tests.tap.harness import TappedCluster, free_port, start_stack

# ----- pytest-xdist workers (`make test` runs the suite on both cores) ---------------------------------

# A worker runs as `python -c`, so its __main__ has neither a spec nor a file. pyspark.sql.connect, which
# Great Expectations imports, takes exactly that for a doctest run and calls sys.exit(0) when its
# optional dependencies are missing, which ends the worker during collection. A spec named __main__
# says "a program", and multiprocessing's spawn skips re-importing such a main module, as it does now.
_main = sys.modules["__main__"]
if _main.__spec__ is None and not hasattr(_main, "__file__") and not hasattr(sys, "ps1"):
    _main.__spec__ = ModuleSpec("__main__", None)

# ----- a run stopped by SIGTERM tears its fixtures down ------------------------------------------------

# The stack's JVMs run in process groups of their own, so a run that dies at SIGTERM (a CI timeout, a
# `kill`) would leave its brokers behind: Python's default is to exit without running a `finally`. As a
# KeyboardInterrupt, pytest stops and tears the session's fixtures down, stacks included. A process
# forked from the run (a test's child) keeps SIGTERM's default.
_RUN_PID = os.getpid()


def _stop_on_sigterm(signum: int, frame: object) -> None:
    if os.getpid() != _RUN_PID:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise KeyboardInterrupt("SIGTERM: the run stops, and its fixtures are torn down")


if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)

# ----- local Kafka stack (deploy/local) -------------------------------------------------------------


def _session_stack(factory: pytest.TempPathFactory, name: str, **kwargs: object) -> Iterator[LocalStack]:
    stack = LocalStack(factory.mktemp(name), **kwargs)  # type: ignore[arg-type]
    try:
        stack.up()
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="session")
def kafka_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A single combined Kafka 4.4.0 node, PLAINTEXT. Shared: create your own topics, unique names."""
    yield from _session_stack(tmp_path_factory, "kafka-stack", version=KAFKA_LATEST)


@pytest.fixture(scope="session")
def legacy_kafka_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A single combined Kafka 3.9.2 node: serves the API versions that 4.0 removed (KIP-896)."""
    yield from _session_stack(tmp_path_factory, "legacy-kafka-stack", version=KAFKA_LEGACY)


@pytest.fixture(scope="session")
def sasl_kafka_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A single 4.4.0 node with a SASL_PLAINTEXT listener; see ``.sasl_users`` and ``.client_config()``."""
    yield from _session_stack(tmp_path_factory, "sasl-kafka-stack", version=KAFKA_LATEST, sasl=True)


@pytest.fixture
def stack_home(tmp_path: Path) -> Path:
    """A fresh directory for a test that starts its own stack."""
    return tmp_path / "stack"


# ----- a cluster whose clients go through a tap (tap/, checks/ real-traffic tests) ---------------------


@pytest.fixture(scope="session")
def tapped_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TappedCluster]:
    """One 4.4.0 node that advertises a tap address; start the tap with ``.start_tap()``.

    ``KPMON_TAP_BROKER=broker_host:port,tap_host:port,mirror_bootstrap`` uses a broker started by hand
    that already advertises ``tap_host:port`` (and a second, direct listener for the mirror). Otherwise
    a LocalStack advertises a free port for the tap and the mirror goes through its internal
    (inter-broker) listener, which advertises the broker itself: mirror traffic never loops through
    the tap. Costs one JVM start, on first use.
    """
    env = os.environ.get("KPMON_TAP_BROKER")
    if env:
        broker, tap_addr, mirror = env.split(",")
        yield TappedCluster(tap_addr, parse_hostport(broker), 1, parse_hostport(tap_addr), mirror)
        return
    port = free_port()
    stack = LocalStack(tmp_path_factory.mktemp("tapped-stack"), advertised={1: ("127.0.0.1", port)})
    try:
        start_stack(stack)
        b = stack.listen_endpoints[0]
        yield TappedCluster(
            f"127.0.0.1:{port}",
            (b.host, b.port),
            b.node_id,
            ("127.0.0.1", port),
            stack.internal_bootstrap_servers,
        )
    finally:
        stack.down()
