"""Control records (the records of a control batch): transaction markers and friends.

The key is ``int16 version, int16 type`` (0 ABORT, 1 COMMIT, others by number); for ABORT and
COMMIT the value is an EndTxnMarker, ``int16 version, int32 coordinator epoch``. Both layouts are
tiny and fixed, so they are decoded directly here for now; they may later be routed through the
JSON-spec decoder (``ControlRecordTypeSchema`` / ``EndTxnMarker``). Trailing bytes after the known
fields are tolerated, as newer versions may append fields.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from codec.errors import DecodeError

ABORT = 0
COMMIT = 1
_NAMES = {ABORT: "ABORT", COMMIT: "COMMIT", 2: "LEADER_CHANGE"}
_KEY = struct.Struct(">hh")
_MARKER = struct.Struct(">hi")


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    version: int
    coordinator_epoch: int


@dataclass(frozen=True, slots=True)
class ControlRecord:
    version: int
    type: int
    #: The EndTxnMarker for ABORT/COMMIT, else None.
    marker: EndTxnMarker | None
    #: Absolute offset of the control record.
    offset: int

    @property
    def type_name(self) -> str:
        return _NAMES.get(self.type, f"UNKNOWN({self.type})")


def decode_control(key: bytes | None, value: bytes | None, offset: int) -> ControlRecord:
    """One control record from its key and value; ``DecodeError`` when they are too short."""
    if key is None or len(key) < _KEY.size:
        raise DecodeError("control record key shorter than 4 bytes", 0, what="control record")
    version, kind = _KEY.unpack_from(key)
    marker = None
    if kind in (ABORT, COMMIT):
        if value is None or len(value) < _MARKER.size:
            raise DecodeError("end transaction marker shorter than 6 bytes", 0, what="control record")
        marker = EndTxnMarker(*_MARKER.unpack_from(value))
    return ControlRecord(version, kind, marker, offset)
