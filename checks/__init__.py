"""Sans-I/O protocol invariant checkers: per-key state machines fed decoded frames in event-time order."""

from checks.engine import Monitor
from checks.model import Exchange, Finding, Severity
from checks.rule import Context, Rule, Stats
from checks.rules import all_rules
from codec.taprecord import TapFrame
from kpmon.config import ChecksConfig


def new_monitor(config: ChecksConfig | None = None) -> Monitor:
    """A monitor running the whole catalogue."""
    return Monitor(all_rules(), Context(config or ChecksConfig()))


__all__ = [
    "ChecksConfig",
    "Context",
    "Exchange",
    "Finding",
    "Monitor",
    "Rule",
    "Severity",
    "Stats",
    "TapFrame",
    "all_rules",
    "new_monitor",
]
