"""Fixtures for the hook tests: loopback HTTP receivers and AlertHooks that are always closed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kpconfig.model import KpmonConfig
from streaming.hooks import AlertHooks
from tests.streaming.hooks.receiver import Receiver

#: Small backoff and timeouts keep failure tests to a fraction of a second.
FAST: dict[str, Any] = {
    "min_severity": "info",
    "backoff_initial_seconds": 0.02,
    "backoff_max_seconds": 0.2,
    "timeout_seconds": 2.0,
}


def hooks_config(*hooks: dict[str, Any], **top: Any) -> KpmonConfig:
    return KpmonConfig.model_validate({**top, "alerts": {"hooks": [{**FAST, **hook} for hook in hooks]}})


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def make(**kwargs: Any) -> Receiver:
        receiver = Receiver(**kwargs)
        started.append(receiver)
        return receiver

    yield make
    for receiver in started:
        receiver.stop()


@pytest.fixture
def make_hooks(tmp_path: Path) -> Iterator[Callable[..., AlertHooks]]:
    opened: list[AlertHooks] = []

    def make(config: KpmonConfig, spool_dir: Path | None = None) -> AlertHooks:
        hooks = AlertHooks(config, spool_dir or tmp_path / "spool")
        opened.append(hooks)
        return hooks

    yield make
    for hooks in opened:
        hooks.close(0.5)
