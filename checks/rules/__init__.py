"""The invariant catalogue (ARCHITECTURE.md), one module per family."""

from __future__ import annotations

from codec.native import attach

# The compiled cores, when built and current, are found first (before any submodule is imported).
attach(__name__, __path__)

from checks.rule import Rule


def all_rules() -> list[Rule]:
    """A fresh instance of every rule, in a fixed order (findings order depends on it)."""
    rules: list[Rule] = []
    for module_name in ("apiversions", "groups", "producers", "transactions", "flexible", "envelope"):
        try:
            module = __import__(f"checks.rules.{module_name}", fromlist=["RULES"])
        except ModuleNotFoundError as exc:
            if exc.name != f"checks.rules.{module_name}":
                raise
            continue
        rules.extend(cls() for cls in module.RULES)
    return rules
