"""The real-client matrix: Java kafka-clients 4.4, a Kafka Streams 4.3.1 app, librdkafka, kafka-python and
raw frames against the real 4.4 broker through the real tap, read back from the tap topic and run through
the whole catalogue.

Clean scenarios must raise nothing above info; each violation must raise its finding and nothing else
above info. The scenarios are in ``tests.checks.matrix``; the librdkafka/kafka-python clean workload and
the other catalogue violations are in ``test_real_traffic`` (transactions v1 with an abort: librdkafka in
its clean workload).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from checks.model import Finding, Severity
from checks.report import GroupRow, ReportData, build_report
from codec.protocol import ApiKey, ErrorCode
from kpmon.cli import main
from kpmon.commands.report import EXIT_FINDINGS, EXIT_OK
from tests.checks import matrix
from tests.checks.tapped import Checked, ScenarioTap

pytestmark = pytest.mark.integration

FENCES = (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _above_info(checked: Checked) -> set[str]:
    return {f.rule for f in checked.above_info()}


def _client_id(checked: Checked, conn: str) -> str | None:
    return next(f.request.client_id for f in checked.frames if f.conn == conn and f.request is not None)


def _fenced(checked: Checked) -> list[Finding]:
    return checked.of("producer.stale_epoch_rejected")


# -- clean --------------------------------------------------------------------------------------------


def test_java_clean_transactions_v2_ctp_kip848_and_classic_groups(scenarios: ScenarioTap) -> None:
    group = _unique("kpmon-java")
    checked = scenarios.run(matrix.java_clean, _unique("java-in"), _unique("java-out"), group)
    assert checked.above_info() == [], checked.describe()
    # Not vacuous: the Java client did what the checks judge.
    assert checked.result["idempotent"] == "20" and int(checked.result["ctp_moved"]) > 0, checked.result
    assert checked.result["classic_read"] == checked.result["ctp_moved"], checked.result
    assert checked.stats.decode_errors == checked.stats.gaps == 0
    end_txns = [f for f in checked.requests(ApiKey.END_TXN) if f.request is not None]
    assert end_txns and all((f.api_version or 0) >= 5 for f in end_txns)  # transactions v2
    assert checked.requests(ApiKey.TXN_OFFSET_COMMIT) and checked.requests(ApiKey.CONSUMER_GROUP_HEARTBEAT)
    assert checked.requests(ApiKey.JOIN_GROUP)
    groups = {g.group: g for g in _report(checked).groups}
    _all_left(groups[f"{group}-ctp"], "consumer")
    _all_left(groups[f"{group}-classic"], "classic")


def test_librdkafka_kip848_ctp_and_online_migration(scenarios: ScenarioTap) -> None:
    group, migrating = _unique("kpmon-rd848"), _unique("kpmon-migrate")
    checked = scenarios.run(matrix.librdkafka_kip848_and_migration, _unique("rd848"), group, migrating)
    # KIP-848's online migration is legal: nothing above info, whatever protocols share the group.
    assert checked.above_info() == [], checked.describe()
    assert checked.result["ctp_moved"] == 10, checked.result
    groups = {g.group: g for g in _report(checked).groups}
    _all_left(groups[group], "consumer")
    # The broker accepted the consumer-protocol member into the classic group (the online migration):
    # it is shown as both, and nothing was reported.
    accepted = [
        f
        for f in checked.frames
        if f.direction == "resp"
        and f.api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT
        and f.response is not None
        and f.response.body["ErrorCode"] == 0
        and f.conn in _conns_of(checked, "kpmon-rdkafka-migrating")
    ]
    assert accepted, checked.describe()
    assert groups[migrating].protocol == "classic+consumer", groups


def test_java_kip932_share_group(scenarios: ScenarioTap) -> None:
    group = _unique("kpmon-share")
    checked = scenarios.run(matrix.java_share, _unique("share"), group)
    assert checked.above_info() == [], checked.describe()
    assert int(checked.result["share_read"]) > 0, checked.result
    assert checked.requests(ApiKey.SHARE_GROUP_HEARTBEAT) and checked.requests(ApiKey.SHARE_FETCH)
    groups = {g.group: g for g in _report(checked).groups}
    _all_left(groups[group], "share")


def test_java_kip1071_streams_group(scenarios: ScenarioTap) -> None:
    """A Kafka Streams app with ``group.protocol=streams``: a streams group in the report, nothing
    above info."""
    app = _unique("kpmon-streams")
    checked = scenarios.run(matrix.java_streams, _unique("streams-in"), _unique("streams-out"), app)
    assert checked.above_info() == [], checked.describe()
    assert checked.result["streams_moved"] == "10", checked.result
    beats = [f for f in checked.requests(ApiKey.STREAMS_GROUP_HEARTBEAT) if f.request is not None]
    assert beats and {f.request.body["GroupId"] for f in beats if f.request is not None} == {app}, (
        checked.describe()
    )
    groups = {g.group: g for g in _report(checked).groups}
    _all_left(groups[app], "streams")


def _all_left(row: GroupRow, protocol: str) -> None:
    """A group whose members all closed cleanly: the row shows what the frames saw of it (its
    generation or epochs, every member seen and leaving), and that it ended empty."""
    assert row.protocol == protocol and row.generation >= 1 and row.members_seen >= 1, row
    assert (row.members, row.state) == (0, "Empty") and row.state_from in ("members", "describe"), row
    assert (row.members_left, row.members_fenced) == (row.members_seen, 0), row
    if protocol != "classic":
        # The clients asked for no assignor: the broker's default (named when a describe answer did).
        assert 1 <= row.member_epoch <= row.generation, row
        assert "server default" in str(row.protocol_name), row


def _conns_of(checked: Checked, client_id: str) -> set[str]:
    return {f.conn for f in checked.frames if f.request is not None and f.request.client_id == client_id}


def _report(checked: Checked) -> ReportData:
    return build_report(checked.states, checked.findings, checked.stats)


# -- a zombie per client library -------------------------------------------------------------------------


def test_librdkafka_zombie_fenced_on_add_partitions(scenarios: ScenarioTap) -> None:
    """The issue's case 1: no Produce at all, the fence comes on AddPartitionsToTxn."""
    txn = _unique("kpmon-rdz")
    checked = scenarios.run(matrix.librdkafka_zombie_on_add_partitions, _unique("rdz"), txn)
    assert checked.result["zombie_write"].startswith("rejected"), checked.describe()
    assert _above_info(checked) == {"producer.stale_epoch_rejected"}, checked.describe()
    (fenced,) = _fenced(checked)
    ev = fenced.evidence
    assert ev["rpc"].startswith("AddPartitionsToTxn v") and ev["broker_error"] in FENCES
    assert fenced.subject == f"txn:{txn}" and ev["transactional_id"] == txn
    assert (ev["client_id"], ev["newest_epoch_client_id"]) == ("kpmon-rdkafka-zombie", "kpmon-rdkafka-fencer")
    assert ev["client"] and ev["newest_epoch_client"]
    zombie_conns = {
        f.conn for f in checked.frames if f.request and f.request.client_id == "kpmon-rdkafka-zombie"
    }
    produced = [f for f in checked.requests(ApiKey.PRODUCE) if f.conn in zombie_conns]
    assert produced == []  # librdkafka raised _FENCED locally and never sent a Produce


def test_java_zombie(scenarios: ScenarioTap) -> None:
    txn = _unique("kpmon-jz")
    checked = scenarios.run(matrix.java_zombie, _unique("jz"), txn)
    assert checked.result["zombie_write"].startswith("rejected"), checked.describe()
    assert _above_info(checked) == {"producer.stale_epoch_rejected"}, checked.describe()
    findings = _fenced(checked)
    assert findings and all(f.evidence["client_id"] == "kpmon-java-zombie" for f in findings)
    assert all(f.evidence["newest_epoch_client_id"] == "kpmon-java-fencer" for f in findings)
    assert {f.subject for f in findings} == {f"txn:{txn}"}


def test_kafka_python_zombie(scenarios: ScenarioTap) -> None:
    txn = _unique("kpmon-kpyz")
    checked = scenarios.run(matrix.kafka_python_zombie, _unique("kpyz"), txn)
    assert checked.result["zombie_write"].startswith("rejected"), checked.describe()
    assert _above_info(checked) == {"producer.stale_epoch_rejected"}, checked.describe()
    findings = _fenced(checked)
    assert any(f.evidence["rpc"].startswith("EndTxn") for f in findings), checked.describe()
    assert all(f.evidence["client_id"] == "kpmon-kpy-zombie" for f in findings)


def test_raw_zombie_on_every_transactional_rpc(scenarios: ScenarioTap) -> None:
    txn = _unique("kpmon-rawz")
    checked = scenarios.run(matrix.raw_zombie, _unique("rawz"), txn, _unique("rawz-group"))
    answers = checked.result["answers"]
    by_rpc = {
        f.evidence["rpc"].split()[0]: f for f in checked.findings if f.rule.startswith("producer.stale")
    }
    assert set(by_rpc) == set(answers), checked.describe()
    for rpc, error in answers.items():
        finding = by_rpc[rpc]
        assert finding.evidence["broker_error"] == error
        # The broker's answer decides: refused is a warning, accepted a critical failure of fencing.
        expected = "producer.stale_epoch_accepted" if error == 0 else "producer.stale_epoch_rejected"
        assert finding.rule == expected, checked.describe()
        assert finding.evidence["producer_epoch"] == checked.result["fenced_epoch"]


# -- groups -----------------------------------------------------------------------------------------------


def test_kip848_member_that_keeps_a_fenced_epoch(scenarios: ScenarioTap) -> None:
    group = _unique("kpmon-fence848")
    checked = scenarios.run(matrix.member_epoch_fencing, _unique("fence848"), group)
    assert checked.result["errors"] == [ErrorCode.FENCED_MEMBER_EPOCH] * 2, checked.result
    assert _above_info(checked) == {"group.member_epoch_fenced"}, checked.describe()
    (finding,) = checked.of("group.member_epoch_fenced")
    ev = finding.evidence
    assert finding.subject == f"group:{group}"
    assert (ev["member_id"], ev["member_epoch"], ev["fenced_epoch"]) == (
        checked.result["member"],
        checked.result["sent"],
        checked.result["sent"],
    )
    assert ev["fenced_error"] == ErrorCode.FENCED_MEMBER_EPOCH and ev["client_id"] == "kpmon-raw-member"
    # The report's row: what the frames saw (the member joined, was fenced, left), not what was left.
    (row,) = [g for g in _report(checked).groups if g.group == group]
    epoch = checked.result["epoch"]
    assert (row.generation, row.member_epoch, row.protocol_name) == (epoch, epoch, "server default"), row
    assert (row.members_seen, row.members_fenced, row.members_left, row.members, row.state) == (
        1,
        1,
        1,
        0,
        "Empty",
    ), row


def test_kip848_member_refused_by_a_connect_group(scenarios: ScenarioTap) -> None:
    group = _unique("kpmon-mixed848")
    checked = scenarios.run(matrix.kip848_member_in_a_connect_group, group)
    error = checked.result["heartbeat_error"]
    assert error in (ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.INCONSISTENT_GROUP_PROTOCOL), checked.result
    assert _above_info(checked) == {"group.mixed_protocol_rejected"}, checked.describe()
    (finding,) = checked.of("group.mixed_protocol_rejected")
    assert finding.evidence["broker_error"] == error and finding.evidence["group_protocols"] == ["classic"]
    assert _client_id(checked, finding.evidence["conn"]) == "kpmon-kip848-intruder"
    assert finding.evidence["broker_message"], finding.evidence  # the broker says why (the group's type)


# -- versions ---------------------------------------------------------------------------------------------


def test_undecodable_out_of_range_version(scenarios: ScenarioTap) -> None:
    """The issue's case 2: Metadata v99 is judged from its header and is a decode error too."""
    checked = scenarios.run(matrix.undecodable_version)
    assert _above_info(checked) == {"apiversions.out_of_range", "frame.decode_error"}, checked.describe()
    (oor,) = checked.of("apiversions.out_of_range")
    assert (oor.evidence["api_key"], oor.evidence["api_version"], oor.evidence["body"]) == (
        ApiKey.METADATA,
        99,
        "undecodable",
    )
    assert oor.evidence["advertised"] == list(checked.result["advertised"])
    assert oor.severity == Severity.WARNING
    (error,) = checked.of("frame.decode_error")
    assert error.evidence["conn"] == oor.evidence["conn"]


def test_decodable_out_of_range_version(scenarios: ScenarioTap) -> None:
    """A version the codec defines but the broker did not advertise: out of range, and no decode error."""
    checked = scenarios.run(matrix.decodable_version)
    assert _above_info(checked) == {"apiversions.out_of_range"}, checked.describe()
    (oor,) = checked.of("apiversions.out_of_range")
    assert (oor.evidence["api_key"], oor.evidence["api_version"], oor.evidence["body"]) == (
        ApiKey.INIT_PRODUCER_ID,
        checked.result["version"],
        "decoded",
    )
    assert oor.evidence["advertised"] == list(checked.result["advertised"])
    assert checked.stats.decode_errors == 0
    (sent,) = [f for f in checked.requests(ApiKey.INIT_PRODUCER_ID) if f.conn == oor.evidence["conn"]]
    assert sent.request is not None and sent.request.body["Enable2Pc"] is False  # the body decoded


# -- the CI gate over the real tap topic ---------------------------------------------------------------


def test_kpmon_report_gates_on_the_matrix_tap_topic(
    scenarios: ScenarioTap,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a client library's CI does: its tests ran through the tap, then ``kpmon report --fail-on``
    reads the tap topic. Runs last in the module: the topic holds every scenario above."""
    for name in list(os.environ):
        if name.startswith("KPMON__"):
            monkeypatch.delenv(name)
    scenarios.run(matrix.member_epoch_fencing, _unique("gate"), _unique("kpmon-gate"))
    args = ["report", "--topic", scenarios.topic, "--bootstrap-servers", scenarios.cluster.mirror_bootstrap]
    args += ["--idle-timeout", "2", "--out", str(tmp_path / "r.html"), "--json", "-"]
    assert main([*args, "--fail-on", "critical"]) == EXIT_OK  # nothing critical anywhere in the matrix
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["highest_severity"] == "warning" and doc["fail_on"]["failing"] == 0
    assert main([*args, "--fail-on", "warning"]) == EXIT_FINDINGS
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "fail:" in captured.err and doc["fail_on"]["failing"] > 0
    rules = {r["rule"] for r in doc["summary"]["by_rule"] if r["severity"] != "info"}
    assert "group.member_epoch_fenced" in rules
    protocols = {g["protocol"] for g in doc["summary"]["groups"]}
    assert "consumer" in protocols, doc["summary"]["groups"]
