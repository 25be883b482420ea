"""``kpmon run``: the whole monitor in one command (what ``make run`` starts). See docs/quickstart.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kpconfig.model import ConfigError, load_config
from kpconfig.paths import kpmon_home
from kpmon.commands.tap import parse_workers as tap_workers


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a TCP port, got {text!r}")
    return int(text)


def run(args: argparse.Namespace) -> int:
    from kpmon.runner.orchestrator import Orchestrator, RunOptions
    from kpmon.runner.plan import default_state_dir, external_config

    config_path = getattr(args, "config", None)
    embedded = config_path is None
    try:
        base = load_config(config_path)
        if args.tap_workers is not None:
            base = base.model_copy(update={"tap": base.tap.model_copy(update={"workers": args.tap_workers})})
        state_dir = Path(args.state_dir) if args.state_dir else default_state_dir(base, kpmon_home())
        if not embedded:
            base = external_config(base, state_dir, f"config {config_path}")
    except ConfigError as exc:
        print(f"kpmon run: {exc}", file=sys.stderr)
        return 2
    if not embedded:
        ignored = [
            flag
            for flag, on in (("--keep-stack", args.keep_stack), ("--violation-every", args.violation_every))
            if on
        ]
        if ignored:
            print(
                f"kpmon run: {', '.join(ignored)} ignored with --config (no local stack, no demo)",
                file=sys.stderr,
            )
    options = RunOptions(
        state_dir=state_dir,
        embedded=embedded,
        duration=args.duration,
        demo=embedded and not args.no_demo,
        violation_every=args.violation_every or 60.0,
        keep_stack=args.keep_stack,
        report_every=args.report_every,
        tap_port=args.tap_port,
        verbose=args.verbose,
        fresh=args.fresh,
    )
    return Orchestrator(base, options).run()


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "run",
        help="run the whole monitor: local Kafka, tap, streaming job, demo traffic, live report",
        description=(
            "Without --config: start a local KRaft broker (in <state-dir>/run/stack), the tap in front of "
            "it (brokers advertise the tap, so clients stay on it), the streaming monitor on local[*] and "
            "demo traffic from real clients: a clean workload plus one catalogue violation every "
            "--violation-every seconds. With --config FILE: the tap and the monitor for an existing cluster "
            "(tap.listeners and the tap topic's cluster come from the file), no broker, no demo. Shows "
            "frames/s, batch lag and alerts live, and writes an HTML report to "
            "<state-dir>/run/report/index.html. Ctrl-C or SIGTERM stops everything in order."
        ),
        epilog=(
            "examples:\n"
            "  kpmon run                              # the demo on embedded defaults (make run)\n"
            "  kpmon run --violation-every 20 --duration 300\n"
            "  kpmon run --config kpmon.yaml          # an existing cluster\n"
            "ports (embedded): clients 127.0.0.1:29092 (the tap), broker 127.0.0.1:19092-19094\n"
            "(stack.base_port), metrics 9464 (tap) and 9465 (stream)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        help="monitor an existing cluster described by this YAML config (no local broker, no demo)",
    )
    parser.add_argument(
        "--state-dir", help="where state, logs and the report go (default: $KPMON_HOME, .kpmon)"
    )
    parser.add_argument("--duration", type=_positive, help="stop cleanly after this many seconds of running")
    parser.add_argument(
        "--violation-every", type=_positive, default=None, help="seconds between demo violations (default 60)"
    )
    parser.add_argument("--no-demo", action="store_true", help="no demo traffic (bring your own clients)")
    parser.add_argument("--keep-stack", action="store_true", help="leave the local Kafka running at exit")
    parser.add_argument(
        "--report-every", type=_positive, default=120.0, help="seconds between report rewrites (default 120)"
    )
    parser.add_argument(
        "--tap-port", type=_port, default=29092, help="first tap port clients connect to (default 29092)"
    )
    parser.add_argument(
        "--tap-workers",
        type=tap_workers,
        metavar="N|auto",
        help="the tap's forwarding processes (tap.workers; auto = the cores this process may use)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start the streaming job on a new checkpoint (its old state is moved aside, not deleted)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="also show every micro-batch line")
    parser.set_defaults(func=run)
