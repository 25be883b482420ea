"""What the data-quality gate expects of each micro-batch: three Great Expectations suites.

Each expectation is one ``Check``: a short name (the finding's rule is ``quality.<short name>``), the
severity its failure is reported at, and the GX expectation itself. The suites run over small pandas
frames on the driver (``streaming/quality.py``), never per row over Spark:

- ``kpmon.frames``: ``frames_agg``, one row per (dir, api_key, api_version) seen in the batch;
- ``kpmon.batch``: one row of batch totals and rates derived from ``frames_agg``;
- ``kpmon.findings``: the batch's findings, one row each.

GX row conditions would express "only complete findings above info" or "only batches of N+ frames",
but each one costs a pandas ``query`` per expectation, doubling its price on frames this small. The
inputs carry derived columns instead, null where a row must not be judged (map expectations skip nulls):

- ``alert_rule`` (findings): the rule of a finding that raises an alert, i.e. above ``info`` and not
  ``incomplete`` (a finding on a connection the tap lost records of is not an alert, ARCHITECTURE.md);
- ``decode_error_rate`` / ``error_response_rate`` (batch): null below ``min_frames_for_rates``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import great_expectations.expectations as gxe
from great_expectations.expectations.expectation import Expectation

from checks.alerts import ENVELOPE_INNER_PREFIX, inner_rule_ids
from checks.model import Severity
from kpconfig.model import QualityConfig

SUITE_FRAMES = "kpmon.frames"
SUITE_BATCH = "kpmon.batch"
SUITE_FINDINGS = "kpmon.findings"
SUITES = (SUITE_FRAMES, SUITE_BATCH, SUITE_FINDINGS)

#: The columns each input must have (extra ones are ignored).
FRAMES_AGG_COLUMNS = (
    "dir",
    "api_key",
    "api_name",
    "api_version",
    "frames",
    "decode_errors",
    "null_protocol_type",
    "error_responses",
)
FINDINGS_COLUMNS = ("id", "rule", "severity", "subject", "summary", "ts_ns", "incomplete")

#: Every rule id the checkers emit: the catalogue of ARCHITECTURE.md as implemented in checks/.
#: tests/streaming/test_quality.py fails when checks/ emits an id missing here.
CATALOGUE_RULES = frozenset(
    {
        "apiversions.out_of_range",
        "apiversions.no_handshake",
        "apiversions.removed_in_4_0",
        "apiversions.removed_version_rejected",
        "apiversions.cluster_skew",
        "group.protocol_type_mismatch",
        "group.assignment_outside_subscription",
        "group.member_epoch_fenced",
        "group.mixed_protocol_rejected",
        "producer.stale_epoch_rejected",
        "producer.stale_epoch_accepted",
        "producer.sequence_gap",
        "producer.sequence_duplicate",
        "txn.produce_outside_txn",
        "txn.hanging",
        "txn.pid_hijack",
        "txn.read_committed_inconsistent",
        "flex.header_version",
        "flex.tagged_fields",
        "envelope.untrusted_source",
        "frame.decode_error",
        "tap.gap",
        "tap.blind",
        "tap.worker_lost",
        "tap.tap_start",
    }
)


def known_rules() -> frozenset[str]:
    return CATALOGUE_RULES | inner_rule_ids(CATALOGUE_RULES)


def _with_inner(rule: str) -> list[str]:
    return [rule, ENVELOPE_INNER_PREFIX + rule]


@dataclass(frozen=True)
class Check:
    suite: str
    short_name: str
    severity: Severity
    #: Builds the expectation; called once per gate (thresholds come from the config).
    build: Callable[[QualityConfig], Expectation]

    @property
    def rule(self) -> str:
        return f"quality.{self.short_name}"


def _api_versions_in_range(_: QualityConfig) -> Expectation:
    return gxe.ExpectColumnValuesToNotBeInSet(
        column="alert_rule",
        value_set=_with_inner("apiversions.out_of_range"),
        description="No request outside the API versions its broker advertised (apiversions.out_of_range above info)",
    )


def _no_stale_epoch_accepted(_: QualityConfig) -> Expectation:
    return gxe.ExpectColumnValuesToNotBeInSet(
        column="alert_rule",
        value_set=_with_inner("producer.stale_epoch_accepted"),
        description="No write with a stale producer epoch accepted by the broker (producer.stale_epoch_accepted)",
    )


def _severity_known(_: QualityConfig) -> Expectation:
    return gxe.ExpectColumnValuesToBeInSet(
        column="severity",
        value_set=[s.value for s in Severity],
        description="Every finding's severity is info, warning or critical",
    )


def _rule_known(_: QualityConfig) -> Expectation:
    return gxe.ExpectColumnValuesToBeInSet(
        column="rule",
        value_set=sorted(known_rules()),
        description="Every finding's rule id is in the invariant catalogue",
    )


def _finding_id_format(_: QualityConfig) -> Expectation:
    return gxe.ExpectColumnValuesToMatchRegex(
        column="id",
        regex=r"^[0-9a-f]{24}$",
        description="Every finding has a deterministic id (24 hex digits), which alert receivers dedupe on",
    )


def _protocol_type_not_null(_: QualityConfig) -> Expectation:
    return gxe.ExpectColumnValuesToBeBetween(
        column="null_protocol_type",
        min_value=0,
        max_value=0,
        description="ProtocolType is not null on JoinGroup v7+ and SyncGroup v5+ responses (KIP-559)",
    )


def _direction_known(_: QualityConfig) -> Expectation:
    return gxe.ExpectColumnValuesToBeInSet(
        column="dir",
        value_set=["req", "resp"],
        description="Decoded frames are requests or responses",
    )


def _counts_consistent(_: QualityConfig) -> Expectation:
    return gxe.ExpectColumnPairValuesAToBeGreaterThanB(
        column_A="frames",
        column_B="decode_errors",
        or_equal=True,
        description="No more decode errors than frames in any (dir, api, version) group",
    )


def _decode_error_rate(config: QualityConfig) -> Expectation:
    return gxe.ExpectColumnValuesToBeBetween(
        column="decode_error_rate",
        min_value=0.0,
        max_value=config.max_decode_error_rate,
        description=(
            f"Decode errors are at most {config.max_decode_error_rate:.2%} of the batch's frames "
            f"(batches of {config.min_frames_for_rates}+ frames)"
        ),
    )


def _error_response_rate(config: QualityConfig) -> Expectation:
    return gxe.ExpectColumnValuesToBeBetween(
        column="error_response_rate",
        min_value=0.0,
        max_value=config.max_error_response_rate,
        description=(
            f"Responses with a top-level error are at most {config.max_error_response_rate:.0%} of the "
            f"batch's responses (batches of {config.min_frames_for_rates}+ responses)"
        ),
    )


CHECKS: tuple[Check, ...] = (
    Check(SUITE_FRAMES, "protocol_type_not_null", Severity.WARNING, _protocol_type_not_null),
    Check(SUITE_FRAMES, "direction_known", Severity.WARNING, _direction_known),
    Check(SUITE_FRAMES, "counts_consistent", Severity.WARNING, _counts_consistent),
    Check(SUITE_BATCH, "decode_error_rate", Severity.WARNING, _decode_error_rate),
    Check(SUITE_BATCH, "error_response_rate", Severity.WARNING, _error_response_rate),
    Check(SUITE_FINDINGS, "api_versions_in_range", Severity.WARNING, _api_versions_in_range),
    Check(SUITE_FINDINGS, "no_stale_epoch_accepted", Severity.CRITICAL, _no_stale_epoch_accepted),
    Check(SUITE_FINDINGS, "severity_known", Severity.WARNING, _severity_known),
    Check(SUITE_FINDINGS, "rule_known", Severity.WARNING, _rule_known),
    Check(SUITE_FINDINGS, "finding_id_format", Severity.WARNING, _finding_id_format),
)

#: Which columns name the offending rows in a failure's evidence, per suite.
INDEX_COLUMNS: dict[str, list[str]] = {
    SUITE_FRAMES: ["dir", "api_key", "api_name", "api_version"],
    SUITE_BATCH: ["frames", "responses"],
    SUITE_FINDINGS: ["id", "subject"],
}
