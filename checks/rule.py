"""The interface every invariant implements, the context it reports through, and the pool its states
share equal values in (``SharedValues``).

A rule is a state machine per key (a connection, a group, a producer id, ...). It sees two kinds of
event, both in event-time order: a request when it was sent (``on_request``) and the same request with
its response when the response came (``on_response``). Keeping them apart is what makes "which epoch was
current when this write was *sent*" answerable even when the response arrives after a later fence.

Rule state is a plain ``dict`` of JSON-compatible values, so any store (memory, Spark's state store)
can keep it; rules never hold references to frames between calls.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Hashable
from dataclasses import dataclass, field, fields
from itertools import islice
from typing import Any, ClassVar, Generic, TypeVar

from mypy_extensions import mypyc_attr

from checks.alerts import ENVELOPE_INNER_PREFIX
from checks.model import Exchange, Finding, Severity
from checks.settings import ChecksSettings
from codec.taprecord import TapFrame, tap_loss_ns

State = dict[str, Any]
#: A (rule name, state key) pair: the key of the engine's state, last-seen and timer tables. Typed as a
#: tuple of any length on purpose: compiled (codec/native.py), a fixed-length tuple is an unboxed value
#: that becomes a new tuple object at each table store, so every table would hold its own copy of each
#: key (measured: 2 MiB more per 10k producers).
StateKey = tuple[str, ...]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SharedValues(Generic[K, V]):
    """Equal values that many keys' states hold, kept once: a client software label on every
    connection, a stream key ``epoch|topic|partition`` of every producer writing there, one group
    member's subscription. Rule state is per key, so without this each key holds its own copy; with
    10k producers or groups that is most of what the state costs (benchmarks/checks_bench.py).

    ``get(key, value)`` returns the value held for ``key``, or holds ``value`` for it the first time.
    Bounded: at ``limit`` values the pool starts afresh (states keep the values they hold; equal values
    made later are shared from then on). A shared value is held by many states at once, so it must
    never be mutated: rules replace it instead. It is plain data, so saved state is unchanged.
    """

    __slots__ = ("_values", "limit")

    def __init__(self, limit: int = 4096) -> None:
        self._values: dict[K, V] = {}
        self.limit = limit

    def get(self, key: K, value: V) -> V:
        values = self._values
        held = values.get(key)
        if held is None:
            if len(values) >= self.limit:
                values.clear()  # one call: safe if two threads fill the pool at once
            values[key] = held = value
        return held

    def share(self: SharedValues[K, K], value: K) -> K:
        """``value`` held once: the equal value held already, else ``value`` (strings, tuples)."""
        return self.get(value, value)

    def __len__(self) -> int:
        return len(self._values)


#: How long an idle key's state is kept, by key kind, read from ChecksSettings.
KEY_TTL_FIELDS = {
    "conn": "connection_ttl_seconds",
    "broker": "connection_ttl_seconds",
    "group": "group_ttl_seconds",
    "producer": "producer_ttl_seconds",
    "txn": "producer_ttl_seconds",
    "cluster": "producer_ttl_seconds",
}


@dataclass
class Stats:
    frames: int = 0
    exchanges: int = 0
    late_frames: int = 0
    unpaired_responses: int = 0
    decode_errors: int = 0
    header_only: int = 0
    gaps: int = 0
    evicted_keys: int = 0
    #: Entries dropped from a key's state to respect ``max_entries_per_key`` (never silent).
    evicted_entries: int = 0
    findings: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The counters by name (a compiled class has no ``__dict__`` for ``vars``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def iso_time(ts_ns: int) -> str:
    """A tap clock (ns) as UTC ISO 8601 to the millisecond."""
    seconds, ns = divmod(ts_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns // 1_000_000:03d}Z"


class Context:
    """What a rule may do besides changing its own state: report, set timers, note evictions."""

    def __init__(self, config: ChecksSettings) -> None:
        self.config = config
        self.stats = Stats()
        self.findings: list[Finding] = []
        self.resolved: list[tuple[str, str, int]] = []
        self.timers: dict[StateKey, int] = {}
        #: (deadline, rule, key) per ``set_timer`` call: the engine fires timers in deadline order
        #: without scanning ``timers``. May hold stale entries; ``timers`` is what counts.
        self.timer_heap: list[tuple[int, str, str]] = []
        #: The ``timers`` dict ``timer_heap`` was built for (the engine rebuilds the heap when restored
        #: state replaced it).
        self.timer_heap_for: dict[StateKey, int] | None = self.timers
        self.incomplete_conns: set[str] = set()

    def emit(
        self,
        rule: str,
        severity: Severity,
        subject: str,
        summary: str,
        ts_ns: int,
        evidence: dict[str, Any],
        conns: tuple[str, ...] = (),
        envelope: Exchange | None = None,
        tap_loss: tuple[str, int] | None = None,
        incomplete: bool = False,
    ) -> None:
        """Report a finding; one about an exchange unwrapped from ``envelope`` is prefixed as such.
        ``tap_loss`` (``RuleContext.tap_loss``): the frames the finding rests on may be missing because
        the tap lost records (the connection, and when): it is then incomplete and at most ``info``.
        ``incomplete``: judged so earlier (a finding reported after the frames it rests on)."""
        incomplete = incomplete or any(c in self.incomplete_conns for c in conns)
        if envelope is not None:
            rule = ENVELOPE_INNER_PREFIX + rule
            evidence = {**evidence, "envelope": envelope.evidence()}
        if tap_loss is not None:
            conn, at_ns = tap_loss
            summary += (
                f" (incomplete: the tap may have lost records at {iso_time(at_ns)}, before it saw this on "
                f"connection {conn}, so frames sent between may be missing from the tap topic: not "
                "evidence against the client or the broker)"
            )
            severity = Severity.INFO
            incomplete = True
            evidence = {**evidence, "tap_loss_ns": at_ns}
        elif incomplete and severity != Severity.INFO:
            summary += " (incomplete: the tap lost records of this connection)"
        finding = Finding(rule, severity, subject, summary, ts_ns, evidence, incomplete)
        self.findings.append(finding)
        self.stats.findings[rule] = self.stats.findings.get(rule, 0) + 1

    def resolve(self, rule: str, subject: str, ts_ns: int) -> None:
        """The condition behind (rule, subject) has cleared: alert hooks send a resolve."""
        self.resolved.append((rule, subject, ts_ns))

    def set_timer(self, rule: str, key: str, deadline_ns: int) -> None:
        """Call ``rule``'s ``on_timer`` for ``key`` once event time passes ``deadline_ns``."""
        self.timers[(rule, key)] = deadline_ns
        heapq.heappush(self.timer_heap, (deadline_ns, rule, key))

    def cancel_timer(self, rule: str, key: str) -> None:
        self.timers.pop((rule, key), None)

    def trim(self, container: dict[Any, Any] | list[Any]) -> None:
        """Keep a state container within ``max_entries_per_key``, dropping the oldest entries."""
        limit = self.config.max_entries_per_key
        excess = len(container) - limit
        if excess <= 0:
            return
        if isinstance(container, list):
            del container[:excess]
        else:
            # Only the oldest ``excess`` keys are listed: a container held at its bound trims one key
            # per insert, and listing them all made each insert cost the whole container.
            for key in list(islice(container, excess)):
                del container[key]
        self.stats.evicted_entries += excess


class RuleContext:
    """What one rule call may do, bound to the rule and key being called (and the Envelope the exchange
    was unwrapped from): report, set or cancel this key's timer, keep its state bounded. The engine
    makes one per call, so nothing about the call lives in shared mutable fields."""

    __slots__ = ("engine", "envelope", "key", "rule")

    def __init__(self, engine: Context, rule: str, key: str, envelope: Exchange | None = None) -> None:
        self.engine = engine
        self.rule = rule
        self.key = key
        self.envelope = envelope

    @property
    def config(self) -> ChecksSettings:
        return self.engine.config

    def emit(
        self,
        rule: str,
        severity: Severity,
        subject: str,
        summary: str,
        ts_ns: int,
        evidence: dict[str, Any],
        conns: tuple[str, ...] = (),
        tap_loss: tuple[str, int] | None = None,
        incomplete: bool = False,
    ) -> None:
        self.engine.emit(
            rule, severity, subject, summary, ts_ns, evidence, conns, self.envelope, tap_loss, incomplete
        )

    def incomplete(self, conns: tuple[str, ...]) -> bool:
        """Whether a finding about ``conns`` would be incomplete now (the tap counted losses on one)."""
        return any(c in self.engine.incomplete_conns for c in conns)

    @staticmethod
    def tap_loss(frame: TapFrame, since_ns: int) -> tuple[str, int] | None:
        """(``frame``'s connection, when) if its tap may have lost records after ``since_ns`` and before
        it wrote ``frame`` (``codec.taprecord.tap_loss_ns``): a finding that rests on frames sent since
        then on another connection is then incomplete (``emit``'s ``tap_loss``). None when no such
        loss is known."""
        at = tap_loss_ns(frame)
        return (frame.conn, at) if at > since_ns else None

    def resolve(self, rule: str, subject: str, ts_ns: int) -> None:
        """The condition behind (rule, subject) has cleared: alert hooks send a resolve."""
        self.engine.resolve(rule, subject, ts_ns)

    def set_timer(self, deadline_ns: int) -> None:
        """Call this rule's ``on_timer`` for this key once event time passes ``deadline_ns``."""
        self.engine.set_timer(self.rule, self.key, deadline_ns)

    def cancel_timer(self) -> None:
        self.engine.cancel_timer(self.rule, self.key)

    def trim(self, container: dict[Any, Any] | list[Any]) -> None:
        """Keep a state container within ``max_entries_per_key``, dropping the oldest entries."""
        engine = self.engine
        if len(container) > engine.config.max_entries_per_key:
            engine.trim(container)


# Compiled (codec.native), a class is closed to interpreted subclasses unless it says so: tests and
# plug-in rules subclass this one.
@mypyc_attr(allow_interpreted_subclasses=True)
class Rule:
    """Base class: override ``keys`` and the hooks you need."""

    #: Namespace of this rule's state and the prefix of its findings' rule ids.
    name: ClassVar[str]
    #: One of KEY_TTL_FIELDS: decides how long idle state lives.
    key_kind: ClassVar[str]
    #: API keys this rule looks at; None means every API.
    api_keys: ClassVar[frozenset[int] | None] = None
    #: Also call ``on_request`` for a request whose body did not decode or was not mirrored (header-only
    #: capture): ``ex.req`` then holds the request header's api key, version, correlation id and client
    #: id with an empty body, and ``ex.request.error`` / ``ex.request.raw`` say why. For rules that judge
    #: facts of the header alone (version coverage). Such requests never get ``on_response``.
    judges_headers: ClassVar[bool] = False

    def keys(self, ex: Exchange) -> list[str]:
        raise NotImplementedError

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        """``ex.response`` is None here: the request as it was sent."""

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        """The request with its response (``ex.response`` None when no response can come)."""

    def on_quiet(self, state: State, hook: str, seq: int, api: tuple[int, int, int]) -> bool:
        """An exchange of its connection that this connection-scoped rule's transitions do not name
        whole (``checks.projections.Transitions.headers``), known by its request's ``seq`` and ``api``
        (key, version, correlation id): if ``hook`` would change no more of ``state`` than this method
        does and report nothing, do that and return True; otherwise change nothing and return False
        (the engine then makes the header-level exchange and calls the hook)."""
        return False

    def summary_applies(self, state: State, key: str, kind: str, facts: Any, ctx: RuleContext) -> bool:
        """Whether a summary of ``kind`` (``checks.summaries``), applied to ``state`` now, would leave it
        exactly as the exchanges it stands for would, reporting nothing (``ctx``: the settings its bounds
        come from). Only rules that declare the kind (``checks.projections.Transitions.summaries``) are
        asked; changes nothing."""
        return False

    def on_summary(self, state: State, key: str, kind: str, facts: Any, ctx: RuleContext) -> None:
        """Apply a summary ``summary_applies`` accepted: what the exchanges it stands for would do."""
        raise NotImplementedError

    def on_timer(self, state: State, key: str, now_ns: int, ctx: RuleContext) -> None:
        """A deadline set with ``ctx.set_timer`` has passed in event time."""

    def on_close(self, state: State, key: str, conn: str, ts_ns: int, ctx: RuleContext) -> bool:
        """A connection closed. Return True to drop this key's state (connection-scoped rules)."""
        return self.key_kind == "conn" and key == conn
