"""The data-quality gate (streaming/quality.py): every expectation passing and failing, Data Docs, ids.

Findings come from the real checkers fed frames built through the real codec (tests/checks), so the
suites are exercised on what the job will hand them, not on invented rows, wherever a rule exists.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from checks.model import Finding, Severity
from kpconfig.model import KpmonConfig, QualityConfig, load_config
from streaming.quality import QualityGate, QualityInputError, QualityResult
from streaming.quality_suites import CATALOGUE_RULES, CHECKS, SUITES, known_rules
from tests.checks import test_apiversions as apiv
from tests.checks import test_producers as prod
from tests.checks.builders import SECOND, Conversation

FINDING_COLUMNS = ["id", "rule", "severity", "subject", "summary", "ts_ns", "incomplete"]


# -- inputs ----------------------------------------------------------------------------------------


def clean_agg() -> pd.DataFrame:
    """A plausible batch: a handshake, a rebalance, produce traffic, one undecodable frame (0.2 %)."""
    rows = [
        ("req", 18, "ApiVersions", 3, 4, 0, 0, 0),
        ("resp", 18, "ApiVersions", 3, 4, 0, 0, 0),
        ("req", 11, "JoinGroup", 9, 6, 0, 0, 0),
        ("resp", 11, "JoinGroup", 9, 6, 0, 0, 2),
        ("req", 14, "SyncGroup", 5, 6, 0, 0, 0),
        ("resp", 14, "SyncGroup", 5, 6, 0, 0, 0),
        ("req", 0, "Produce", 11, 220, 0, 0, 0),
        ("resp", 0, "Produce", 11, 220, 0, 0, 0),
        ("req", 1, "Fetch", 17, 40, 0, 0, 0),
        ("resp", 1, "Fetch", 17, 40, 0, 0, 1),
        # The codec could not even read the header: no key, no version.
        ("req", None, None, None, 1, 1, 0, 0),
    ]
    frame = pd.DataFrame(
        rows,
        columns=[
            "dir",
            "api_key",
            "api_name",
            "api_version",
            "frames",
            "decode_errors",
            "null_protocol_type",
            "error_responses",
        ],
    )
    return frame.astype({"api_key": "Int64", "api_version": "Int64"})


def as_frame(findings: list[Finding]) -> pd.DataFrame:
    rows = [{k: v for k, v in f.to_dict().items() if k in FINDING_COLUMNS} for f in findings]
    return pd.DataFrame(rows, columns=FINDING_COLUMNS).astype({"ts_ns": "int64", "incomplete": "bool"})


def no_findings() -> pd.DataFrame:
    return as_frame([])


def stale_epoch_accepted() -> list[Finding]:
    zombie, fencer = prod.two_clients()
    frames = [*prod.init_pid(zombie, 0, epoch=3), *prod.init_pid(fencer, 2 * SECOND, epoch=4)]
    frames += prod.write(zombie, 3 * SECOND, epoch=3, seq=0, error=0, offset=77)
    return prod.run(frames)


def stale_epoch_rejected() -> list[Finding]:
    zombie, fencer = prod.two_clients()
    frames = [*prod.init_pid(zombie, 0, epoch=0), *prod.init_pid(fencer, 2 * SECOND, epoch=1)]
    frames += prod.write(zombie, 3 * SECOND, epoch=0, seq=1, error=prod.FENCED)
    return prod.run(frames)


def out_of_range() -> list[Finding]:
    conv = Conversation()
    frames = [
        conv.open(0),
        *apiv.handshake(conv, 1 * SECOND, {**apiv.STANDARD, "Metadata": (0, 9)}),
        *apiv.metadata(conv, 12, 2 * SECOND),
    ]
    findings, _ = apiv.run(frames)
    return findings


def no_handshake() -> list[Finding]:
    conv = Conversation()
    findings, _ = apiv.run([conv.open(0), *apiv.metadata(conv, 12, SECOND)])
    return findings


@pytest.fixture(scope="module")
def real_findings() -> dict[str, list[Finding]]:
    made = {
        "accepted": stale_epoch_accepted(),
        "rejected": stale_epoch_rejected(),
        "out_of_range": out_of_range(),
        "no_handshake": no_handshake(),
    }
    expected = {
        "accepted": "producer.stale_epoch_accepted",
        "rejected": "producer.stale_epoch_rejected",
        "out_of_range": "apiversions.out_of_range",
        "no_handshake": "apiversions.no_handshake",
    }
    for name, rule in expected.items():
        assert [f.rule for f in made[name]] == [rule], name
    return made


@pytest.fixture(scope="module")
def gate() -> QualityGate:
    return QualityGate(QualityConfig(), None)


def failed(result: QualityResult) -> set[str]:
    return {f.rule for f in result.findings}


# -- passing ---------------------------------------------------------------------------------------


def test_clean_batch_passes_every_expectation(
    gate: QualityGate, real_findings: dict[str, list[Finding]]
) -> None:
    # Findings that are not failures of any invariant the suites guard: a fenced zombie (the broker
    # did its job) and an info-level missing handshake.
    benign = as_frame(real_findings["rejected"] + real_findings["no_handshake"])
    result = gate.validate(1, clean_agg(), benign)
    assert result.success and result.findings == []
    for suite in SUITES:
        stats = result.statistics[suite]
        assert stats["skipped"] is False
        assert stats["unsuccessful"] == 0 and stats["errors"] == 0
        assert stats["evaluated"] == stats["successful"] == sum(c.suite == suite for c in CHECKS)
    assert sorted(result.passed) == sorted((c.rule, c.suite) for c in CHECKS)


# -- failing, one expectation at a time -----------------------------------------------------------


def _set(frame: pd.DataFrame, api: str, direction: str, **values: Any) -> pd.DataFrame:
    frame = frame.copy()
    mask = (frame["api_name"] == api) & (frame["dir"] == direction)
    assert mask.sum() == 1
    for column, value in values.items():
        frame.loc[mask, column] = value
    return frame


def _finding(findings: list[Finding], **changes: Any) -> pd.DataFrame:
    return as_frame([replace(f, **changes) for f in findings])


AggCase = Callable[[], pd.DataFrame]
FindingsCase = Callable[[dict[str, list[Finding]]], pd.DataFrame]

#: (expected failing rule, frames_agg builder, findings builder, config overrides)
FAILING: list[tuple[str, AggCase, FindingsCase, dict[str, Any]]] = [
    (
        "quality.protocol_type_not_null",
        lambda: _set(clean_agg(), "JoinGroup", "resp", null_protocol_type=1),
        lambda _: no_findings(),
        {},
    ),
    (
        "quality.direction_known",
        lambda: _set(clean_agg(), "Fetch", "req", dir="open"),
        lambda _: no_findings(),
        {},
    ),
    (
        "quality.counts_consistent",
        lambda: _set(clean_agg(), "Fetch", "req", decode_errors=41),
        lambda _: no_findings(),
        # 41 errors in 553 frames would also trip the rate; this case is about the counts alone.
        {"max_decode_error_rate": 1.0},
    ),
    (
        "quality.decode_error_rate",
        lambda: _set(clean_agg(), "Produce", "req", decode_errors=6),
        lambda _: no_findings(),
        {},
    ),
    (
        "quality.error_response_rate",
        lambda: _set(clean_agg(), "Produce", "resp", error_responses=200),
        lambda _: no_findings(),
        {},
    ),
    (
        "quality.api_versions_in_range",
        clean_agg,
        lambda real: as_frame(real["out_of_range"]),
        {},
    ),
    (
        "quality.api_versions_in_range",
        clean_agg,
        lambda real: _finding(real["out_of_range"], rule="envelope.inner_apiversions.out_of_range"),
        {},
    ),
    (
        "quality.no_stale_epoch_accepted",
        clean_agg,
        lambda real: as_frame(real["accepted"] + real["rejected"]),
        {},
    ),
    (
        "quality.severity_known",
        clean_agg,
        lambda real: as_frame(real["rejected"]).assign(severity="fatal"),
        {},
    ),
    (
        "quality.rule_known",
        clean_agg,
        lambda real: _finding(real["rejected"], rule="producer.epoch_vibes"),
        {},
    ),
    (
        "quality.finding_id_format",
        clean_agg,
        lambda real: as_frame(real["rejected"]).assign(id="not-an-id"),
        {},
    ),
]


@pytest.mark.parametrize(("rule", "agg", "findings", "overrides"), FAILING, ids=[c[0] for c in FAILING])
def test_each_expectation_fails_alone(
    rule: str,
    agg: AggCase,
    findings: FindingsCase,
    overrides: dict[str, Any],
    gate: QualityGate,
    real_findings: dict[str, list[Finding]],
) -> None:
    checker = QualityGate(QualityConfig(**overrides), None) if overrides else gate
    result = checker.validate(7, agg(), findings(real_findings))
    assert not result.success
    assert failed(result) == {rule}
    assert (rule, result.findings[0].subject) not in result.passed
    finding = result.findings[0]
    check = next(c for c in CHECKS if c.rule == rule)
    assert finding.severity == check.severity and finding.subject == check.suite
    assert finding.evidence["conn"] == "quality" and finding.evidence["seq"] == 7
    assert finding.evidence["unexpected"], "a failure names what was unexpected"
    assert finding.summary.startswith("batch 7 failed: ")
    json.dumps(finding.to_dict())
    assert sum(s["unsuccessful"] for k, s in result.statistics.items() if k in SUITES) == 1


def test_every_expectation_has_a_failing_case() -> None:
    assert {c[0] for c in FAILING} == {c.rule for c in CHECKS}


def test_stale_epoch_evidence_names_the_alerting_finding(
    gate: QualityGate, real_findings: dict[str, list[Finding]]
) -> None:
    accepted = real_findings["accepted"][0]
    result = gate.validate(3, clean_agg(), as_frame(real_findings["accepted"] + real_findings["rejected"]))
    (finding,) = result.findings
    assert finding.severity == Severity.CRITICAL
    assert [row["id"] for row in finding.evidence["unexpected"]] == [accepted.id]
    assert finding.evidence["unexpected_count"] == 1


def test_findings_that_do_not_alert_do_not_fail(
    gate: QualityGate, real_findings: dict[str, list[Finding]]
) -> None:
    # A tap loss makes a finding incomplete (not an alert); out_of_range at info is below alerting.
    incomplete = _finding(real_findings["accepted"] + real_findings["out_of_range"], incomplete=True)
    assert gate.validate(4, clean_agg(), incomplete).success
    info = _finding(real_findings["out_of_range"], severity=Severity.INFO)
    assert gate.validate(5, clean_agg(), info).success


def test_rates_at_the_threshold_pass_and_small_batches_are_not_judged() -> None:
    gate = QualityGate(QualityConfig(max_decode_error_rate=0.01, min_frames_for_rates=100), None)
    agg = _set(clean_agg(), "Produce", "req", decode_errors=5)  # 6 of 553 frames: 1.08 %
    assert failed(gate.validate(1, agg, no_findings())) == {"quality.decode_error_rate"}
    at_limit = _set(clean_agg(), "Produce", "req", frames=599, decode_errors=5)  # 6 of 600: 1 %
    assert gate.validate(2, at_limit, no_findings()).success
    tiny = pd.DataFrame(
        [("req", None, None, None, 3, 3, 0, 0), ("resp", 3, "Metadata", 12, 2, 0, 0, 2)],
        columns=clean_agg().columns,
    ).astype({"api_key": "Int64", "api_version": "Int64"})
    result = gate.validate(3, tiny, no_findings())
    assert result.success, "5 frames, all broken, are not a rate worth alerting on"
    assert result.statistics["kpmon.batch"]["evaluated"] == 2


# -- empty batches, bad inputs, GX errors ----------------------------------------------------------


def test_empty_batch_validates_cleanly_without_gx(gate: QualityGate) -> None:
    result = gate.validate(11, clean_agg().iloc[0:0], no_findings())
    assert result.success and result.findings == [] and result.passed == []
    assert all(result.statistics[s]["skipped"] and result.statistics[s]["evaluated"] == 0 for s in SUITES)


def test_empty_frames_of_any_dtype_are_fine(gate: QualityGate) -> None:
    # pd.DataFrame([], columns=...) is how an empty batch's inputs are often built: object columns.
    agg = pd.DataFrame([], columns=clean_agg().columns)
    findings = pd.DataFrame([], columns=FINDING_COLUMNS)
    assert gate.validate(15, agg, findings).success


def test_findings_without_frames_are_still_validated(
    gate: QualityGate, real_findings: dict[str, list[Finding]]
) -> None:
    # A timer (txn.hanging) can fire in a batch that carried no frames.
    result = gate.validate(12, clean_agg().iloc[0:0], as_frame(real_findings["accepted"]))
    assert failed(result) == {"quality.no_stale_epoch_accepted"}
    assert result.statistics["kpmon.frames"]["skipped"] and result.statistics["kpmon.batch"]["skipped"]


def test_missing_columns_are_a_typed_error(gate: QualityGate) -> None:
    with pytest.raises(QualityInputError, match="null_protocol_type"):
        gate.validate(1, clean_agg().drop(columns=["null_protocol_type"]), no_findings())
    with pytest.raises(QualityInputError, match="incomplete"):
        gate.validate(1, clean_agg(), no_findings().drop(columns=["incomplete"]))


def test_non_numeric_counts_are_a_typed_error(gate: QualityGate) -> None:
    broken = clean_agg().astype({"decode_errors": "object"})
    broken.loc[0, "decode_errors"] = "many"
    with pytest.raises(QualityInputError, match="decode_errors"):
        gate.validate(1, broken, no_findings())


def test_an_expectation_gx_cannot_evaluate_is_reported_not_raised(gate: QualityGate) -> None:
    # pandas' NA in a nullable count makes the pair comparison raise inside GX; the stream must go on.
    agg = clean_agg().astype({"frames": "Int64", "decode_errors": "Int64"})
    agg.loc[2, "frames"] = pd.NA
    result = gate.validate(13, agg, no_findings())
    assert not result.success
    assert failed(result) == {"quality.counts_consistent"}
    stats = result.statistics["kpmon.frames"]
    assert stats["errors"] == 1 and stats["evaluated"] == 3 and stats["successful"] == 2
    (finding,) = result.findings
    assert "could not be checked" in finding.summary and "NA" in finding.evidence["error"]


def test_no_progress_bars(gate: QualityGate, capfd: pytest.CaptureFixture[str]) -> None:
    gate.validate(14, clean_agg(), no_findings())
    out, err = capfd.readouterr()
    assert "Calculating Metrics" not in out + err


# -- ids -------------------------------------------------------------------------------------------


def test_finding_ids_are_deterministic_across_gates(real_findings: dict[str, list[Finding]]) -> None:
    agg = _set(clean_agg(), "SyncGroup", "resp", null_protocol_type=2)
    findings = as_frame(real_findings["accepted"])
    first = QualityGate(QualityConfig(), None).validate(42, agg, findings)
    second = QualityGate(QualityConfig(), None).validate(42, agg, findings)
    assert len(first.findings) == 2
    assert [f.id for f in first.findings] == [f.id for f in second.findings]
    assert [f.to_dict() for f in first.findings] == [f.to_dict() for f in second.findings]
    other_batch = QualityGate(QualityConfig(), None).validate(43, agg, findings)
    assert not {f.id for f in other_batch.findings} & {f.id for f in first.findings}
    anchored = Finding("quality.no_stale_epoch_accepted", Severity.CRITICAL, "kpmon.findings", "", 0)
    anchored.evidence = {"conn": "quality", "seq": 42}
    assert anchored.id in {f.id for f in first.findings}


# -- Data Docs -------------------------------------------------------------------------------------


def kept_results(docs: Path) -> list[Path]:
    return sorted((docs / "results").rglob("*.json"))


def test_data_docs_index_lists_the_suites(tmp_path: Path, real_findings: dict[str, list[Finding]]) -> None:
    gate = QualityGate(QualityConfig(docs_sample_every_batches=1), tmp_path)
    gate.validate(1, clean_agg(), as_frame(real_findings["rejected"]))
    gate.validate(2, _set(clean_agg(), "JoinGroup", "resp", null_protocol_type=1), no_findings())
    index = gate.build_docs()
    assert index == tmp_path / "site" / "index.html" and index.is_file()
    html = index.read_text()
    for suite in SUITES:
        assert suite in html
    pages = list((tmp_path / "site" / "validations").rglob("*.html"))
    assert len(pages) == 5, "three suites for batch 1, two for batch 2 (no findings to validate)"
    failing_page = next(p for p in pages if "batch-2" in str(p) and "frames" in str(p))
    assert "null_protocol_type" in failing_page.read_text()


def test_docs_keep_failures_sample_passes_and_render_in_the_background(tmp_path: Path) -> None:
    config = QualityConfig(docs_sample_every_batches=3, docs_every_batches=4)
    gate = QualityGate(config, tmp_path)
    bad = _set(clean_agg(), "JoinGroup", "resp", null_protocol_type=1)
    started = []
    for batch in range(1, 5):
        result = gate.validate(batch, bad if batch == 1 else clean_agg(), no_findings())
        started.append(result.statistics["docs"]["render_started"])
    assert started == [False, False, False, True]
    runs = {p.parts[-3] for p in kept_results(tmp_path)}
    # batch 1: its failed frames suite is kept (its batch suite passed); batch 3 is the sampled pass
    # (frames and batch suites); 2 and 4 passed unsampled.
    assert runs == {"batch-1", "batch-3"}
    assert gate._docs is not None and gate._docs.wait(120)
    assert gate._docs.last_render["error"] is None and gate._docs.last_render["results"] == 3
    html = (tmp_path / "site" / "index.html").read_text()
    assert "batch-1" in html and "batch-3" in html
    # The next batch reports the finished render.
    assert gate.validate(5, clean_agg(), no_findings()).statistics["docs"]["last_render"]["results"] == 3


def test_results_written_during_a_render_wait_for_the_next_one(tmp_path: Path) -> None:
    gate = QualityGate(QualityConfig(docs_sample_every_batches=1, docs_every_batches=1), tmp_path)
    first = gate.validate(1, clean_agg(), no_findings())
    assert first.statistics["docs"]["render_started"]
    # Batches go on while the render runs: they neither wait for it nor start a second one.
    during = [gate.validate(b, clean_agg(), no_findings()) for b in (2, 3)]
    assert gate._docs is not None and gate._docs.wait(120)
    if any(r.statistics["docs"]["render_started"] for r in during):
        assert gate._docs.wait(120)
    assert gate._docs.last_render["error"] is None
    index = gate.build_docs()
    assert index is not None and "batch-3" in index.read_text()
    assert gate._docs.last_render["results"] == 6


def test_kept_results_are_bounded_and_survive_a_restart(tmp_path: Path) -> None:
    config = QualityConfig(docs_sample_every_batches=1, docs_keep_results=3)
    gate = QualityGate(config, tmp_path)
    for batch in range(10):
        gate.validate(batch, clean_agg(), no_findings())
    per_suite = len(kept_results(tmp_path)) / 2  # frames and batch suites
    assert 3 <= per_suite <= 4, "pruned back to docs_keep_results (with 10 % slack)"
    leftovers = [d for d in (tmp_path / "results").rglob("*") if d.is_dir() and not any(d.iterdir())]
    assert leftovers == [], "pruning leaves no empty run directories behind"
    restarted = QualityGate(QualityConfig(docs_sample_every_batches=1, docs_keep_results=2), tmp_path)
    assert len(kept_results(tmp_path)) == 4, "a restart prunes to the new bound"
    index = restarted.build_docs()
    assert index is not None and "batch-9" in index.read_text()


def test_no_docs_dir_or_docs_disabled_means_no_files(tmp_path: Path) -> None:
    assert QualityGate(QualityConfig(), None).build_docs() is None
    gate = QualityGate(QualityConfig(data_docs=False, docs_sample_every_batches=1), tmp_path)
    gate.validate(1, clean_agg(), no_findings())
    assert gate.build_docs() is None
    assert list(tmp_path.iterdir()) == []


# -- config and catalogue --------------------------------------------------------------------------


def test_quality_config_section_and_env_override() -> None:
    assert KpmonConfig().quality == QualityConfig()
    assert QualityConfig().max_decode_error_rate == 0.01 and QualityConfig().data_docs is True
    config = load_config(environ={"KPMON__QUALITY__MAX_DECODE_ERROR_RATE": "0.05"})
    assert config.quality.max_decode_error_rate == 0.05
    with pytest.raises(ValueError, match="max_decode_error_rate"):
        load_config(environ={"KPMON__QUALITY__MAX_DECODE_ERROR_RATE": "2"})


def _emitted_rule_ids() -> set[str]:
    """Rule ids passed to ``ctx.emit`` anywhere in checks/ (literals or module constants)."""
    root = Path(__file__).resolve().parents[2] / "checks"
    found: set[str] = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for target in node.targets
            if isinstance(target, ast.Name) and isinstance(node.value.value, str)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "emit" or not node.args:
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
            elif isinstance(first, ast.Name) and first.id in constants:
                found.add(constants[first.id])
    return found


def test_catalogue_covers_every_rule_the_checkers_emit() -> None:
    emitted = _emitted_rule_ids()
    assert {"producer.stale_epoch_accepted", "frame.decode_error", "tap.gap"} <= emitted
    assert emitted <= CATALOGUE_RULES, f"add to CATALOGUE_RULES: {sorted(emitted - CATALOGUE_RULES)}"
    assert "envelope.inner_producer.stale_epoch_accepted" in known_rules()
    assert "envelope.inner_envelope.untrusted_source" not in known_rules()
    assert "envelope.inner_tap.gap" not in known_rules() and "envelope.inner_txn.hanging" not in known_rules()
