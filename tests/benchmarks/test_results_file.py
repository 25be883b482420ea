"""Every results file says whether its run used the compiled cores, and a run during which they went out
of use (a source edited mid-run: the processes started after it run plain Python) is not written as the
compiled build's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import results_file
from codec import native


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A manifest of a build of the current sources for this interpreter, in a scratch build dir."""
    manifest = {
        "abi": native.abi_tag(),
        "group": "group.so",
        "modules": {path: native.source_digest(path) for path in native.MODULES},
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    monkeypatch.setattr(native, "MANIFEST", path)
    monkeypatch.delenv(native.ENV, raising=False)
    return manifest


def test_a_machine_record_says_the_compiled_cores_are_used(built: dict[str, Any]) -> None:
    assert results_file.machine()["compiled_cores"] == {"used": True, "why": "compiled"}
    assert results_file.cores_changed(results_file.compiled_cores()) is None


def test_a_source_edited_during_the_run_keeps_its_figures_from_being_written(
    built: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    at_start = results_file.compiled_cores()
    edited = native.MODULES[0]
    digest = native.source_digest
    monkeypatch.setattr(native, "source_digest", lambda path: "edited" if path == edited else digest(path))
    changed = results_file.cores_changed(at_start)
    assert changed is not None
    assert edited in changed and "plain Python" in changed and "kpmon deploy native" in changed
    now = results_file.compiled_cores()
    assert now["used"] is False and "out of date" in now["why"]


def test_a_run_that_never_used_the_compiled_cores_says_so_and_is_written(
    built: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(native.ENV, "0")
    at_start = results_file.compiled_cores()
    assert at_start == {"used": False, "why": f"{native.ENV}=0"}
    # Plain Python from the start is a figure of plain Python, recorded as one: nothing changed mid-run.
    assert results_file.cores_changed(at_start) is None
