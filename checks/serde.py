"""Monitor state as plain JSON-compatible data, so a state store (Spark's, a file) can keep it.

Rule state is already plain data. What is not is the frames the engine holds between events: requests
waiting for their responses and frames waiting for the watermark. Those are kept as their tap metadata
plus the mirrored bytes, and decoded again when the state is restored — the bytes are the source of
truth, and a decoded message is never serialized.
"""

from __future__ import annotations

import base64
from typing import Any

from checks.engine import Monitor, _ConnState
from checks.ingest import decode_frame
from checks.model import Frame

#: Bumped when the layout below changes incompatibly; restoring a newer layout is refused.
STATE_FORMAT = 1


class StateFormatError(ValueError):
    """Saved monitor state this version cannot read (written by a newer kpmon, or corrupt)."""


def frame_to_dict(frame: Frame) -> dict[str, Any]:
    return {
        "conn": frame.conn,
        "seq": frame.seq,
        "ts_ns": frame.ts_ns,
        "dir": frame.direction,
        "api_key": frame.api_key,
        "api_version": frame.api_version,
        "corr_id": frame.correlation_id,
        "client": frame.client,
        "broker": frame.broker,
        "broker_id": frame.broker_id,
        "listener": frame.listener,
        "partition": frame.partition,
        "offset": frame.offset,
        "capture": frame.capture,
        "raw": base64.b64encode(frame.raw).decode("ascii") if frame.raw is not None else None,
    }


def frame_from_dict(data: dict[str, Any]) -> Frame:
    frame = Frame(
        conn=data["conn"],
        seq=data["seq"],
        ts_ns=data["ts_ns"],
        direction=data["dir"],
        api_key=data.get("api_key"),
        api_version=data.get("api_version"),
        correlation_id=data.get("corr_id"),
        client=data.get("client", ""),
        broker=data.get("broker", ""),
        broker_id=data.get("broker_id"),
        listener=data.get("listener"),
        partition=data.get("partition", -1),
        offset=data.get("offset", -1),
        capture=data.get("capture", "full"),
    )
    raw = data.get("raw")
    if raw is None:
        return frame
    return decode_frame(frame, base64.b64decode(raw))


def export_state(monitor: Monitor) -> dict[str, Any]:
    """Everything the monitor needs to carry on after a restart (not its statistics: those are deltas)."""
    return {
        "format": STATE_FORMAT,
        "states": [[rule, key, state] for (rule, key), state in monitor.states.items()],
        "last_seen": [[rule, key, ts] for (rule, key), ts in monitor.last_seen.items()],
        "conns": {
            conn: {
                "last_seq": cs.last_seq,
                "pending": [frame_to_dict(f) for f in cs.pending.values()],
            }
            for conn, cs in monitor.conns.items()
        },
        "heap": [frame_to_dict(entry[-1]) for entry in monitor._heap],
        "timers": [[rule, key, deadline] for (rule, key), deadline in monitor.ctx.timers.items()],
        "incomplete": sorted(monitor.ctx.incomplete_conns),
        "max_ts": monitor.max_ts,
        "released_ts": monitor.released_ts,
        "next_sweep": monitor._next_sweep,
    }


def import_state(monitor: Monitor, data: dict[str, Any]) -> Monitor:
    """Restore ``export_state`` output into a freshly built monitor with the same rules."""
    version = data.get("format")
    if not isinstance(version, int) or version > STATE_FORMAT:
        raise StateFormatError(f"monitor state format {version!r} is newer than this kpmon ({STATE_FORMAT})")
    monitor.states = {(rule, key): state for rule, key, state in data.get("states", [])}
    monitor.last_seen = {(rule, key): ts for rule, key, ts in data.get("last_seen", [])}
    monitor.conns = {}
    for conn, saved in data.get("conns", {}).items():
        cs = _ConnState(last_seq=saved["last_seq"])
        for fd in saved.get("pending", []):
            frame = frame_from_dict(fd)
            if frame.correlation_id is not None:
                cs.pending[frame.correlation_id] = frame
        monitor.conns[conn] = cs
    for fd in data.get("heap", []):
        monitor.push(frame_from_dict(fd))
    monitor.ctx.timers = {(rule, key): deadline for rule, key, deadline in data.get("timers", [])}
    monitor.ctx.incomplete_conns = set(data.get("incomplete", []))
    monitor.max_ts = data.get("max_ts", 0)
    monitor.released_ts = data.get("released_ts", 0)
    monitor._next_sweep = data.get("next_sweep", 0)
    return monitor
