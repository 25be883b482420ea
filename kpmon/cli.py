"""``kpmon``: one CLI, one subcommand per job. Each subcommand lives in ``kpmon.commands.<name>``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kpconfig import __version__

#: Subcommand modules; each exposes ``register(subparsers)`` which sets ``func`` on its parser.
COMMANDS = (
    "decode",
    "schemas",
    "codec",
    "stack",
    "tap",
    "stream",
    "report",
    "export",
    "run",
    "deploy",
    "size",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kpmon",
        description="kafka-protocol-monitor: mirror, decode and check Apache Kafka's wire protocol.",
    )
    parser.add_argument("--version", action="version", version=f"kpmon {__version__}")
    parser.add_argument("--config", help="YAML config file (KPMON__SECTION__KEY env vars override it)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"kpmon.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"kpmon.commands.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"kpmon: this command needs {exc.name}, which this install does not have: "
            f"pip install 'kafka-protocol-monitor[{extra}]' (docs/dependencies.md)",
            file=sys.stderr,
        )
        return 2


#: Top-level modules of the optional parts of the distribution -> the extra that installs them.
EXTRAS = {
    "pyspark": "stream",
    "pyarrow": "stream",
    "pandas": "stream",
    "great_expectations": "stream",
    "google": "stream",
    "matplotlib": "report",
    "kafka": "run",
    "airflow": "ops",
    "scapy": "pcap",
}


if __name__ == "__main__":
    sys.exit(main())
