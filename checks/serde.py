"""Monitor state as plain JSON-compatible data, so a state store (Spark's, a file) can keep it.

Rule state is already plain data. What is not is the frames the engine holds between events: requests
waiting for their responses and frames waiting for the watermark. Those are kept as their tap metadata
plus the mirrored bytes, and decoded again when the state is restored — the bytes are the source of
truth, and a decoded message is never serialized.
"""

from __future__ import annotations

from typing import Any

from checks.engine import Monitor, _ConnState
from codec import taprecord
from codec.taprecord import TapFrame

#: Bumped when the layout below changes incompatibly; restoring a newer layout is refused.
STATE_FORMAT = 1


class StateFormatError(ValueError):
    """Saved monitor state this version cannot read (written by a newer kpmon, or corrupt)."""


def frame_to_dict(frame: TapFrame) -> dict[str, Any]:
    """A held frame as saved state: ``codec.taprecord``'s dict under the state format 1 keys (``dir``,
    ``corr_id``), which every kpmon that reads format 1 understands, so a rollback can restore it."""
    return taprecord.frame_to_dict(frame, keys=taprecord.STATE_KEYS)


def frame_from_dict(data: dict[str, Any]) -> TapFrame:
    """Saved state back to a frame, decoded again from its bytes (either key vocabulary reads)."""
    return taprecord.frame_from_dict(data)


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
