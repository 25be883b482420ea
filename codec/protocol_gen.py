"""Generate ``codec/protocol.py``: the ``ApiKey`` and ``ErrorCode`` enums every package imports.

``python -m codec.protocol_gen --write`` (run by ``make schemas`` after the schema table) rewrites the
module; ``--check`` exits non-zero when the committed module differs. ``tests/codec/test_protocol.py``
runs the check, so the enums cannot drift from their sources.

Why a generated module and not an enum built at import: mypy and editors see the members
(``ApiKey.PRODUCE`` is checked statically), and importing the constants costs nothing, not a parse of
the 2 MB schema table (the tap imports them on its hot path).

- ``ApiKey`` comes from ``codec/schema_table.json`` (one member per request spec, named in UPPER_SNAKE
  after the API: ``InitProducerId`` → ``INIT_PRODUCER_ID``).
- ``ErrorCode`` comes from ``codec/error_codes.json``. Error codes are Java code in Kafka
  (``org.apache.kafka.common.protocol.Errors``), not message JSON, so the schema table does not hold
  them. The JSON was generated once from the pinned kafka-clients jar (its ``source`` says which and
  how); regenerate it the same way when the pinned release changes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from codec.generated_file import write_or_check
from codec.schema import SchemaTable, load_table

MODULE_PATH = Path(__file__).with_name("protocol.py")
ERRORS_PATH = Path(__file__).with_name("error_codes.json")

_WORD_BREAK = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def upper_snake(api_name: str) -> str:
    """``InitProducerId`` → ``INIT_PRODUCER_ID`` (Kafka's own ApiKeys enum spells them the same way)."""
    return _WORD_BREAK.sub("_", api_name).upper()


def api_members(table: SchemaTable) -> list[tuple[str, int]]:
    members = [(upper_snake(table.api_name(key)), key) for key in sorted(table.requests)]
    names = [name for name, _ in members]
    if len(set(names)) != len(names):
        raise ValueError(
            f"API names collide in UPPER_SNAKE: {sorted(n for n in names if names.count(n) > 1)}"
        )
    return members


def error_members(path: Path = ERRORS_PATH) -> tuple[dict[str, str], list[tuple[str, int]]]:
    data = json.loads(path.read_text())
    return data["source"], [(name, int(code)) for name, code in data["errors"]]


def render(table: SchemaTable, errors_path: Path = ERRORS_PATH) -> str:
    source, errors = error_members(errors_path)
    releases = ", ".join(sorted(table.sources))
    lines = [
        '"""Kafka protocol constants: API keys and error codes. GENERATED, do not edit.',
        "",
        "Written by ``python -m codec.protocol_gen --write`` (``make schemas``): ``ApiKey`` from",
        f"``codec/schema_table.json`` (kafka-clients {releases}), ``ErrorCode`` from ``codec/error_codes.json``",
        f"({source['class']} in {source['artifact']}). Import these instead of writing the numbers out.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from enum import IntEnum",
        "",
        "",
        "class ApiKey(IntEnum):",
        '    """Every API in the schema table, by the name Kafka gives it."""',
        "",
        *(f"    {name} = {key}" for name, key in api_members(table)),
        "",
        "",
        "class ErrorCode(IntEnum):",
        '    """Every error code of ``org.apache.kafka.common.protocol.Errors``."""',
        "",
        *(f"    {name} = {code}" for name, code in errors),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return write_or_check(
        argv,
        path=MODULE_PATH,
        generate=lambda _: render(load_table()),
        command="python -m codec.protocol_gen",
        description=__doc__,
    )


if __name__ == "__main__":
    sys.exit(main())
