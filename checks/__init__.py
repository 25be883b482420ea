"""Sans-I/O protocol invariant checkers: per-key state machines fed decoded frames in event-time order."""

from codec.native import attach

# The compiled cores, when built and current, are found first (before any submodule is imported).
attach(__name__, __path__)

from checks.engine import Monitor
from checks.model import Exchange, Finding, Severity
from checks.rule import Context, Rule, Stats
from checks.rules import all_rules
from checks.settings import ChecksSettings
from codec.taprecord import TapFrame


def new_monitor(settings: ChecksSettings | None = None) -> Monitor:
    """A monitor running the whole catalogue."""
    return Monitor(all_rules(), Context(settings or ChecksSettings()))


__all__ = [
    "ChecksSettings",
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
