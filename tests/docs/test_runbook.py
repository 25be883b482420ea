"""docs/runbook.md has a section for every rule id the code can put in an alert, and nothing else.

The ids are read from the source, not from a list someone keeps: ``ctx.emit`` calls in ``checks/``,
the ``envelope.inner_`` prefix built in ``checks/rule.py``, the ``Check`` entries of
``streaming/quality_suites.py`` and the ``ops_alert`` calls of ``airflow_dags/``. Severities come from
the same calls, so a section's **Severity** line cannot leave one out.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
SEVERITIES = ("info", "warning", "critical")
LABELS = ("**Means:**", "**Severity:**", "**KIP:**", "**Likely causes:**", "**Evidence:**", "**Do:**")

Rules = dict[str, set[str]]


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` assignments."""
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _assigned_values(scope: ast.AST, name: str) -> Iterator[ast.AST]:
    for node in ast.walk(scope):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        value = getattr(node, "value", None)
        if value is not None and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            yield value


def _severities(expr: ast.AST, scopes: list[ast.AST]) -> set[str]:
    """``Severity.X`` named in ``expr``, following plain names to their assignments in ``scopes``."""
    found: set[str] = set()
    seen: set[str] = set()
    todo = [expr]
    while todo:
        node = todo.pop()
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "Severity"
            ):
                found.add(sub.attr.lower())
            elif isinstance(sub, ast.Name) and sub.id not in seen and sub.id != "Severity":
                seen.add(sub.id)
                for scope in scopes:
                    todo.extend(_assigned_values(scope, sub.id))
    return found


def _calls_in_functions(tree: ast.Module) -> Iterator[tuple[ast.Call, ast.AST]]:
    """Every call with the innermost function that contains it (or the module)."""
    owners: dict[ast.AST, ast.AST] = {}
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and node is not func:
                    owners[node] = func  # later (inner) functions overwrite outer ones
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, owners.get(node, tree)


def _rule_id(arg: ast.AST, constants: dict[str, str]) -> str:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    name = arg.id if isinstance(arg, ast.Name) else arg.attr if isinstance(arg, ast.Attribute) else None
    if name is None or name not in constants:
        raise AssertionError(f"cannot resolve the rule id {ast.dump(arg)}: extend tests/docs/test_runbook.py")
    return constants[name]


def _prefix(tree: ast.Module, starts: str) -> str:
    """The literal head of the f-string that begins with ``starts`` (how ids get a prefix)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if (
                isinstance(head, ast.Constant)
                and isinstance(head.value, str)
                and head.value.startswith(starts)
            ):
                return head.value
    raise AssertionError(f"no f-string starting with {starts!r}")


def check_rules() -> Rules:
    """Rule id -> severities of every ``ctx.emit`` in checks/."""
    out: Rules = {}
    for path in sorted((ROOT / "checks").rglob("*.py")):
        tree = _parse(path)
        constants = _string_constants(tree)
        for call, owner in _calls_in_functions(tree):
            func = call.func
            if not (isinstance(func, ast.Attribute) and func.attr == "emit" and len(call.args) >= 2):
                continue
            if isinstance(owner, ast.FunctionDef) and owner.name == "emit":
                continue  # RuleContext.emit passes its caller's rule id on to the engine's
            rule = _rule_id(call.args[0], constants)
            out.setdefault(rule, set()).update(_severities(call.args[1], [owner, tree]))
    return out


def envelope_inner_rules(base: Rules) -> Rules:
    """What ``Context.emit`` makes of every rule a forwarded exchange can break (``checks.alerts``)."""
    from checks.alerts import ENVELOPE_INNER_PREFIX, inner_rule_ids

    return {rule: base[rule.removeprefix(ENVELOPE_INNER_PREFIX)] for rule in inner_rule_ids(base)}


def catalogue_rules() -> set[str]:
    """``CATALOGUE_RULES`` of the quality gate: ids its ``rule_known`` expectation accepts."""
    tree = _parse(ROOT / "streaming" / "quality_suites.py")
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "CATALOGUE_RULES" for t in node.targets
        ):
            return {
                n.value
                for n in ast.walk(node.value)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
    raise AssertionError("CATALOGUE_RULES not found")


def quality_rules() -> Rules:
    tree = _parse(ROOT / "streaming" / "quality_suites.py")
    prefix = _prefix(tree, "quality.")
    out: Rules = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Check":
            name = node.args[1]
            assert isinstance(name, ast.Constant) and isinstance(name.value, str)
            out[prefix + name.value] = _severities(node.args[2], [tree])
    return out


def ops_rules() -> Rules:
    constants = _string_constants(_parse(ROOT / "airflow_dags" / "opsalerts.py"))
    out: Rules = {}
    for path in sorted((ROOT / "airflow_dags").glob("*.py")):
        tree = _parse(path)
        local = {**constants, **_string_constants(tree)}
        for call, owner in _calls_in_functions(tree):
            func = call.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name != "ops_alert" or len(call.args) < 2:
                continue
            rule = _rule_id(call.args[0], local)
            out.setdefault(rule, set()).update(_severities(call.args[1], [owner, tree]))
    return out


def sections(text: str) -> dict[str, str]:
    """``### `id` `` heading -> the text up to the next heading."""
    out: dict[str, str] = {}
    matches = list(re.finditer(r"^#{2,3} .*$", text, flags=re.MULTILINE))
    for i, match in enumerate(matches):
        head = re.fullmatch(r"### `([^`]+)`", match.group(0))
        if head is None:
            continue
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        assert head.group(1) not in out, f"two sections for {head.group(1)}"
        out[head.group(1)] = text[match.end() : end]
    return out


def severity_line(section: str) -> str:
    line = next((ln for ln in section.splitlines() if ln.startswith("- **Severity:**")), None)
    assert line is not None
    return line


@pytest.fixture(scope="module")
def runbook() -> dict[str, str]:
    return sections(RUNBOOK.read_text())


@pytest.fixture(scope="module")
def base() -> Rules:
    return check_rules()


def test_the_collectors_find_what_the_code_emits(base: Rules) -> None:
    # Guards the collectors themselves: if they stopped resolving ids, every other test would pass empty.
    assert base["producer.stale_epoch_accepted"] == {"critical"}
    assert base["producer.sequence_duplicate"] == {"info", "warning", "critical"}
    assert base["flex.tagged_fields"] == {"info", "warning"}
    assert {"tap.gap", "frame.decode_error", "group.protocol_type_mismatch"} <= set(base)
    assert "envelope.inner_txn.pid_hijack" in envelope_inner_rules(base)
    assert "envelope.inner_txn.hanging" not in envelope_inner_rules(base)  # a timer's, never an exchange's
    assert "envelope.inner_envelope.untrusted_source" not in envelope_inner_rules(base)
    assert quality_rules()["quality.no_stale_epoch_accepted"] == {"critical"}
    ops = ops_rules()
    assert ops["ops.redeploy_rolled_back"] == {"critical"}
    assert ops["ops.stream_unhealthy"] == {"critical", "warning"}
    assert set(base) <= catalogue_rules()


def test_every_rule_the_code_emits_has_a_section(runbook: dict[str, str], base: Rules) -> None:
    wanted = {**base, **{r: set() for r in catalogue_rules() - set(base)}, **quality_rules(), **ops_rules()}
    missing = sorted(set(wanted) - set(runbook))
    assert not missing, f"docs/runbook.md has no section for {missing}"
    for rule, severities in wanted.items():
        section = runbook[rule]
        absent = [label for label in LABELS if label not in section]
        assert not absent, f"section {rule} lacks {absent}"
        line = severity_line(section)
        left_out = sorted(s for s in severities if not re.search(rf"\b{s}\b", line))
        assert not left_out, f"section {rule}: the code can emit it at {left_out}: {line}"


def test_every_envelope_inner_id_is_listed(runbook: dict[str, str], base: Rules) -> None:
    section = runbook["envelope.inner_*"]
    for label in LABELS:
        assert label in section
    from checks.alerts import inner_rule_ids

    inner = set(envelope_inner_rules(base)) | inner_rule_ids(catalogue_rules())
    unlisted = sorted(rule for rule in inner if f"`{rule}`" not in section)
    assert not unlisted, f"envelope.inner_* section does not list {unlisted}"
    listed = set(re.findall(r"`(envelope\.inner_[a-z0-9_.]+)`", section))
    assert not listed - inner, f"envelope.inner_* section lists ids nothing emits: {sorted(listed - inner)}"


def test_no_section_for_a_rule_the_code_does_not_emit(runbook: dict[str, str], base: Rules) -> None:
    known = set(base) | catalogue_rules() | set(quality_rules()) | set(ops_rules()) | {"envelope.inner_*"}
    stale = sorted(set(runbook) - known)
    assert not stale, f"docs/runbook.md describes ids nothing emits: {stale}"


def test_every_rule_links_to_its_own_section() -> None:
    """Alerts carry ``runbook_url`` = base + ``runbook_anchor(rule)``: the anchor must be the heading of
    that rule's section in docs/runbook.md (as GitHub renders it), for every id the code can emit."""
    from checks.alerts import runbook_anchor
    from tests.docs.test_doc_paths import slug

    text = RUNBOOK.read_text()
    headings = {slug(h): h for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}
    base_rules = check_rules()
    rules = (
        set(base_rules)
        | catalogue_rules()
        | set(quality_rules())
        | set(ops_rules())
        | set(envelope_inner_rules(base_rules))
    )
    assert len(rules) > 40
    for rule in sorted(rules):
        anchor = runbook_anchor(rule)
        assert anchor in headings, f"{rule}: docs/runbook.md has no heading with anchor #{anchor}"
        expected = "envelope.inner_*" if rule.startswith("envelope.inner_") else rule
        assert headings[anchor] == f"`{expected}`", (rule, headings[anchor])
