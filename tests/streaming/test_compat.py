"""Query shapes: what a checkpoint depends on, derived from the code, and when a build cannot resume one."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kpconfig.model import KpmonConfig
from streaming.compat import (
    IncompatibleCheckpoint,
    check_compatible,
    checkpoint_problems,
    describe_changes,
    query_shape,
    read_shape,
    shape_path,
    write_shape,
)
from streaming.paths import StreamPaths


def config(**stream: Any) -> KpmonConfig:
    return KpmonConfig.model_validate({"tap": {"topic": "kpmon.tap"}, "stream": stream})


@pytest.fixture(scope="module")
def shape() -> dict[str, Any]:
    return query_shape(config())


def stage(shape: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in shape["stages"] if s["name"] == name)


def keyed_variable(shape: dict[str, Any]) -> str:
    """A state variable of the stage with a struct schema (whatever the processor calls it)."""
    return next(name for name, var in stage(shape, "monitor")["state"].items() if "fields" in var["schema"])


def test_the_shape_describes_the_query(shape: dict[str, Any]) -> None:
    from checks.engine import STATE_FORMAT
    from checks.rules import all_rules

    assert [s["name"] for s in shape["stages"]] == ["monitor"], "one stateful stage"
    monitor = stage(shape, "monitor")
    assert monitor["group_by"] == ["bucket"] and monitor["bucket_of"] == "stage key"
    assert shape["state_buckets"] == 16  # 4 x the default shuffle partitions
    for declared in (monitor["state"],):
        assert declared, "a stateful stage declares state"
        for var in declared.values():
            assert var["kind"] in ("value", "list", "map")
            assert all({"name", "type", "nullable"} <= set(f) for f in var["schema"].get("fields", []))
    assert shape["state_format"] == STATE_FORMAT
    assert shape["rules"] == sorted({r.name for r in all_rules()})
    assert shape["source"] == {"format": "kafka", "topic": "kpmon.tap"}
    json.dumps(shape)  # plain data


def test_state_declared_by_the_processors_shows_up_unlisted(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    from streaming.processors import MonitorProcessor

    declared = MonitorProcessor.init

    def init(self: Any, handle: Any) -> None:
        declared(self, handle)
        handle.getMapState("seen", "key string", StructType([StructField("n", LongType(), False)]))

    before = query_shape(config())
    monkeypatch.setattr(MonitorProcessor, "init", init)
    after = query_shape(config())
    assert stage(after, "monitor")["state"]["seen"] == {
        "kind": "map",
        "key_schema": {"ddl": "key string"},
        "schema": {"fields": [{"name": "n", "type": "long", "nullable": False}]},
    }
    assert check_compatible(before, after) == []
    assert any("new state variable 'seen'" in n for n in describe_changes(before, after))
    assert any("'seen' was removed" in p for p in check_compatible(after, before))


def test_same_build_same_config_is_compatible_both_ways(shape: dict[str, Any]) -> None:
    other = query_shape(config(trigger_seconds=5.0, master="local[2]"))
    assert other == shape
    assert check_compatible(shape, other) == [] and check_compatible(other, shape) == []
    assert describe_changes(shape, other) == []


def test_what_a_checkpoint_cannot_survive(shape: dict[str, Any]) -> None:
    assert any(
        "shuffle_partitions changed 4 -> 8" in p
        for p in check_compatible(shape, query_shape(config(shuffle_partitions=8)))
    )
    assert any(
        "state_buckets changed 16 -> 7" in p
        for p in check_compatible(shape, query_shape(config(state_buckets=7)))
    )
    # The builds before one stateful stage ran two: a checkpoint of theirs is refused, saying so.
    two_stages = copy.deepcopy(shape)
    two_stages["stages"] = [
        {**stage(shape, "monitor"), "name": "connection", "bucket_of": "conn"},
        {**stage(shape, "monitor"), "name": "keyed", "bucket_of": "route_key"},
    ]
    refused = check_compatible(two_stages, shape)
    assert refused == ["stateful stages changed ['connection', 'keyed'] -> ['monitor']"]
    moved = query_shape(KpmonConfig.model_validate({"tap": {"topic": "other"}}))
    assert any("'kpmon.tap' -> 'other'" in p for p in check_compatible(shape, moved))

    newer = copy.deepcopy(shape)
    newer["state_format"] += 1
    assert check_compatible(shape, newer) == []  # a newer build reads older state...
    problems = check_compatible(newer, shape)  # ...an older one cannot read newer state
    assert len(problems) == 1 and "newer than this build reads" in problems[0]

    regrouped = copy.deepcopy(shape)
    stage(regrouped, "monitor")["group_by"] = ["rule", "key"]
    assert any("group_by changed" in p for p in check_compatible(shape, regrouped))

    assert check_compatible(shape, {**shape, "shape_version": 99})[0].startswith("query shape format")

    # A checkpoint from before the balanced bucket labels grouped by the bucket number: refused.
    numbered = {k: v for k, v in shape.items() if k != "bucket_scheme"}
    assert any(
        "bucket grouping values changed (scheme 1 -> 4)" in p for p in check_compatible(numbered, shape)
    )
    # One from before stage one's bundles bucketed connections by Spark's xxhash64: refused.
    hashed = {**shape, "bucket_scheme": 2}
    assert any("bucket grouping values changed (scheme 2 -> 4)" in p for p in check_compatible(hashed, shape))
    # One whose stage two bucketed route keys by Spark's xxhash64, not the job's one function: refused.
    keyed_by_spark = {**shape, "bucket_scheme": 3}
    assert any(
        "bucket grouping values changed (scheme 3 -> 4)" in p for p in check_compatible(keyed_by_spark, shape)
    )

    # A checkpoint from before the paged bucket state (an entry per key) has no state layout: refused,
    # with the reason, not only as the state variables it no longer declares.
    entries = {k: v for k, v in shape.items() if k != "state_layout"}
    assert any(
        "bucket state layout changed (entries -> pages-2)" in p and "new stream.checkpoint_dir" in p
        for p in check_compatible(entries, shape)
    )
    # Pages placed by a hash of the key (pages-1) are read and rewritten by this build; a build of
    # pages-1 does not read pages placed by arrival, so going back is refused.
    hashed_pages = {**shape, "state_layout": "pages-1"}
    assert check_compatible(hashed_pages, shape) == []
    assert any(
        "bucket state layout changed (pages-2 -> pages-1)" in p for p in check_compatible(shape, hashed_pages)
    )

    # Held entries of a build before exchange routes (no route_entries: format 1) are read, their
    # answers paired by the keyed shard; a build of format 1 cannot read answers carried by requests.
    separate = {k: v for k, v in shape.items() if k != "route_entries"}
    assert shape["route_entries"] == 2
    assert check_compatible(separate, shape) == []
    assert any(
        "held route entries in format 2" in p and "new stream.checkpoint_dir" in p
        for p in check_compatible(shape, separate)
    )

    # A checkpoint from before stage two was keyed by key kind has no route scheme: refused.
    older = {k: v for k, v in shape.items() if k != "route_scheme"}
    assert any("route scheme changed" in p for p in check_compatible(older, shape))


def test_state_schema_evolution_rules(shape: dict[str, Any]) -> None:
    var = keyed_variable(shape)

    def evolved(change: Any) -> dict[str, Any]:
        new = copy.deepcopy(shape)
        change(stage(new, "monitor")["state"][var]["schema"]["fields"])
        return new

    added_nullable = evolved(
        lambda fields: fields.append({"name": "extra", "type": "string", "nullable": True})
    )
    assert check_compatible(shape, added_nullable) == []
    # The rollback direction: rows written with the extra field read by a build without it.
    assert any("'extra' was removed" in p for p in check_compatible(added_nullable, shape))

    added_required = evolved(
        lambda fields: fields.append({"name": "extra", "type": "long", "nullable": False})
    )
    assert any("'extra' is not nullable" in p for p in check_compatible(shape, added_required))

    first = stage(shape, "monitor")["state"][var]["schema"]["fields"][0]
    other_type = "binary" if first["type"] != "binary" else "string"
    retyped = evolved(lambda fields: fields.__setitem__(0, {**fields[0], "type": other_type}))
    assert any(f"changed type {first['type']} -> {other_type}" in p for p in check_compatible(shape, retyped))

    dropped_var = copy.deepcopy(shape)
    del stage(dropped_var, "monitor")["state"][var]
    assert any(f"{var!r} was removed" in p for p in check_compatible(shape, dropped_var))
    assert any(f"new state variable {var!r}" in n for n in describe_changes(dropped_var, shape))

    rekinded = copy.deepcopy(shape)
    kind = stage(shape, "monitor")["state"][var]["kind"]
    stage(rekinded, "monitor")["state"][var]["kind"] = "map" if kind != "map" else "list"
    assert any("changed kind" in p for p in check_compatible(shape, rekinded))


def test_rule_changes_are_notes_not_problems(shape: dict[str, Any]) -> None:
    new = {**shape, "rules": [*shape["rules"][1:], "zzz_new_rule"]}
    assert check_compatible(shape, new) == []
    notes = describe_changes(shape, new)
    assert any("rules added" in n and "zzz_new_rule" in n for n in notes)
    assert any("rules removed" in n and shape["rules"][0] in n for n in notes)


def test_write_and_read_the_record(tmp_path: Path) -> None:
    cfg = KpmonConfig.model_validate({"state_dir": str(tmp_path)})
    path = write_shape(cfg)
    assert path == shape_path(StreamPaths.of(cfg)) == tmp_path / "stream" / "query-shape.json"
    record = read_shape(path)
    assert record is not None
    assert record["checkpoint"] == str(tmp_path / "stream" / "checkpoint")
    assert record["shape"] == query_shape(cfg)
    path.write_text("{not json")
    assert read_shape(path) is None
    assert read_shape(tmp_path / "missing.json") is None


def test_the_job_refuses_a_checkpoint_of_the_build_before_the_balanced_buckets(tmp_path: Path) -> None:
    """`kpmon stream` itself asks before Spark starts: resumed, the old checkpoint's bucket state would sit
    under grouping values this build never asks for, its connections and route keys silently lost."""
    from streaming.job import start

    cfg = KpmonConfig.model_validate({"state_dir": str(tmp_path), "stream": {"metrics_port": None}})
    assert checkpoint_problems(cfg) == []  # no checkpoint, no record: a first start
    path = write_shape(cfg)
    checkpoint = Path(StreamPaths.of(cfg).checkpoint(cfg))
    assert checkpoint_problems(cfg) == []  # a record but no checkpoint yet
    checkpoint.mkdir(parents=True)
    assert checkpoint_problems(cfg) == []  # the same build resumes its own checkpoint
    record = json.loads(path.read_text())
    del record["shape"]["bucket_scheme"]  # what the build before wrote
    path.write_text(json.dumps(record))
    assert any("scheme 1 -> 4" in p for p in checkpoint_problems(cfg))
    with pytest.raises(IncompatibleCheckpoint, match=r"(?s)cannot resume.*scheme 1 -> 4.*new checkpoint"):
        start(cfg)
    assert not StreamPaths.of(cfg).pid_file.exists()  # refused before anything started
    # A record that describes another checkpoint says nothing about this one.
    path.write_text(json.dumps({**record, "checkpoint": str(tmp_path / "elsewhere")}))
    assert checkpoint_problems(cfg) == []


def test_command_line_prints_the_record(tmp_path: Path) -> None:
    cfg = tmp_path / "kpmon.yaml"
    cfg.write_text(f"state_dir: {tmp_path}\ntap: {{topic: t1}}\n")
    done = subprocess.run(
        [sys.executable, "-m", "streaming.compat", "--config", str(cfg)],
        capture_output=True,
        text=True,
        check=True,
    )
    record = json.loads(done.stdout)
    assert record["shape"]["source"]["topic"] == "t1"
    cfg.write_text("stream: {shuffle_partitions: 0}\n")
    bad = subprocess.run(
        [sys.executable, "-m", "streaming.compat", "--config", str(cfg)], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "shuffle_partitions" in bad.stderr
