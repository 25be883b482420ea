"""Fixtures for tap tests against a real broker whose advertised address is the tap's.

Two sources, so the tests run wherever a broker is available:
- ``KPMON_TAP_BROKER=broker_host:port,tap_host:port,mirror_bootstrap`` points at a broker started by
  hand that already advertises ``tap_host:port`` (and a second, direct listener for the mirror);
- otherwise ``deploy.local.stack.LocalStack`` with ``advertised=`` the tap's port, mirroring through its
  internal (inter-broker) listener, which advertises the broker itself: mirror traffic never loops
  through the tap.
Without either, the integration tests skip.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tap.mirror import KafkaMirror
from tap.proxy import ListenerSpec, TapSettings, parse_hostport
from tests.tap.harness import TapThread


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TappedCluster:
    #: What clients bootstrap from: the tap.
    bootstrap: str
    broker: tuple[str, int]
    broker_id: int
    tap_addr: tuple[str, int]
    #: Cluster holding the tap topic (reached directly, not through the tap).
    mirror_bootstrap: str

    def start_tap(
        self, topic: str | None = None, capture: str = "full", **kw: object
    ) -> tuple[TapThread, str]:
        topic = topic or f"kpmon.tap.{uuid.uuid4().hex[:8]}"
        sink = KafkaMirror(
            self.mirror_bootstrap,
            topic,
            max_frames=int(kw.pop("max_frames", 100_000)),  # type: ignore[call-overload]
            max_bytes=int(kw.pop("max_bytes", 64 << 20)),  # type: ignore[call-overload]
            properties={"linger.ms": "5"},
        )
        spec = ListenerSpec(*self.tap_addr, *self.broker, self.broker_id)
        settings = TapSettings(capture=capture, **kw)  # type: ignore[arg-type]
        return TapThread([spec], sink, settings).start(), topic


def start_stack(stack: Any) -> None:
    """``up()``, tolerating a false "node exited during start-up".

    Under load, LocalStack's liveness check can read /proc/<pid>/cmdline between fork and exec (no
    marker yet) and report a live JVM as dead. If the node is in fact running a moment later, wait
    for it instead of failing; otherwise tear down and try once more.
    """
    try:
        stack.up()
        return
    except Exception:
        time.sleep(2)
        if stack.is_running():
            stack._wait_ready(90)
            return
    stack.down()
    stack.up()


@pytest.fixture(scope="session")
def tapped_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TappedCluster]:
    env = os.environ.get("KPMON_TAP_BROKER")
    if env:
        broker, tap_addr, mirror = env.split(",")
        yield TappedCluster(tap_addr, parse_hostport(broker), 1, parse_hostport(tap_addr), mirror)
        return
    try:
        from deploy.local.stack import LocalStack  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pytest.skip("no broker: deploy.local.stack is missing and KPMON_TAP_BROKER is unset")
    port = free_port()
    home: Path = tmp_path_factory.mktemp("tapped-stack")
    stack = LocalStack(home, advertised={1: ("127.0.0.1", port)})
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
