"""The data-quality gate: Great Expectations suites validated once per micro-batch, on the driver.

The streaming job calls ``QualityGate.validate`` from ``foreachBatch`` with two small pandas frames it
has already computed: ``frames_agg`` (one row per direction, API key and version seen in the batch) and
the batch's findings. Validating those instead of every decoded frame keeps GX off the hot path: it
costs milliseconds per batch, where GX over the batch's Spark rows costs whole Spark jobs per metric
(``benchmarks/quality_bench.py`` measures both).

Each failed expectation becomes a ``checks.model.Finding`` with rule ``quality.<short name>`` and an id
anchored on the batch id (``{"conn": "quality", "seq": batch_id}``), so a replayed batch, which
``foreachBatch`` may deliver more than once, yields the same ids.

The GX context is ephemeral: the suites are rebuilt from the config at every start, so they always
match it. Data Docs (``streaming/quality_docs.py``) keep failing and sampled results on disk under
``docs_dir`` and render them to ``<docs_dir>/site/index.html`` in the background.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import great_expectations as gx
import pandas as pd
from great_expectations.core.batch_definition import BatchDefinition
from great_expectations.core.expectation_suite import ExpectationSuite
from great_expectations.core.expectation_validation_result import (
    ExpectationValidationResult,
)
from great_expectations.data_context import AbstractDataContext
from great_expectations.expectations.metadata_types import FailureSeverity

from checks.model import Finding, Severity
from kpconfig.model import QualityConfig
from streaming.quality_docs import DocsSite, context_config
from streaming.quality_suites import (
    CHECKS,
    FINDINGS_COLUMNS,
    FRAMES_AGG_COLUMNS,
    INDEX_COLUMNS,
    SUITE_BATCH,
    SUITE_FINDINGS,
    SUITE_FRAMES,
    SUITES,
    Check,
)

log = logging.getLogger(__name__)

#: At most this many offending rows are copied into a finding's evidence.
MAX_EVIDENCE_ROWS = 20
BATCH_COLUMNS = (
    "frames",
    "decode_errors",
    "responses",
    "error_responses",
    "decode_error_rate",
    "error_response_rate",
)


COUNT_COLUMNS = ("frames", "decode_errors", "null_protocol_type", "error_responses")


class QualityInputError(ValueError):
    """An input frame lacks columns the suites read (a bug in the caller, not bad traffic)."""


@dataclass
class QualityResult:
    batch_id: int
    success: bool
    elapsed_s: float
    #: One per failed expectation (rule ``quality.<short name>``).
    findings: list[Finding] = field(default_factory=list)
    #: Per suite: evaluated, successful, unsuccessful, errors, skipped, elapsed_s; plus ``docs``.
    statistics: dict[str, Any] = field(default_factory=dict)
    #: (rule, subject) of every expectation evaluated and met in this batch: where a ``quality.*``
    #: alert raised by an earlier batch has cleared, for the caller to resolve.
    passed: list[tuple[str, str]] = field(default_factory=list)


def _quiet_gx() -> None:
    # GX logs at INFO/WARNING about store and datasource bookkeeping on every validation; only its
    # errors matter to an operator watching the job.
    logging.getLogger("great_expectations").setLevel(logging.ERROR)


def add_suites(context: AbstractDataContext, config: QualityConfig) -> dict[str, ExpectationSuite]:
    """The three suites, built from ``CHECKS`` with the config's thresholds, added to ``context``."""
    suites = {}
    for suite_name in SUITES:
        suite = context.suites.add(ExpectationSuite(name=suite_name))
        for check in CHECKS:
            if check.suite != suite_name:
                continue
            expectation = check.build(config)
            expectation.meta = {"kpmon_rule": check.rule}
            expectation.severity = FailureSeverity(check.severity.value)
            suite.add_expectation(expectation)
        suites[suite_name] = suite
    return suites


def batch_summary(frames_agg: pd.DataFrame, min_frames: int) -> pd.DataFrame:
    """The one-row ``kpmon.batch`` input: totals, and rates (null when too few frames to judge)."""
    frames = int(frames_agg["frames"].sum())
    decode_errors = int(frames_agg["decode_errors"].sum())
    responses = int(frames_agg.loc[frames_agg["dir"] == "resp", "frames"].sum())
    error_responses = int(frames_agg["error_responses"].sum())
    row = {
        "frames": frames,
        "decode_errors": decode_errors,
        "responses": responses,
        "error_responses": error_responses,
        "decode_error_rate": decode_errors / frames if frames >= min_frames else None,
        "error_response_rate": error_responses / responses if responses >= min_frames else None,
    }
    return pd.DataFrame([row], columns=list(BATCH_COLUMNS)).astype(
        {"decode_error_rate": "float64", "error_response_rate": "float64"}
    )


def findings_frame(findings: pd.DataFrame) -> pd.DataFrame:
    """The ``kpmon.findings`` input: the findings plus ``alert_rule``, the rule of those that alert."""
    complete = ~findings["incomplete"].fillna(False).astype(bool)
    alerting = complete & (findings["severity"] != Severity.INFO.value)
    return findings.assign(alert_rule=findings["rule"].where(alerting))


def _require(frame: pd.DataFrame, columns: tuple[str, ...], name: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise QualityInputError(f"{name} must be a pandas DataFrame, not {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise QualityInputError(f"{name} lacks column(s) {', '.join(missing)}; it has {list(frame.columns)}")
    # The batch totals are summed here, before GX sees anything, so these must be numbers. An empty
    # frame built from a column list has object columns, and nothing to sum: it is fine as it is.
    counts = [
        c
        for c in COUNT_COLUMNS
        if c in columns and len(frame) and not pd.api.types.is_numeric_dtype(frame[c])
    ]
    if counts:
        raise QualityInputError(f"{name} column(s) {', '.join(counts)} must be numeric")


def _raised(evr: ExpectationValidationResult) -> str | None:
    """The message of the exception GX caught while evaluating ``evr``, if any."""
    info = evr.exception_info or {}
    # A lone expectation reports one exception; a suite reports one per metric that failed.
    for entry in (info, *info.values()):
        if isinstance(entry, dict) and entry.get("raised_exception"):
            return str(entry.get("exception_message") or "unknown error")
    return None


def _plain(value: Any) -> Any:
    """JSON-safe copies of GX result values (numpy scalars, pandas NA, tuples)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return None if math.isnan(value) else value
    item = getattr(value, "item", None)
    if callable(item):
        return _plain(item())
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return str(value)


class QualityGate:
    """Builds the GX context and suites once; validates each micro-batch; renders Data Docs."""

    def __init__(self, config: QualityConfig, docs_dir: Path | None) -> None:
        _quiet_gx()
        self.config = config
        self.docs_dir = Path(docs_dir) if docs_dir is not None and config.data_docs else None
        results_dir = self.docs_dir / "results" if self.docs_dir else None
        self._context = gx.get_context(project_config=context_config(results_dir), mode="ephemeral")
        self._suites = add_suites(self._context, config)
        self._checks = {check.rule: check for check in CHECKS}
        datasource = self._context.data_sources.add_pandas("kpmon")
        self._batch_definitions: dict[str, BatchDefinition] = {
            name: datasource.add_dataframe_asset(
                name.removeprefix("kpmon.")
            ).add_batch_definition_whole_dataframe("micro-batch")
            for name in SUITES
        }
        self._docs = (
            DocsSite(config, self.docs_dir, self._context, lambda ctx: add_suites(ctx, config))
            if self.docs_dir is not None
            else None
        )
        self._validated = 0
        self._docs_due = config.docs_every_batches

    # -- validation ------------------------------------------------------------------------------

    def validate(self, batch_id: int, frames_agg: pd.DataFrame, findings: pd.DataFrame) -> QualityResult:
        """Run the suites over one micro-batch. Never raises for what the data says, only for bad inputs."""
        start = time.perf_counter()
        _require(frames_agg, FRAMES_AGG_COLUMNS, "frames_agg")
        _require(findings, FINDINGS_COLUMNS, "findings")
        inputs = {
            SUITE_FRAMES: frames_agg,
            SUITE_BATCH: (
                batch_summary(frames_agg, self.config.min_frames_for_rates) if len(frames_agg) else frames_agg
            ),
            SUITE_FINDINGS: findings_frame(findings) if len(findings) else findings,
        }
        ts_ns = int(findings["ts_ns"].max()) if len(findings) else time.time_ns()
        result = QualityResult(batch_id=batch_id, success=True, elapsed_s=0.0)
        self._validated += 1
        for suite_name, frame in inputs.items():
            stats: dict[str, Any] = {
                "evaluated": 0,
                "successful": 0,
                "unsuccessful": 0,
                "errors": 0,
                "skipped": frame.empty,
            }
            result.statistics[suite_name] = stats
            if frame.empty:
                # Every expectation here holds vacuously on no rows: skip GX, which costs ms even then.
                continue
            suite_start = time.perf_counter()
            suite_result = self._run_suite(suite_name, frame, batch_id, stats)
            stats["elapsed_s"] = time.perf_counter() - suite_start
            for check, evr in suite_result:
                stats["evaluated"] += 1
                if evr is not None and evr.success:
                    stats["successful"] += 1
                    result.passed.append((check.rule, check.suite))
                    continue
                stats["unsuccessful"] += 1
                result.success = False
                result.findings.append(self._finding(batch_id, ts_ns, check, evr))
        result.statistics["docs"] = self._docs_statistics()
        result.elapsed_s = time.perf_counter() - start
        return result

    def _run_suite(
        self, suite_name: str, frame: pd.DataFrame, batch_id: int, stats: dict[str, Any]
    ) -> list[tuple[Check, ExpectationValidationResult | None]]:
        suite = self._suites[suite_name]
        try:
            batch = self._batch_definitions[suite_name].get_batch(batch_parameters={"dataframe": frame})
            # Pass/fail alone is about half the price of a result with the offending rows, and most
            # batches pass: only failed expectations are run again for their evidence.
            suite_result = batch.validate(suite, result_format="BOOLEAN_ONLY")
            detail = {
                "result_format": "SUMMARY",
                "partial_unexpected_count": MAX_EVIDENCE_ROWS,
                "unexpected_index_column_names": INDEX_COLUMNS[suite_name],
            }
            by_id = {e.id: e for e in suite.expectations}
            for i, evr in enumerate(suite_result.results):
                config = evr.expectation_config
                if evr.success or config is None or config.id not in by_id or _raised(evr):
                    continue
                suite_result.results[i] = batch.validate(by_id[config.id], result_format=detail)
        except Exception as exc:
            # A GX failure must not stop the stream: every expectation of the suite counts as
            # unevaluated (a finding each), and the error is logged once per batch.
            log.error("quality: suite %s failed on batch %s: %s", suite_name, batch_id, exc, exc_info=True)
            stats["errors"] += len(suite.expectations)
            return [
                (self._checks[str(e.meta["kpmon_rule"])], None)
                for e in suite.expectations
                if e.meta is not None
            ]
        if self._docs is not None:
            sample = self._validated % self.config.docs_sample_every_batches == 0
            self._docs.keep(suite_name, batch_id, suite_result, sample)
        out: list[tuple[Check, ExpectationValidationResult | None]] = []
        for evr in suite_result.results:
            meta = evr.expectation_config.meta if evr.expectation_config is not None else None
            check = self._checks[str((meta or {})["kpmon_rule"])]
            error = _raised(evr)
            if error is not None:
                stats["errors"] += 1
                log.error("quality: %s could not be evaluated on batch %s: %s", check.rule, batch_id, error)
            out.append((check, evr))
        return out

    def _finding(
        self, batch_id: int, ts_ns: int, check: Check, evr: ExpectationValidationResult | None
    ) -> Finding:
        config = evr.expectation_config if evr is not None else None
        description = (config.description if config is not None else None) or check.rule
        evidence: dict[str, Any] = {
            "conn": "quality",
            "seq": batch_id,
            "batch_id": batch_id,
            "suite": check.suite,
            "expectation": config.type if config is not None else None,
        }
        error = "the suite could not run" if evr is None else _raised(evr)
        if evr is None or error is not None:
            evidence["error"] = error
            summary = f"batch {batch_id} could not be checked: {description} ({error})"
        else:
            res = evr.result or {}
            unexpected = res.get("partial_unexpected_index_list") or res.get("partial_unexpected_list") or []
            evidence["unexpected_count"] = _plain(res.get("unexpected_count"))
            evidence["element_count"] = _plain(res.get("element_count"))
            evidence["unexpected"] = _plain(list(unexpected)[:MAX_EVIDENCE_ROWS])
            if "observed_value" in res:
                evidence["observed_value"] = _plain(res["observed_value"])
            kwargs = config.kwargs if config is not None else {}
            for bound in ("min_value", "max_value"):
                if bound in kwargs:
                    evidence[bound] = _plain(kwargs[bound])
            summary = (
                f"batch {batch_id} failed: {description} "
                f"({evidence['unexpected_count']} of {evidence['element_count']} rows unexpected)"
            )
            if check.suite == SUITE_BATCH and unexpected and isinstance(unexpected[0], dict):
                observed = _plain(unexpected[0].get(str(kwargs.get("column"))))
                if isinstance(observed, float):
                    summary = f"batch {batch_id} failed: {description} (observed {observed:.2%})"
        return Finding(
            rule=check.rule,
            severity=check.severity,
            subject=check.suite,
            summary=summary,
            ts_ns=ts_ns,
            evidence=evidence,
        )

    # -- Data Docs -------------------------------------------------------------------------------

    def build_docs(self) -> Path | None:
        """(Re)build the static HTML report now; returns its index.html (None when Data Docs are off).

        Waits for a background render first. The job calls this when it stops, so the report covers
        the last batches; while running, ``validate`` renders every ``docs_every_batches`` batches in
        the background.
        """
        if self._docs is None:
            return None
        index = self._docs.render_now()
        self._docs_due = self._validated + self.config.docs_every_batches
        return index

    def _docs_statistics(self) -> dict[str, Any]:
        if self._docs is None:
            return {"enabled": False}
        started = False
        if self._validated >= self._docs_due:
            started = self._docs.render_soon()
            if started:
                self._docs_due = self._validated + self.config.docs_every_batches
        return {"enabled": True, "render_started": started, "last_render": dict(self._docs.last_render)}
