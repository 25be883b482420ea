"""The committed schema table is exactly what the generator makes from the pinned jars."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from codec import generator
from deploy.fetch import clients_jars


def test_committed_table_matches_generator_output() -> None:
    expected = generator.render(generator.build_table(generator.by_release(clients_jars())))
    assert generator.TABLE_PATH.read_text() == expected, "schema table is stale: run `make schemas`"


def test_table_keeps_structure_and_no_prose() -> None:
    text = generator.TABLE_PATH.read_text()
    assert '"about"' not in text and "Licensed to the Apache" not in text
    table = json.loads(text)
    assert set(table["sources"]) == {"4.4.0", "3.9.2"}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("0+", [0, generator.MAX_VERSION]), ("3-5", [3, 5]), ("2", [2, 2]), ("none", None), ("", None)],
)
def test_version_ranges(spec: str, expected: list[int] | None) -> None:
    assert generator.parse_versions(spec) == expected


def test_spec_quirks_comments_string_tags_hex_defaults() -> None:
    text = '{ // c\n "a": "x//not a comment", "tag": "3" } // tail'
    assert json.loads(generator.strip_comments(text)) == {"a": "x//not a comment", "tag": "3"}
    field = generator._normalize_field(
        {
            "name": "MaxBytes",
            "type": "int32",
            "versions": "3+",
            "default": "0x7fffffff",
            "tag": "1",
            "taggedVersions": "3+",
        },
        {},
    )
    assert field["default"] == 0x7FFFFFFF and field["tag"] == 1
    header = generator._normalize_field(
        {"name": "ClientId", "type": "string", "versions": "1+", "flexibleVersions": "none"}, {}
    )
    assert header["flexibleVersions"] == "none"


def test_unstable_latest_and_common_structs_are_resolved() -> None:
    table = json.loads(generator.TABLE_PATH.read_text())
    by_name = {m["name"]: m for m in table["messages"]}
    assert any(seg.get("latestVersionUnstable") for m in by_name.values() for seg in m["segments"])
    # AddPartitionsToTxnResponse uses commonStructs; they are inlined as nested fields.
    results = by_name["AddPartitionsToTxnResponse"]["segments"][0]["fields"]
    assert all("fields" in f or not f["type"].lstrip("[]")[:1].isupper() for f in results)


def _jar(path: Path, properties: str | None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        if properties is not None:
            zf.writestr("kafka/kafka-version.properties", properties)
    return path


def test_jars_are_keyed_by_the_release_they_say_newest_first(tmp_path: Path) -> None:
    old = _jar(tmp_path / "a.jar", "commitId=1\nversion=3.9.2\n")
    new = _jar(tmp_path / "b.jar", "version=4.10.0\ncommitId=2\n")
    mid = _jar(tmp_path / "c.jar", "version=4.4.0\n")
    assert generator.by_release([old, new, mid]) == {"4.10.0": new, "4.4.0": mid, "3.9.2": old}
    with pytest.raises(generator.SpecError, match="not a kafka-clients jar"):
        generator.jar_release(_jar(tmp_path / "d.jar", None))
