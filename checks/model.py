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


@dataclass
class Exchange:
    """A request with its response (None when none came: acks=0 produce, or the connection closed)."""

    request: TapFrame
    response: TapFrame | None
    #: Set when this exchange was unwrapped from an Envelope (KIP-590): rules prefix their ids.
    envelope: TapFrame | None = None

    @property
    def conn(self) -> str:
        return self.request.conn

    @property
    def ts_ns(self) -> int:
        return self.request.ts_ns

    @property
    def api_key(self) -> int:
        assert self.request.api_key is not None
        return self.request.api_key

    @property
    def api_version(self) -> int:
        assert self.request.api_version is not None
        return self.request.api_version

    @property
    def req(self) -> Request:
        message = self.request.request
        assert message is not None, "exchanges are only built from decoded requests"
        return message

    @property
    def resp(self) -> Response | None:
        return self.response.response if self.response is not None else None

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "conn": self.request.conn,
            "client": self.request.client,
            "broker": self.request.broker,
            "api_key": self.request.api_key,
            "api_version": self.request.api_version,
            "correlation_id": self.request.correlation_id,
        }
        frames = [self.request] + ([self.response] if self.response is not None else [])
        out["offsets"] = [[f.partition, f.offset] for f in frames]
        if self.envelope is not None:
            out["envelope"] = [self.envelope.partition, self.envelope.offset]
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
