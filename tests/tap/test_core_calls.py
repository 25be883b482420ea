"""Python calls per Produce exchange in the tap's per-frame path (adapter + core), counted with
``sys.setprofile``: a real rdkafka Produce request and its response (tests/data/tap_frames.jsonl), one
chunk each, the ``headers`` policy, mirroring on, through ``_Side.data_received`` as the event loop
calls it. Only the sockets are stand-ins (a transport that keeps what is written).

Measured with this harness: the tap before the core (TapConnection doing the work itself) 136 calls;
the adapter over the Python reference core 108 (most of them the codec's header decodes and the
strip, which the reference reuses); the native core must take at most ``NATIVE_MAX``.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from tap.core import PyTapCore
from tap.listeners import ListenerSpec
from tap.metrics import TapMetrics
from tap.mirror import MemoryMirror
from tap.proxy import Tap, TapConnection, TapSettings, _Side

CORPUS = Path(__file__).resolve().parents[1] / "data" / "tap_frames.jsonl"
#: What the tap spent before the core, with this harness: the reference must stay below it.
BEFORE = 136
#: Issue 34's target for the adapter and the native core.
NATIVE_MAX = 6


def _produce_exchange() -> tuple[bytes, bytes]:
    lines = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    req = next(f for f in lines if f["dir"] == "req" and f["api_key"] == 0 and f["source"] == "rdkafka")
    resp = next(
        f
        for f in lines
        if f["dir"] == "resp"
        and f["api_key"] == 0
        and f["source"] == "rdkafka"
        and f["corr_id"] == req["corr_id"]
    )
    raw = [bytes.fromhex(f["hex"]) for f in (req, resp)]
    return tuple(struct.pack(">i", len(b)) + b for b in raw)  # type: ignore[return-value]


class _Transport:
    """Keeps what is written; says nothing about sockets or TLS."""

    def __init__(self) -> None:
        self.written = bytearray()
        #: A C method, as uvloop's write is: the count is the tap's calls, not the stand-in's.
        self.write = self.written.extend

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def is_closing(self) -> bool:
        return False

    def close(self) -> None: ...
    def abort(self) -> None: ...
    def can_write_eof(self) -> bool:
        return False


async def _count() -> tuple[int, int, TapConnection, bytes, bytes]:
    request, response = _produce_exchange()
    sink = MemoryMirror()
    tap = Tap([], sink, TapSettings(capture="headers"), TapMetrics())
    spec = ListenerSpec("127.0.0.1", 0, "127.0.0.1", 9, broker_id=1)
    conn = TapConnection(tap, spec, "tap-t.0-1")

    async def no_broker() -> None:
        return None

    conn._connect = no_broker  # type: ignore[method-assign]
    client, broker = _Transport(), _Transport()
    client_side, broker_side = _Side(conn, client=True), _Side(conn, client=False)
    client_side.connection_made(client)  # type: ignore[arg-type]
    conn.broker_t = broker  # type: ignore[assignment]
    # Warm up: the flush timer armed, lookups cached, as on a connection that has been busy.
    for _ in range(3):
        client_side.data_received(request)
        broker_side.data_received(response)
    calls = c_calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls, c_calls
        if event == "call":
            calls += 1
        elif event == "c_call":
            c_calls += 1

    sys.setprofile(profile)
    try:
        client_side.data_received(request)
        broker_side.data_received(response)
    finally:
        sys.setprofile(None)
    conn._shutdown()
    return calls, c_calls, conn, bytes(broker.written), bytes(client.written)


def test_a_produce_exchange_costs_few_python_calls() -> None:
    calls, c_calls, conn, to_broker, to_client = asyncio.run(_count())
    request, response = _produce_exchange()
    # The stand-in transports got every byte unchanged.
    assert to_broker == request * 4 and to_client == response * 4
    print(f"python calls per Produce exchange: {calls} ({c_calls} C calls), core {type(conn.core).__name__}")
    if isinstance(conn.core, PyTapCore):
        assert calls < BEFORE
        return
    assert calls <= NATIVE_MAX


def test_the_native_core_meets_its_budget() -> None:
    from tap import native_core

    native, why = native_core.status()
    if native is None or not hasattr(native, "TapCore"):
        reason = why if native is None else f"{why} has no TapCore yet"
        pytest.skip(f"the native tap core is not in use ({reason}); the reference's count is checked above")
    calls, _, conn, _, _ = asyncio.run(_count())
    assert not isinstance(conn.core, PyTapCore)
    assert calls <= NATIVE_MAX, f"{calls} Python calls per Produce exchange with the native core"
