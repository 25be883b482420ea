"""Dataclasses whose ``__init__`` is written out (``@dataclass(init=False)``, so that mypyc compiles it:
the generated one runs as Python) take exactly their fields: every field, in field order, with the
field's default, each stored under its own name. Read from the source, so a field added to the class
and not to its ``__init__`` fails here, compiled or not."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("checks", "codec", "streaming", "tap")


def _is_init_false_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "dataclass":
            for keyword in decorator.keywords:
                if keyword.arg == "init" and isinstance(keyword.value, ast.Constant):
                    return keyword.value.value is False
    return False


def _classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and _is_init_false_dataclass(node):
                    found.append((f"{path.relative_to(ROOT)}:{node.name}", node))
    return found


CLASSES = _classes()


def _field_default(value: ast.expr | None) -> str | None:
    """A field's default as source (``field(default=X, ...)`` gives X); None: required."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return ast.unparse(keyword.value)
        return None
    return ast.unparse(value)


def test_the_written_inits_are_found() -> None:
    names = {name.split(":")[1] for name, _ in CLASSES}
    assert {"TapFrame", "Route"} <= names


@pytest.mark.parametrize(("name", "node"), CLASSES, ids=[name for name, _ in CLASSES])
def test_a_written_init_takes_exactly_the_fields(name: str, node: ast.ClassDef) -> None:
    fields = [
        (stmt.target.id, _field_default(stmt.value))
        for stmt in node.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    ]
    (init,) = [s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"]
    args = init.args.args[1:]
    defaults: list[str | None] = [None] * (len(args) - len(init.args.defaults))
    defaults += [ast.unparse(d) for d in init.args.defaults]
    assert [(a.arg, d) for a, d in zip(args, defaults, strict=True)] == fields
    stored = {
        target.attr: ast.unparse(stmt.value)
        for stmt in init.body
        if isinstance(stmt, ast.Assign)
        for target in stmt.targets
        if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self"
    }
    assert stored == {field: field for field, _ in fields}
