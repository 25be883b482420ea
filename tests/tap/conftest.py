"""Tap tests run against the session fixture ``tapped_cluster`` (tests/conftest.py).

``TappedCluster``, ``free_port`` and ``start_stack`` live in tests/tap/harness.py (tests in other
packages need them too); they are re-exported here for the tap tests that import them from this module.
"""

from __future__ import annotations

from tests.tap.harness import TappedCluster, free_port, start_stack

__all__ = ["TappedCluster", "free_port", "start_stack"]
