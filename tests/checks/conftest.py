"""Fixtures of the checks tests that drive real clients through the real tap."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
