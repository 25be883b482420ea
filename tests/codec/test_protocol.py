"""codec.protocol: generated from its sources, complete, and the only place protocol numbers are written."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from codec.protocol import ApiKey, ErrorCode
from codec.protocol_gen import ERRORS_PATH, MODULE_PATH, render, upper_snake
from codec.schema import load_table

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("codec", "checks", "tap", "streaming", "kpconfig", "kpmon", "airflow_dags", "deploy")
#: Files that still spell protocol numbers out, and why. An entry that is no longer true fails the test,
#: so the list only shrinks.
KNOWN_LEFTOVERS: dict[str, set[str]] = {}


def test_the_committed_module_is_what_the_generator_writes() -> None:
    assert MODULE_PATH.read_text() == render(load_table()), "run: python -m codec.protocol_gen --write"


def test_every_api_in_the_schema_table_has_a_member() -> None:
    table = load_table()
    assert {m.value for m in ApiKey} == set(table.requests)
    for key in table.requests:
        assert ApiKey(key).name == upper_snake(table.api_name(key))


def test_names_follow_kafkas_spelling() -> None:
    assert upper_snake("InitProducerId") == "INIT_PRODUCER_ID"
    assert upper_snake("ApiVersions") == "API_VERSIONS"
    assert upper_snake("OffsetForLeaderEpoch") == "OFFSET_FOR_LEADER_EPOCH"
    assert (ApiKey.PRODUCE, ApiKey.ENVELOPE, ApiKey.INIT_PRODUCER_ID) == (0, 58, 22)
    assert (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.API_VERSIONS) == (11, 14, 18)


def test_error_codes_match_kafka() -> None:
    data = json.loads(ERRORS_PATH.read_text())
    names = [name for name, _ in data["errors"]]
    codes = [code for _, code in data["errors"]]
    assert len(set(names)) == len(names) and len(set(codes)) == len(codes)
    assert data["source"]["class"] == "org.apache.kafka.common.protocol.Errors"
    assert ErrorCode.NONE == 0 and ErrorCode.UNKNOWN_SERVER_ERROR == -1
    assert ErrorCode.INVALID_PRODUCER_EPOCH == 47
    assert ErrorCode.PRODUCER_FENCED == 90
    assert ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER == 45
    assert ErrorCode.DUPLICATE_SEQUENCE_NUMBER == 46
    assert ErrorCode.INCONSISTENT_GROUP_PROTOCOL == 23
    assert ErrorCode.UNSUPPORTED_VERSION == 35


def _int_constants(tree: ast.AST) -> set[str]:
    """Names bound to integer literals at module or class level: ``X = 58`` and ``A, B = 11, 14``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for name, value in zip(names, values, strict=False):
                if (
                    isinstance(name, ast.Name)
                    and isinstance(value, ast.Constant)
                    and type(value.value) is int
                ) or (
                    isinstance(name, ast.Name)
                    and isinstance(value, ast.UnaryOp)
                    and isinstance(value.operand, ast.Constant)
                ):
                    found.add(name.id)
    return found


def redefinitions() -> dict[str, set[str]]:
    protocol_names = {m.name for m in ApiKey} | {m.name for m in ErrorCode if m.name != "NONE"}
    out: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ("codec/protocol.py",):
                continue
            hits = _int_constants(ast.parse(path.read_text(), rel)) & protocol_names
            if hits:
                out[rel] = hits
    return out


def test_no_protocol_constant_is_written_out_outside_codec_protocol() -> None:
    found = redefinitions()
    unexpected = {f: names - KNOWN_LEFTOVERS.get(f, set()) for f, names in found.items()}
    assert not {f: n for f, n in unexpected.items() if n}, "import ApiKey / ErrorCode from codec.protocol"
    stale = {f: names - found.get(f, set()) for f, names in KNOWN_LEFTOVERS.items()}
    assert not {f: n for f, n in stale.items() if n}, "fixed: remove it from KNOWN_LEFTOVERS"


def test_the_scan_finds_a_redefinition() -> None:
    assert _int_constants(ast.parse("ENVELOPE = 58\nJOIN_GROUP, SYNC_GROUP = 11, 14\nX = -1")) == {
        "ENVELOPE",
        "JOIN_GROUP",
        "SYNC_GROUP",
        "X",
    }
    assert _int_constants(ast.parse("ENVELOPE = ApiKey.ENVELOPE")) == set()


def test_severity_rank_has_one_definition() -> None:
    from checks.model import SEVERITY_RANK, Severity
    from streaming.hooks import core, formatters, policy

    assert [s.rank for s in Severity] == [0, 1, 2]
    assert policy.SEVERITY_RANK is SEVERITY_RANK and core.SEVERITY_RANK is SEVERITY_RANK
    assert formatters.SEVERITIES == ("info", "warning", "critical")
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            assert '"info": 0' not in text and '("info", "warning", "critical").index' not in text, path
