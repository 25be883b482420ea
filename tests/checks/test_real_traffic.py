"""The catalogue against real traffic: violations made to happen for real, through the real tap.

Each scenario (kpmon/traffic) drives real clients, or the codec over a raw socket where no real client
would send the frame, against a real 4.4 broker whose advertised address is the tap's. The tap mirrors
every frame to the tap topic; the test reads that scenario's records back, decodes them with the codec
and runs the whole catalogue (``checks.new_monitor()``) over them. One tap and one tap topic serve the
module. Each test also pins what else fired above ``info``: a scenario must raise its finding and no
false ones.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from checks.model import Severity
from kpmon.cli import main
from kpmon.traffic import violations, workload
from tests.checks.tapped import Checked, ScenarioTap

pytestmark = pytest.mark.integration

PRODUCE, FETCH, JOIN_GROUP, SYNC_GROUP, API_VERSIONS, INIT_PRODUCER_ID, END_TXN, ENVELOPE = (
    0,
    1,
    11,
    14,
    18,
    22,
    26,
    58,
)
INVALID_PRODUCER_EPOCH, PRODUCER_FENCED, INCONSISTENT_GROUP_PROTOCOL = 47, 90, 23


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _rules_above_info(checked: Checked) -> set[str]:
    return {f.rule for f in checked.above_info()}


def _client_id_of(checked: Checked, conn: str) -> str | None:
    return next(f.request.client_id for f in checked.frames if f.conn == conn and f.request is not None)


def test_zombie_producer_write_after_fence(scenarios: ScenarioTap) -> None:
    txn_id = _unique("kpmon-zombie")
    checked = scenarios.run(violations.zombie_producer, _unique("zombie"), txn_id)
    assert checked.result["zombie_write"].startswith("rejected"), checked.describe()

    assert _rules_above_info(checked) == {"producer.stale_epoch_rejected"}, checked.describe()
    (stale,) = checked.of("producer.stale_epoch_rejected")
    ev = stale.evidence
    assert stale.severity == Severity.WARNING
    assert ev["broker_error"] in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED)
    assert ev["transactional"] is True
    assert 0 <= ev["producer_epoch"] < ev["newest_epoch"]
    assert ev["newest_epoch_source"] == "InitProducerId"
    # The producer id is the one the coordinator handed out for this transactional.id, and the write
    # came from the zombie's own connection.
    pids = {
        f.response.body["ProducerId"]
        for f in checked.frames
        if f.direction == "resp"
        and f.api_key == INIT_PRODUCER_ID
        and f.response is not None
        and f.response.body["ErrorCode"] == 0
    }
    assert pids == {ev["producer_id"]}
    assert {
        f.request.body["TransactionalId"] for f in checked.requests(INIT_PRODUCER_ID) if f.request is not None
    } == {txn_id}
    assert _client_id_of(checked, ev["conn"]) == "kpmon-zombie"


def test_group_with_members_of_two_protocol_types(scenarios: ScenarioTap) -> None:
    group = _unique("kpmon-mixed")
    checked = scenarios.run(violations.mixed_protocol_group, group, _unique("mixed"))
    assert checked.result["join_error"] == INCONSISTENT_GROUP_PROTOCOL, checked.describe()

    assert _rules_above_info(checked) == {"group.protocol_type_mismatch"}, checked.describe()
    (mismatch,) = checked.of("group.protocol_type_mismatch")
    assert mismatch.subject == f"group:{group}"
    assert "INCONSISTENT_GROUP_PROTOCOL" in mismatch.summary
    # The group's type came from the kafka-python member's generation; the rejected join was 'connect'.
    assert mismatch.evidence["group_protocol_type"] == "consumer"
    assert _client_id_of(checked, mismatch.evidence["conn"]) == "kpmon-connect-member"
    rejected = [
        f
        for f in checked.requests(JOIN_GROUP)
        if f.conn == mismatch.evidence["conn"] and f.correlation_id == mismatch.evidence["correlation_id"]
    ]
    assert [f.request.body["ProtocolType"] for f in rejected if f.request is not None] == ["connect"]


def test_requests_outside_the_advertised_versions(scenarios: ScenarioTap) -> None:
    checked = scenarios.run(violations.out_of_range_versions)
    assert _rules_above_info(checked) == {
        "apiversions.out_of_range",
        "apiversions.removed_version_rejected",
    }, checked.describe()
    out_of_range = {
        (f.evidence["api_key"], f.evidence["api_version"]): f for f in checked.of("apiversions.out_of_range")
    }

    # Fetch v3: below the minimum a 4.x broker advertises (and removed in 4.0).
    advertised = _advertised(checked, out_of_range[(FETCH, 3)].evidence["conn"])
    assert out_of_range[(FETCH, 3)].evidence["advertised"] == list(advertised[FETCH])
    assert advertised[FETCH][0] > 3
    # Above the maximum, when the codec knows a version the broker does not advertise.
    above = [s for s in checked.result["sent"] if "removed" not in s]
    assert len(out_of_range) == 1 + len(above), checked.describe()
    for (api, version), finding in out_of_range.items():
        lo, hi = _advertised(checked, finding.evidence["conn"])[api]
        assert not lo <= version <= hi
    # Produce v2 is still advertised by 4.x brokers (KAFKA-18659): not out of range, but removed in 4.0.
    assert (PRODUCE, 2) not in out_of_range
    removed = {
        (f.evidence["api_key"], f.evidence["api_version"]) for f in checked.of("apiversions.removed_in_4_0")
    }
    assert removed == {(FETCH, 3), (PRODUCE, 2)}
    # In front of this 4.x broker, Produce v2 fails now: the broker closed the connection (KIP-896).
    assert checked.result["broker"].endswith("/closed"), checked.result
    (rejected,) = checked.of("apiversions.removed_version_rejected")
    assert (rejected.evidence["api_key"], rejected.evidence["api_version"]) == (PRODUCE, 2)
    assert rejected.severity == Severity.WARNING and rejected.evidence["advertised"][0] == 0
    assert "KIP-896" in rejected.summary and "closed the connection" in rejected.summary, rejected.summary
    assert _client_id_of(checked, rejected.evidence["conn"]) == "kpmon-old-client"


def _advertised(checked: Checked, conn: str) -> dict[int, tuple[int, int]]:
    """The ranges the broker advertised on ``conn``, from its mirrored ApiVersions answer."""
    (answer,) = [
        f.response
        for f in checked.frames
        if f.conn == conn and f.direction == "resp" and f.api_key == API_VERSIONS and f.response is not None
    ]
    return {k["ApiKey"]: (k["MinVersion"], k["MaxVersion"]) for k in answer.body["ApiKeys"]}


def test_envelope_from_a_client_connection(scenarios: ScenarioTap) -> None:
    checked = scenarios.run(violations.envelope_from_client)
    # A client listener does not advertise Envelope at all, so the request is out of range too.
    assert _rules_above_info(checked) == {"envelope.untrusted_source", "apiversions.out_of_range"}, (
        checked.describe()
    )
    (untrusted,) = checked.of("envelope.untrusted_source")
    assert untrusted.severity == Severity.CRITICAL
    ev = untrusted.evidence
    assert (ev["api_key"], ev["inner_api_key"], ev["inner_client_id"]) == (ENVELOPE, 19, "forged-admin")
    assert ev["listener"] == "PLAINTEXT"
    assert _client_id_of(checked, ev["conn"]) == "kpmon-forger"
    (oor,) = checked.of("apiversions.out_of_range")
    assert (oor.evidence["api_key"], oor.evidence["advertised"]) == (ENVELOPE, None)


def test_malformed_frame(scenarios: ScenarioTap) -> None:
    checked = scenarios.run(violations.malformed_frame)
    assert _rules_above_info(checked) == {"frame.decode_error"}, checked.describe()
    (error,) = checked.of("frame.decode_error")
    assert (error.evidence["api_key"], error.evidence["api_version"], error.evidence["correlation_id"]) == (
        API_VERSIONS,
        3,
        99,
    )
    assert "exceeds" in error.summary
    assert checked.stats.decode_errors == 1
    # The undecodable frame was mirrored whole, and the connection's well-formed handshake decoded.
    (bad,) = [f for f in checked.frames if f.error is not None]
    assert bad.raw is not None and bad.raw.endswith(b"\x7fxx")
    assert any(f.conn == bad.conn and f.response is not None for f in checked.frames)


def test_clean_workload_raises_nothing_above_info(scenarios: ScenarioTap) -> None:
    topic, group = _unique("clean"), _unique("kpmon-clean-group")
    checked = scenarios.run(workload.clean_round, topic, group)
    assert checked.above_info() == [], checked.describe()

    # Not vacuous: the workload really did what the catalogue checks.
    assert checked.result["idempotent_delivered"] == 50
    assert checked.stats.decode_errors == checked.stats.gaps == checked.stats.unpaired_responses == 0
    txn_ids = {f.request.body["TransactionalId"] for f in checked.requests(INIT_PRODUCER_ID) if f.request}
    assert len(txn_ids - {None}) == 2
    assert sorted(f.request.body["Committed"] for f in checked.requests(END_TXN) if f.request) == [
        False,
        True,
    ]
    # Transactions v1 (EndTxn before v5, KIP-890): librdkafka's commit and abort; v2 is the Java matrix's.
    assert {f.api_version for f in checked.requests(END_TXN)} <= set(range(5)), checked.describe()
    producing = {
        (b.producer_id, b.is_transactional)
        for f in checked.requests(PRODUCE)
        if f.request
        for t in f.request.body["TopicData"]
        for p in t["PartitionData"]
        for b in p["Records"].batches
    }
    assert any(not txn and pid >= 0 for pid, txn in producing) and any(txn for _, txn in producing)
    joined = {
        f.request.client_id
        for f in checked.requests(JOIN_GROUP)
        if f.request and f.request.body["GroupId"] == group
    }
    assert joined == {"kpmon-member-0", "kpmon-member-1"}
    assert any(f.request and f.request.body["GroupId"] == group for f in checked.requests(SYNC_GROUP))
    assert checked.states[("group", group)]["ptype"] == "consumer"


def test_kpmon_report_from_the_tap_topic(
    scenarios: ScenarioTap,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``kpmon report`` over the real tap topic, saved as a capture, then over that capture: same report."""
    for name in list(os.environ):
        if name.startswith("KPMON__"):
            monkeypatch.delenv(name)
    scenarios.run(violations.envelope_from_client)
    scenarios.run(violations.out_of_range_versions)
    capture, first, second = tmp_path / "tap.jsonl", tmp_path / "topic.html", tmp_path / "capture.html"
    mirror = scenarios.cluster.mirror_bootstrap
    args = ["report", "--topic", scenarios.topic, "--bootstrap-servers", mirror, "--idle-timeout", "2"]
    assert main([*args, "--save-capture", str(capture), "--out", str(first)]) == 0
    from_topic = capsys.readouterr().out
    assert main(["report", "--capture", str(capture), "--out", str(second)]) == 0
    from_capture = capsys.readouterr().out
    # Same figures, findings and readiness list; only the first line (the source) differs.
    assert from_topic.split("\n", 1)[1].split("wrote")[0] == from_capture.split("\n", 1)[1].split("wrote")[0]
    assert "not ready for Kafka 4.0" in from_capture
    page = second.read_text(encoding="utf-8")
    for text in ("envelope.untrusted_source", "apiversions.out_of_range", "Fetch", "kpmon-raw/1"):
        assert text in page
    png = second.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png == first.with_suffix(".png").read_bytes()
    keep = os.environ.get("KPMON_REPORT_SCREENSHOT")
    if keep:
        Path(keep).with_suffix(".real.png").write_bytes(png)
