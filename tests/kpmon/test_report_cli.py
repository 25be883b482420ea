"""``kpmon report --json`` and ``--fail-on``: the CI gate, over synthetic captures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kpmon.cli import main
from kpmon.commands.report import EXIT_CONFIG, EXIT_ERROR, EXIT_FINDINGS, EXIT_OK
from tests.checks.builders import SECOND, Conversation
from tests.checks.test_apiversions import handshake, metadata
from tests.checks.test_report import record_of, write_capture


@pytest.fixture(autouse=True)
def _no_env_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("KPMON__"):
            monkeypatch.delenv(name)


def capture_of(path: Path, handshake_first: bool = True) -> None:
    """One client's capture: handshake then Metadata (clean), or Metadata first (one info finding)."""
    conv = Conversation(client_id="clean-app")
    frames = [conv.open(0)]
    if handshake_first:
        frames += handshake(conv, SECOND)
    frames += metadata(conv, 12, 2 * SECOND)
    if not handshake_first:
        frames += handshake(conv, 3 * SECOND)
    path.write_text("".join(record_of(f) + "\n" for f in frames), encoding="utf-8")


def report(tmp_path: Path, capture: Path, *extra: str) -> int:
    return main(["report", "--capture", str(capture), "--out", str(tmp_path / "r.html"), *extra])


def test_json_to_stdout_holds_findings_and_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "tap.jsonl"
    write_capture(capture)
    assert report(tmp_path, capture, "--json", "-") == EXIT_OK
    out, err = capsys.readouterr()
    doc = json.loads(out)  # stdout is JSON only; the text summary went to stderr
    assert "findings:" in err and (tmp_path / "r.html").is_file()
    assert doc["schema"] == 1 and doc["source"] == f"capture {capture}"
    summary = doc["summary"]
    assert summary["findings"] == len(doc["findings"]) > 0
    assert summary["highest_severity"] == "critical"
    assert {"rule": "envelope.untrusted_source", "severity": "critical", "count": 1} in summary["by_rule"]
    assert sum(r["count"] for r in summary["by_rule"]) == summary["findings"]
    assert [(g["group"], g["protocol"]) for g in summary["groups"]] == [("g1", "classic")]
    assert [p["producer_id"] for p in summary["producers"]] == [4000]
    assert {"software": "kafka-python/2.6.0", "api": "Fetch", "version": 3} in summary["not_ready_for_4_0"]
    first = doc["findings"][0]
    assert set(first) >= {"id", "rule", "severity", "subject", "summary", "ts_ns", "evidence", "incomplete"}
    assert doc["stats"]["frames"] > 0 and "fail_on" not in doc


@pytest.mark.parametrize(
    ("threshold", "expected"),
    [("critical", EXIT_FINDINGS), ("warning", EXIT_FINDINGS), ("info", EXIT_FINDINGS)],
)
def test_fail_on_exits_3_when_a_finding_reaches_the_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], threshold: str, expected: int
) -> None:
    capture = tmp_path / "tap.jsonl"
    write_capture(capture)
    path = tmp_path / "findings.json"
    assert report(tmp_path, capture, "--fail-on", threshold, "--json", str(path)) == expected
    assert f"at or above {threshold}" in capsys.readouterr().err
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["fail_on"]["severity"] == threshold and doc["fail_on"]["failing"] > 0


def test_fail_on_passes_clean_traffic_and_counts_only_what_reaches_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "clean.jsonl"
    capture_of(capture)
    assert report(tmp_path, capture, "--fail-on", "info") == EXIT_OK
    # One info finding (no_handshake) only: it fails the strictest gate, not a warning gate.
    capture_of(capture, handshake_first=False)
    assert report(tmp_path, capture, "--fail-on", "warning") == EXIT_OK
    assert report(tmp_path, capture, "--fail-on", "info") == EXIT_FINDINGS
    capsys.readouterr()


def test_exit_codes_for_bad_input_usage_and_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n", encoding="utf-8")
    assert report(tmp_path, bad, "--fail-on", "warning") == EXIT_ERROR
    clean = tmp_path / "clean.jsonl"
    capture_of(clean)
    assert report(tmp_path, clean, "--json", str(tmp_path / "missing-dir" / "x.json")) == EXIT_ERROR
    with pytest.raises(SystemExit) as usage:
        report(tmp_path, clean, "--fail-on", "fatal")
    assert usage.value.code == EXIT_CONFIG == 2
    capsys.readouterr()
