"""``kpmon stack`` wiring that needs no JVM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kpmon.cli import main


def test_help_lists_the_actions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["stack", "up", "--help"])
    out = capsys.readouterr().out
    assert "--brokers" in out and "--sasl" in out and "--kafka-version" in out


def test_status_of_an_absent_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stack", "status", "--home", str(tmp_path), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["state"] == "absent"


def test_down_without_a_stack_is_harmless(tmp_path: Path) -> None:
    assert main(["stack", "down", "--home", str(tmp_path)]) == 0


def test_bad_broker_count_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["stack", "up", "--home", str(tmp_path), "--brokers", "2"])
