"""Sans-I/O protocol invariant checkers: per-key state machines fed decoded frames in event-time order."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from codec.native import attach

# The compiled cores, when built and current, are found first (before any submodule is imported).
attach(__name__, __path__)

if TYPE_CHECKING:
    from checks.engine import Monitor
    from checks.model import Exchange, Finding, Severity
    from checks.rule import Context, Rule, Stats
    from checks.rules import all_rules
    from checks.settings import ChecksSettings
    from codec.taprecord import TapFrame

#: The package's names and the modules that define them. They are imported on first use, not with the
#: package: the config model imports ``checks.settings`` and ``checks.alerts`` (and so the tap does),
#: and that must not load the engine and the rule catalogue too.
_EXPORTS = {
    "ChecksSettings": "checks.settings",
    "Context": "checks.rule",
    "Exchange": "checks.model",
    "Finding": "checks.model",
    "Monitor": "checks.engine",
    "Rule": "checks.rule",
    "Severity": "checks.model",
    "Stats": "checks.rule",
    "TapFrame": "codec.taprecord",
    "all_rules": "checks.rules",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def new_monitor(settings: ChecksSettings | None = None) -> Monitor:
    """A monitor running the whole catalogue."""
    from checks.engine import Monitor
    from checks.rule import Context
    from checks.rules import all_rules
    from checks.settings import ChecksSettings

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
