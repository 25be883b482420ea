"""Can a build resume a checkpoint? The query's shape, as plain data, and the rules for comparing two.

A Structured Streaming checkpoint stays readable only while the query keeps its shape: the same source
topic, the same stateful operators grouped by the same keys, state variables whose schemas the new build
can read, and the same number of shuffle partitions (Spark fixes it at a checkpoint's first start).
``start()`` in streaming/job.py records the running build's shape next to the job's state
(``<state_dir>/stream/query-shape.json``); the redeploy DAG compares it with a new build's shape before
stopping anything (docs/operations.md).

``query_shape`` is derived from the code that defines the query: the processors are asked which state
variables they declare (by running their ``init`` against a recording handle), so a change there shows up
here without anyone remembering to update a list.

    python -m streaming.compat --config FILE          # this build's shape for FILE, as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kpconfig.model import ConfigError, KpmonConfig, load_config
from streaming.paths import StreamPaths

#: Bumped when the layout of the shape itself changes.
SHAPE_VERSION = 1
SHAPE_FILE = "query-shape.json"
#: The grouping column of the stateful stage (``streaming.job.checks_pipeline``).
BUCKET = "bucket"
#: How a bucket becomes the grouping value its state is stored under: 1, the bucket number itself; 2,
#: ``streaming.job.bucket_labels``; 3, by CRC-32 of the connection and by Spark's xxhash64 of the route
#: key, both ``bucket_labels``; 4, every key by CRC-32 (``streaming.rows.bucket_index``), through
#: ``bucket_labels``.
BUCKET_SCHEME = 4


class _RecordingHandle:
    """Stands in for Spark's ``StatefulProcessorHandle`` and notes every state variable declared."""

    def __init__(self) -> None:
        self.variables: dict[str, dict[str, Any]] = {}

    def getValueState(self, name: str, schema: Any, ttlDurationMs: int | None = None) -> None:
        self.variables[name] = {"kind": "value", "schema": _schema(schema)}

    def getListState(self, name: str, schema: Any, ttlDurationMs: int | None = None) -> None:
        self.variables[name] = {"kind": "list", "schema": _schema(schema)}

    def getMapState(
        self, name: str, userKeySchema: Any, valueSchema: Any, ttlDurationMs: int | None = None
    ) -> None:
        self.variables[name] = {
            "kind": "map",
            "key_schema": _schema(userKeySchema),
            "schema": _schema(valueSchema),
        }


def _schema(schema: Any) -> dict[str, Any]:
    """A state schema as ``{"fields": [{name, type, nullable}]}``; a DDL string is kept as text."""
    if isinstance(schema, str):
        return {"ddl": " ".join(schema.split())}
    fields = schema.jsonValue()["fields"]
    return {
        "fields": [
            {"name": f["name"], "type": f["type"], "nullable": bool(f.get("nullable", True))} for f in fields
        ]
    }


def _declared_state(processor: Any) -> dict[str, dict[str, Any]]:
    handle = _RecordingHandle()
    processor.init(handle)
    return handle.variables


def query_shape(config: KpmonConfig) -> dict[str, Any]:
    """What a checkpoint written by this build with ``config`` depends on. Pure: no Spark session, no I/O."""
    from checks.engine import STATE_FORMAT
    from checks.routes import ROUTE_ENTRY_FORMAT
    from checks.rules import all_rules
    from checks.sharding import ROUTE_SCHEME
    from streaming.bundles import BUNDLE_SCHEMA
    from streaming.pages import PAGES_FORMAT
    from streaming.processors import OUTPUT_DDL, MonitorProcessor

    # Grouping keys and modes mirror streaming.job.checks_pipeline; the state comes from the processor.
    stages = [
        {
            "name": "monitor",
            "processor": MonitorProcessor.__name__,
            "group_by": [BUCKET],
            "bucket_of": "stage key",
            "output_mode": "Append",
            "time_mode": "EventTime",
            "input": list(BUNDLE_SCHEMA.names),
            "output": " ".join(OUTPUT_DDL.split()),
            "state": _declared_state(MonitorProcessor(config.checks.settings())),
        },
    ]
    return {
        "shape_version": SHAPE_VERSION,
        "source": {"format": "kafka", "topic": config.tap.topic},
        "shuffle_partitions": config.stream.shuffle_partitions,
        "state_buckets": config.stream.buckets,
        "bucket_scheme": BUCKET_SCHEME,
        "state_layout": pages_layout(PAGES_FORMAT),
        "state_format": STATE_FORMAT,
        "route_scheme": ROUTE_SCHEME,
        "route_entries": ROUTE_ENTRY_FORMAT,
        "stages": stages,
        "rules": sorted({rule.name for rule in all_rules()}),
    }


def _fields(schema: dict[str, Any]) -> dict[str, tuple[Any, bool]] | None:
    if "fields" not in schema:
        return None
    return {f["name"]: (f["type"], f["nullable"]) for f in schema["fields"]}


def _schema_problems(where: str, saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    old_fields, new_fields = _fields(saved), _fields(new)
    if old_fields is None or new_fields is None:
        return [] if saved == new else [f"{where}: schema changed from {saved} to {new}"]
    problems = []
    for name, (kind, _nullable) in old_fields.items():
        if name not in new_fields:
            problems.append(f"{where}: field {name!r} was removed (the checkpoint's state rows have it)")
        elif new_fields[name][0] != kind:
            problems.append(f"{where}: field {name!r} changed type {kind} -> {new_fields[name][0]}")
    for name, (_kind, nullable) in new_fields.items():
        # Avro state encoding fills a new column with null in old rows; a non-null column cannot be filled.
        if name not in old_fields and not nullable:
            problems.append(f"{where}: new field {name!r} is not nullable, so old state rows cannot have it")
    return problems


def _reads_layout(reader: str, saved: str) -> bool:
    """Whether a build whose bucket state layout is ``reader`` reads state saved in layout ``saved``:
    any build reads its own; this build also reads what ``streaming.pages`` says it reads."""
    from streaming.pages import PAGES_FORMAT, READABLE_PAGES_FORMATS

    return reader == saved or (
        reader == pages_layout(PAGES_FORMAT) and saved in {pages_layout(n) for n in READABLE_PAGES_FORMATS}
    )


def _readable_route_entries(reader: int) -> frozenset[int]:
    """The route entry formats a build that writes ``reader`` reads: this build's own list, and
    a build before exchange routes (format 1) only its own."""
    from checks.routes import READABLE_ROUTE_ENTRY_FORMATS, ROUTE_ENTRY_FORMAT

    return READABLE_ROUTE_ENTRY_FORMATS if reader == ROUTE_ENTRY_FORMAT else frozenset({reader})


def pages_layout(pages_format: int) -> str:
    """A query shape's ``state_layout`` for buckets kept in pages of ``pages_format``."""
    return f"pages-{pages_format}"


def check_compatible(saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Why a build with shape ``new`` cannot resume a checkpoint written with shape ``saved`` (empty: it can).

    Rollback safety is the same question asked the other way round: ``check_compatible(new, saved)``.
    """
    problems: list[str] = []
    if saved.get("shape_version") != SHAPE_VERSION or new.get("shape_version") != SHAPE_VERSION:
        return [
            f"query shape format {saved.get('shape_version')!r} vs {new.get('shape_version')!r}: "
            f"this kpmon compares format {SHAPE_VERSION} only"
        ]
    old_topic, new_topic = saved["source"]["topic"], new["source"]["topic"]
    if saved["source"] != new["source"]:
        problems.append(
            f"source changed ({old_topic!r} -> {new_topic!r}): the checkpoint's offsets are for {old_topic!r}"
        )
    if saved["shuffle_partitions"] != new["shuffle_partitions"]:
        problems.append(
            f"stream.shuffle_partitions changed {saved['shuffle_partitions']} -> {new['shuffle_partitions']}: "
            "a checkpoint keeps the partition count of its first start"
        )
    if saved.get("state_buckets") != new.get("state_buckets"):
        problems.append(
            f"stream.state_buckets changed {saved.get('state_buckets')} -> {new.get('state_buckets')}: "
            "each connection's and route key's state is stored under its bucket"
        )
    # A shape without it was written when a bucket's grouping value was its number (scheme 1).
    if saved.get("bucket_scheme", 1) != new.get("bucket_scheme", 1):
        problems.append(
            f"bucket grouping values changed (scheme {saved.get('bucket_scheme', 1)} -> "
            f"{new.get('bucket_scheme', 1)}): each bucket's state is stored under its grouping value"
        )
    # A shape without it was written when each connection and route key had a state entry of its own.
    if not _reads_layout(new.get("state_layout", "entries"), saved.get("state_layout", "entries")):
        problems.append(
            f"bucket state layout changed ({saved.get('state_layout', 'entries')} -> "
            f"{new.get('state_layout', 'entries')}): the checkpoint's state is kept in another layout, "
            "which this build does not read; start from a new stream.checkpoint_dir"
        )
    if saved["state_format"] > new["state_format"]:
        problems.append(
            f"monitor state format {saved['state_format']} is newer than this build reads "
            f"({new['state_format']})"
        )
    # A shape without it was written when each answer was a held entry of its own (format 1).
    saved_entries, new_entries = saved.get("route_entries", 1), new.get("route_entries", 1)
    if saved_entries not in _readable_route_entries(new_entries):
        problems.append(
            f"held route entries in format {saved_entries} (answers carried by their requests' entries), "
            f"which a build of format {new_entries} does not read: start from a new stream.checkpoint_dir"
        )
    if saved.get("route_scheme") != new.get("route_scheme"):
        problems.append(
            f"the entity keys' route scheme changed (scheme {saved.get('route_scheme')!r} -> "
            f"{new.get('route_scheme')!r}): its state is stored under keys this build does not form"
        )
    old_stages = {s["name"]: s for s in saved["stages"]}
    new_stages = {s["name"]: s for s in new["stages"]}
    if list(old_stages) != list(new_stages):
        problems.append(f"stateful stages changed {list(old_stages)} -> {list(new_stages)}")
    for name in old_stages.keys() & new_stages.keys():
        old, cur = old_stages[name], new_stages[name]
        for key in ("group_by", "bucket_of", "output_mode", "time_mode"):
            if old.get(key) != cur.get(key):
                problems.append(f"stage {name}: {key} changed {old.get(key)} -> {cur.get(key)}")
        for var, declared in old["state"].items():
            if var not in cur["state"]:
                problems.append(f"stage {name}: state variable {var!r} was removed")
                continue
            now = cur["state"][var]
            if declared["kind"] != now["kind"]:
                problems.append(
                    f"stage {name}: state variable {var!r} changed kind {declared['kind']} -> {now['kind']}"
                )
                continue
            for part in ("key_schema", "schema"):
                if part in declared or part in now:
                    problems += _schema_problems(
                        f"stage {name}, state {var!r} {part}", declared.get(part, {}), now.get(part, {})
                    )
    return problems


def describe_changes(saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Differences that do not stop a resume but are worth a line in the deploy log."""
    notes: list[str] = []
    added = sorted(set(new.get("rules", [])) - set(saved.get("rules", [])))
    removed = sorted(set(saved.get("rules", [])) - set(new.get("rules", [])))
    if added:
        notes.append(f"rules added (they start with empty state): {', '.join(added)}")
    if removed:
        notes.append(f"rules removed (their saved state expires by TTL): {', '.join(removed)}")
    if saved.get("state_format") != new.get("state_format"):
        notes.append(f"monitor state format {saved.get('state_format')} -> {new.get('state_format')}")
    if saved.get("route_entries", 1) != new.get("route_entries", 1):
        notes.append(
            f"route entry format {saved.get('route_entries', 1)} -> {new.get('route_entries', 1)} "
            "(held entries of the old format are read as they are)"
        )
    old_stages = {s["name"]: s for s in saved.get("stages", [])}
    for stage in new.get("stages", []):
        old = old_stages.get(stage["name"])
        if old is None:
            continue
        for key in ("input", "output"):
            if old.get(key) != stage.get(key):
                notes.append(f"stage {stage['name']}: {key} columns changed (not stored in state)")
        for var in stage["state"].keys() - old["state"].keys():
            notes.append(f"stage {stage['name']}: new state variable {var!r} (starts empty)")
    return notes


def shape_path(paths: StreamPaths) -> Path:
    return paths.root / SHAPE_FILE


def shape_record(config: KpmonConfig) -> dict[str, Any]:
    """The shape plus which checkpoint it describes and when it was written."""
    from kpconfig import __version__

    paths = StreamPaths.of(config)
    return {
        "checkpoint": paths.checkpoint(config),
        "kpmon_version": __version__,
        "written_at": time.time(),
        "shape": query_shape(config),
    }


class IncompatibleCheckpoint(ConfigError):
    """The checkpoint the config points at was written by a build this one cannot resume."""


def checkpoint_problems(config: KpmonConfig) -> list[str]:
    """Why this build must not resume the checkpoint ``config`` points at (empty: it may, or there is
    none, or no recorded shape describes it: a checkpoint on a cluster filesystem is not looked at)."""
    paths = StreamPaths.of(config)
    saved = read_shape(shape_path(paths))
    checkpoint = paths.checkpoint(config)
    if saved is None or saved.get("checkpoint") != checkpoint or not Path(checkpoint).exists():
        return []
    return check_compatible(saved["shape"], query_shape(config))


def refuse_incompatible(config: KpmonConfig, remedy: str) -> None:
    """Raise ``IncompatibleCheckpoint`` naming every problem when ``checkpoint_problems`` finds any."""
    problems = checkpoint_problems(config)
    if problems:
        raise IncompatibleCheckpoint(
            f"the streaming checkpoint {StreamPaths.of(config).checkpoint(config)} was written by a build "
            "this one cannot resume:\n  " + "\n  ".join(problems) + f"\n{remedy}"
        )


def write_shape(config: KpmonConfig) -> Path:
    path = shape_path(StreamPaths.of(config))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(shape_record(config), indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


def read_shape(path: Path) -> dict[str, Any] | None:
    """A record written by ``write_shape``, or None if there is none (or it is unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("shape"), dict) else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streaming.compat", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML config (KPMON__SECTION__KEY env vars override it)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"kpmon: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(shape_record(config), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
