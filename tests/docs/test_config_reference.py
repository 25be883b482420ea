"""docs/config.md documents every field of ``KpmonConfig`` with the model's default, and its examples load.

The field list comes from walking the pydantic model (``model_fields``, through nested sections, optional
sections and lists of sections), so a field added to ``kpconfig/model.py`` fails here until it is documented.
"""

from __future__ import annotations

import re
import shlex
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kpconfig.model import ConfigError, KpmonConfig, load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def _sections(annotation: Any) -> Iterator[type[BaseModel]]:
    """Model classes inside an annotation (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _sections(arg)


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return any(_is_list(a) for a in typing.get_args(annotation))
    return False


def field_paths(model: type[BaseModel] = KpmonConfig, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    for name, info in model.model_fields.items():
        path = prefix + name
        yield path, info
        for section in _sections(info.annotation):
            yield from field_paths(section, path + ("[]." if _is_list(info.annotation) else "."))


def doc_rows(text: str) -> dict[str, list[str]]:
    """Rows of the ``| field | type | default | meaning |`` tables, by field path."""
    rows: dict[str, list[str]] = {}
    in_table = False
    for line in text.splitlines():
        if line == "| field | type | default | meaning |":
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
        match = re.match(r"^\| `([a-z_][a-z0-9_.\[\]]*)` \|", line)
        if not in_table or match is None:
            continue
        # Cells may contain escaped pipes (``str \| null``).
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        assert match.group(1) not in rows, f"docs/config.md documents {match.group(1)} twice"
        rows[match.group(1)] = cells
    return rows


def yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)


def _expected_default(info: FieldInfo) -> Any:
    value = info.get_default(call_default_factory=True)
    if isinstance(value, list):
        return [
            v.model_dump(mode="json", exclude_defaults=True) if isinstance(v, BaseModel) else v for v in value
        ]
    if isinstance(value, tuple):
        return list(value)
    return value


@pytest.fixture(scope="module")
def text() -> str:
    return DOC.read_text()


@pytest.fixture(scope="module")
def rows(text: str) -> dict[str, list[str]]:
    return doc_rows(text)


def test_the_walk_reaches_nested_and_listed_sections() -> None:
    paths = {path for path, _ in field_paths()}
    # Guards the walker: these are one level inside a list, an optional section, and both.
    assert {
        "tap.listeners[].tls_keyfile",
        "tap.cluster.properties",
        "alerts.hooks[].cluster.properties",
    } <= paths
    assert len(paths) > 90


def test_every_field_is_documented(rows: dict[str, list[str]]) -> None:
    missing = [path for path, _ in field_paths() if path not in rows]
    assert not missing, f"docs/config.md has no row for {missing}"


def test_no_row_for_a_field_that_does_not_exist(rows: dict[str, list[str]]) -> None:
    stale = sorted(set(rows) - {path for path, _ in field_paths()})
    assert not stale, f"docs/config.md documents fields the model does not have: {stale}"


def test_documented_defaults_are_the_models(rows: dict[str, list[str]]) -> None:
    wrong = []
    for path, info in field_paths():
        cells = rows.get(path)
        if cells is None:
            continue  # test_every_field_is_documented reports it
        assert len(cells) == 4, f"{path}: expected | field | type | default | meaning |, got {cells}"
        default = cells[2]
        if info.is_required():
            if default != "required":
                wrong.append(f"{path}: required, documented as {default!r}")
            continue
        value = info.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            if default != "(section)":
                wrong.append(f"{path}: a section, documented as {default!r}")
            continue
        code = re.fullmatch(r"`([^`]*)`", default)
        if code is None:
            wrong.append(f"{path}: default {default!r} is not one YAML value in backticks")
            continue
        documented = yaml.safe_load(code.group(1))
        if documented != _expected_default(info) or isinstance(documented, bool) != isinstance(value, bool):
            wrong.append(f"{path}: documented {documented!r}, the model has {value!r}")
    assert not wrong, "\n".join(wrong)


def test_the_example_validates_and_sets_every_section(text: str) -> None:
    blocks = yaml_blocks(text)
    assert blocks, "docs/config.md has no yaml example"
    for block in blocks:
        raw = yaml.safe_load(block)
        assert set(raw) == set(KpmonConfig.model_fields), "the example should show every top-level section"
        config = KpmonConfig.model_validate(raw)
        assert config.tap.listeners and config.alerts.hooks


def test_the_example_loads_from_a_file(text: str, tmp_path: Path) -> None:
    path = tmp_path / "kpmon.yaml"
    path.write_text(yaml_blocks(text)[0])
    config = load_config(path, environ={})
    assert config.tap.listeners[0].broker_tls
    assert "sasl.password" not in config.kafka.properties


def _env_examples(text: str) -> list[tuple[str, str]]:
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0].startswith("KPMON__"):
                name, _, value = words[0].partition("=")
                out.append((name, value))
    return out


def test_env_examples_load(text: str) -> None:
    examples = _env_examples(text)
    assert len(examples) >= 5
    for name, value in examples:
        try:
            load_config(None, environ={name: value})
        except ConfigError as exc:
            pytest.fail(f"docs/config.md example {name}={value!r} does not load: {exc}")


def test_env_behaviour_the_doc_describes(tmp_path: Path) -> None:
    path = tmp_path / "kpmon.yaml"
    path.write_text("kafka:\n  properties:\n    security.protocol: SASL_SSL\n")
    merged = load_config(path, environ={"KPMON__KAFKA__PROPERTIES__sasl.password": "pw"})
    assert merged.kafka.properties == {"security.protocol": "SASL_SSL", "sasl.password": "pw"}
    replaced = load_config(path, environ={"KPMON__KAFKA__PROPERTIES": "{sasl.mechanism: PLAIN}"})
    assert replaced.kafka.properties == {"sasl.mechanism": "PLAIN"}
    assert load_config(None, environ={"KPMON__TAP__METRICS_PORT": "null"}).tap.metrics_port is None
    with pytest.raises(ConfigError, match=r"alerts\.hooks"):
        load_config(None, environ={"KPMON__ALERTS__HOOKS__0__URL": "http://x"})
    lowered = load_config(
        None, environ={"KPMON__ALERTS__HOOKS": '[{kind: webhook, url: "http://x", headers: {X-Token: t}}]'}
    )
    assert lowered.alerts.hooks[0].headers == {"X-Token": "t"}
    per_key = load_config(None, environ={"KPMON__KAFKA__PROPERTIES__X.Y": "'1'"})
    assert per_key.kafka.properties == {"x.y": "1"}  # names lower-cased; the quotes keep "1" a string
    with pytest.raises(ConfigError, match=r"kafka\.properties\.linger\.ms"):
        load_config(None, environ={"KPMON__KAFKA__PROPERTIES__linger.ms": "5"})  # an int, not a string


def test_secret_quoting_the_doc_recommends() -> None:
    name = "KPMON__KAFKA__PROPERTIES__sasl.password"
    assert load_config(None, environ={name: "'pa ss #x'"}).kafka.properties["sasl.password"] == "pa ss #x"
    # Unquoted, YAML reads " #" as a comment: the doc warns that the rest is lost.
    assert load_config(None, environ={name: "pa ss #x"}).kafka.properties["sasl.password"] == "pa ss"
    assert load_config(None, environ={name: "'it''s'"}).kafka.properties["sasl.password"] == "it's"
