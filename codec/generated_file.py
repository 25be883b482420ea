"""The ``--write`` / ``--check`` command of a file generated from upstream definitions.

Three files are generated and committed (``make schemas``): the schema table (``codec.generator``),
the protocol constants (``codec.protocol_gen``) and the tap's password-type config keys
(``deploy.password_configs_gen``). Each generator's ``main`` is this one function, so they all write,
check and report a stale file the same way.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(
    argv: list[str] | None,
    *,
    path: Path,
    generate: Callable[[list[Path]], str],
    command: str,
    description: str | None,
    errors: tuple[type[Exception], ...] = (),
    inputs: str | None = None,
) -> int:
    """Exit code of ``command --write|--check [INPUT...]``: 0 written or up to date, 1 stale, 2
    ``generate`` failed with one of ``errors`` (a missing jar, say: said on stderr, not as a traceback).

    ``inputs``, when given, is the help of the input files the command takes (one or more), which
    ``generate`` receives; without it ``generate`` receives an empty list."""
    parser = argparse.ArgumentParser(
        prog=command, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite {path.name}")
    mode.add_argument(
        "--check", action="store_true", help=f"fail (exit 1) when the committed {path.name} is stale"
    )
    if inputs is not None:
        parser.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help=inputs)
    args = parser.parse_args(argv)
    try:
        text = generate(list(args.inputs) if inputs is not None else [])
    except errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.write:
        path.write_text(text)
        print(f"wrote {path} ({len(text)} bytes)", file=sys.stderr)
        return 0
    if not path.exists() or path.read_text() != text:
        print(f"{path} is stale: run {command} --write (or make schemas)", file=sys.stderr)
        return 1
    return 0
