"""What the worker needs from a transport: send one batch of alert dicts, say how each one fared."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from streaming.hooks.core import Result
from streaming.hooks.formatters import AlertDict


@dataclass(frozen=True)
class SendResult:
    #: One per alert, in order.
    results: list[Result]
    #: Why it failed, for logs and counters; never contains secrets (URLs are redacted to scheme://host).
    error: str = ""
    #: Seconds the receiver asked us to wait (HTTP Retry-After).
    retry_after: float | None = None

    @classmethod
    def all(cls, result: Result, count: int, error: str = "", retry_after: float | None = None) -> SendResult:
        return cls([result] * count, error, retry_after)


class Sender(Protocol):
    def send(self, alerts: Sequence[AlertDict]) -> SendResult:
        """Deliver ``alerts`` as one request (or one producer batch). Must not raise for delivery problems
        and must return within about the hook's timeout."""
        ...

    def close(self) -> None: ...
