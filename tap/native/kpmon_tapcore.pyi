"""The tap's native building blocks (tap/native/src), each the twin of a Python reference."""

from collections.abc import Iterable, Sequence
from typing import Any, Final

from _typeshed import ReadableBuffer

__version__: Final[str]
#: The digest of the crate sources this build was made from (tap.native_core.source_digest).
SOURCE_DIGEST: Final[str]

class FrameError(ValueError): ...
class DecodeError(ValueError): ...

def use_errors(frame_error: type[BaseException], decode_error: type[BaseException]) -> None:
    """Raise these instead of the module's own classes (the reference's ``tap.framing.FrameError``
    and ``codec.errors.DecodeError``), called as ``frame_error(message)`` and ``decode_error(reason,
    offset, api_key, api_version, what)``."""

class FrameSplitter:
    """``tap.framing.FrameSplitter``: frames as ``(size, head)``."""

    def __init__(self, retain: int, max_frame: int = ..., head: int = ...) -> None: ...
    @property
    def mid_frame(self) -> bool: ...
    def set_retain(self, retain: int) -> None: ...
    def feed(self, data: ReadableBuffer) -> list[tuple[int, bytes]]: ...

def starts_with_tls(data: ReadableBuffer) -> bool: ...
def peek_request_header(buf: ReadableBuffer) -> tuple[int, int, int, str | None, int]:
    """``codec.peek.peek_request_header``: api key, version, correlation id, client id, end."""

def peek_correlation_id(buf: ReadableBuffer) -> int: ...

class ProduceTable:
    """Per Produce version: request header version, and (compact strings, strings before Acks) or None."""

    def __init__(
        self, header_versions: dict[int, int], acks_layouts: dict[int, tuple[bool, int] | None]
    ) -> None: ...
    def peek_produce_acks(self, buf: ReadableBuffer, api_version: int, body: int) -> int | None: ...
    def expects_response(self, head: ReadableBuffer, api_key: int, api_version: int) -> bool: ...

class HeldBudget:
    def __init__(self, limit: int) -> None: ...
    @property
    def held(self) -> int: ...
    @property
    def limit(self) -> int: ...
    def take(self, size: int) -> bool: ...
    def give(self, size: int) -> None: ...

#: A tracked request: api key, api version, forwarded_ns, sensitive, held (None once handed back).
PendingTuple = tuple[int, int, int, bool, Any]
#: A held request handed back: the held object and why (``tap.framing.LONE_REASONS``).
Released = tuple[Any, str]

class Correlations:
    """``tap.framing.Correlations``, holding any object as a request's held frame (``held_size`` bytes)."""

    def __init__(
        self,
        max_in_flight: int,
        max_bytes: int,
        max_age_ns: int,
        max_rebalance_age_ns: int,
        rebalance_waits: Sequence[int],
        budget: HeldBudget | None = None,
    ) -> None: ...
    def __len__(self) -> int: ...
    @property
    def held_bytes(self) -> int: ...
    def add(
        self,
        corr: int,
        api_key: int,
        api_version: int,
        forwarded_ns: int,
        held: object = None,
        held_size: int = 0,
        sensitive: bool = False,
    ) -> list[Released]: ...
    def peek(self, corr: int) -> PendingTuple | None: ...
    def match(self, corr: int) -> tuple[PendingTuple | None, list[Released]]: ...
    def expire(self, now_ns: int) -> list[Released]: ...
    def drain(self) -> list[Released]: ...

def packb(obj: object) -> bytes:
    """``msgpack.packb(obj, use_bin_type=True)`` for None, bool, int, float, str, bytes-likes, lists,
    tuples and dicts."""

def pack_static(connection: Any) -> bytes:
    """``codec.taprecord.pack_static``."""

def pack_flush(
    static: bytes, entries: Iterable[tuple[str, int, Iterable[Any]]], lost: int = 0, loss_ns: int = 0
) -> bytes:
    """``codec.taprecord.pack_flush``."""
