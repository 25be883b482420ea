"""What the checkers consume and produce: decoded frames, request/response exchanges and findings.

Everything here is plain data. Time is the tap's ``ts_ns`` carried by each frame; nothing reads a clock.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from codec.api import Request, Response
from codec.taprecord import TapFrame


class Severity(StrEnum):
    """How urgent a finding is; its ``rank`` orders them."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """Order of urgency (info 0 < warning 1 < critical 2): the one ranking the alert book, the
        report and the hooks' minimum severity all use. Members are declared in this order."""
        return _SEVERITY_ORDER.index(self)


_SEVERITY_ORDER: tuple[Severity, ...] = tuple(Severity)
#: Severity name -> rank, for code that holds severities as plain strings (alerts as JSON, config).
SEVERITY_RANK: dict[str, int] = {s.value: s.rank for s in Severity}


class Exchange:
    """A request with its response (None when none came: acks=0 produce, or the connection closed).

    Built once per dispatch and handed to every rule that looks at it, so what every rule reads of it
    is computed once, here: the request and response messages and the header facts are attributes, not
    properties, and ``memo`` holds what the rules derive from the bodies (``checks.rules.producers``
    walks a Produce's batches once per exchange, not once per rule). Treat it, and what ``memo``
    holds, as read-only.
    """

    __slots__ = (
        "api_key",
        "api_version",
        "conn",
        "envelope",
        "memo",
        "req",
        "request",
        "resp",
        "response",
        "seen_ns",
        "ts_ns",
    )

    request: TapFrame
    response: TapFrame | None
    #: Set when this exchange was unwrapped from an Envelope (KIP-590): rules prefix their ids.
    envelope: TapFrame | None
    #: The decoded request and response (``req`` is always there: exchanges are built from decoded
    #: requests; ``resp`` is None when no response came).
    req: Request
    resp: Response | None
    conn: str
    ts_ns: int
    api_key: int
    api_version: int
    #: Per-exchange results derived from the bodies, shared by the rules (keyed by the deriving helper).
    memo: dict[str, Any]
    #: When the exchange was last seen (its response's time, or its request's): what the engine records
    #: for every key it touches. ``Any`` on purpose: compiled (codec/native.py), an ``int`` attribute is
    #: unboxed and each read makes a new int object, one per key per exchange in the last-seen table.
    seen_ns: Any

    def __init__(
        self, request: TapFrame, response: TapFrame | None, envelope: TapFrame | None = None
    ) -> None:
        message = request.message
        if not isinstance(message, Request):
            raise TypeError("exchanges are only built from decoded requests")
        self.request = request
        self.response = response
        self.envelope = envelope
        self.req = message
        answer = response.message if response is not None else None
        self.resp = answer if isinstance(answer, Response) else None
        self.conn = request.conn
        self.ts_ns = request.ts_ns
        self.seen_ns = request.ts_ns if response is None else response.ts_ns
        self.api_key = message.api_key if request.api_key is None else request.api_key
        self.api_version = message.api_version if request.api_version is None else request.api_version
        self.memo = {}

    def __repr__(self) -> str:
        return f"Exchange(request={self.request!r}, response={self.response!r}, envelope={self.envelope!r})"

    def evidence(self) -> dict[str, Any]:
        request = self.request
        out: dict[str, Any] = {
            "conn": request.conn,
            "client": request.client,
            "broker": request.broker,
            "api_key": request.api_key,
            "api_version": request.api_version,
            "correlation_id": request.correlation_id,
        }
        response = self.response
        out["offsets"] = [request.at()] if response is None else [request.at(), response.at()]
        if self.envelope is not None:
            out["envelope"] = self.envelope.at()
        return out


@dataclass
class Finding:
    """One observation of a rule being broken (or of something worth knowing, at ``info``)."""

    rule: str
    severity: Severity
    subject: str
    summary: str
    ts_ns: int
    evidence: dict[str, Any] = field(default_factory=dict)
    #: The connection had a tap ``seq`` gap: the rule could not see everything, so this is not an alert.
    incomplete: bool = False

    @property
    def id(self) -> str:
        """Deterministic: the same frames produce the same id after any replay or restart."""
        anchor = self.evidence.get("offsets") or [[self.evidence.get("conn"), self.evidence.get("seq")]]
        key = f"{self.rule}|{self.subject}|{anchor[0]}"
        return hashlib.sha256(key.encode()).hexdigest()[:24]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "severity": self.severity.value,
            "subject": self.subject,
            "summary": self.summary,
            "ts_ns": self.ts_ns,
            "evidence": self.evidence,
            "incomplete": self.incomplete,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Finding:
        """A finding back from ``to_dict`` (its ``id`` is derived, so it is not read)."""
        return Finding(
            rule=data["rule"],
            severity=Severity(data["severity"]),
            subject=data["subject"],
            summary=data["summary"],
            ts_ns=int(data["ts_ns"]),
            evidence=data.get("evidence") or {},
            incomplete=bool(data.get("incomplete")),
        )
