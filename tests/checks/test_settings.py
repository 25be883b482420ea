"""The checks own their settings: a frozen value, defaults in one place, no import of the app's config."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from checks.settings import DEFAULTS, ChecksSettings
from kpconfig.model import ChecksConfig, KpmonConfig

CHECKS = Path(__file__).resolve().parents[2] / "checks"


def test_checks_never_import_the_application_config() -> None:
    offenders = []
    for path in sorted(CHECKS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{path.name}: {n}" for n in names if n == "kpmon" or n.startswith("kpmon.")]
    assert offenders == []


def test_the_config_section_defaults_are_the_settings_defaults() -> None:
    assert ChecksConfig().settings() == DEFAULTS == ChecksSettings()


def test_the_config_section_becomes_settings() -> None:
    config = KpmonConfig.model_validate(
        {
            "checks": {
                "watermark_seconds": 3,
                "broker_client_addresses": ["10.0.0.7"],
                "max_entries_per_key": 5,
            }
        }
    )
    settings = config.checks.settings()
    assert settings.watermark_seconds == 3.0 and settings.max_entries_per_key == 5
    assert settings.broker_client_addresses == ("10.0.0.7",)
    assert {f.name for f in dataclasses.fields(ChecksSettings)} == set(ChecksConfig.model_fields)


def test_settings_are_frozen_and_checked() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.watermark_seconds = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_entries_per_key"):
        ChecksSettings(max_entries_per_key=0)
    assert ChecksSettings(broker_listeners=["A"]).broker_listeners == ("A",)  # type: ignore[arg-type]
