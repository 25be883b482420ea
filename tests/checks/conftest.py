"""Fixtures of the checks tests that drive real clients through the real tap."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from checks.model import Exchange
from checks.projections import ANSWER_KEYED, covers, rule_tree
from checks.rule import Rule
from codec.protocol import ApiKey
from tests.checks.recording import Reads, exists, recording_exchange
from tests.checks.tapped import ScenarioTap
from tests.tap.harness import TappedCluster


@pytest.fixture(scope="module")
def scenarios(tapped_cluster: TappedCluster) -> Iterator[ScenarioTap]:
    """One tap and tap topic per test module, in front of the session's tapped broker."""
    tap = ScenarioTap(tapped_cluster)
    try:
        yield tap
    finally:
        tap.stop()


@pytest.fixture(autouse=True)
def keyed_rules_read_only_what_they_declare(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every keyed rule, in every test here, reads bodies that record each field read; a read outside
    the rule's declaration in checks/projections.py fails the test (stage two would not have it). So
    does a key that only an answer reveals (``ANSWER_KEYED``): stage one routes a response where its
    request went, plus the keys of the rules declared there."""
    from checks.engine import Monitor
    from checks.rules import all_rules

    reads: dict[str, Reads] = {}
    answer_keys: set[str] = set()
    call = Monitor._call

    def recording_call(self: Monitor, rule: Rule, key: str, hook: str, ex: Exchange, envelope: Any) -> None:
        if rule.key_kind != "conn":
            ex = recording_exchange(ex, reads.setdefault(rule.name, Reads()))
        call(self, rule, key, hook, ex, envelope)

    monkeypatch.setattr(Monitor, "_call", recording_call)
    for rule in all_rules():
        cls = type(rule)
        if rule.key_kind == "conn":
            continue

        def recording_keys(self: Rule, ex: Exchange, _keys: Any = cls.keys) -> list[str]:
            recorded = reads.setdefault(self.name, Reads())
            keys = list(_keys(self, recording_exchange(ex, recorded)))
            if ex.response is not None and ex.api_key not in ANSWER_KEYED.get(self.name, ()):
                asked = _keys(self, recording_exchange(Exchange(ex.request, None, ex.envelope), recorded))
                answer_keys.update(
                    f"{self.name} keys api {ex.api_key} by its answer: {k}" for k in keys if k not in asked
                )
            return keys

        monkeypatch.setattr(cls, "keys", recording_keys)
    yield
    undeclared = sorted(
        f"{rule} reads {ApiKey(api_key).name} {side} field {path}"
        for rule, recorded in reads.items()
        for (api_key, side), paths in recorded.paths.items()
        for path in paths
        if exists(api_key, side, path) and not covers(rule_tree(rule, api_key, side == "response"), path)
    )
    assert not undeclared, "fields read but not declared in checks/projections.py:\n" + "\n".join(undeclared)
    assert not answer_keys, "keys only an answer reveals, not in ANSWER_KEYED:\n" + "\n".join(
        sorted(answer_keys)
    )
