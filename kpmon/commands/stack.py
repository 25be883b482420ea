"""``kpmon stack up|down|status|logs``: the real local Kafka stack (see docs/stack.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kpconfig.model import ConfigError, StackConfig, load_config
from kpconfig.paths import kpmon_home


def _stack_config(args: argparse.Namespace) -> StackConfig:
    """The ``stack`` config section with command-line flags applied on top."""
    try:
        section = load_config(getattr(args, "config", None)).stack
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from exc
    overrides: dict[str, Any] = {}
    for flag, key in (("brokers", "brokers"), ("sasl", "sasl"), ("kafka_version", "kafka_version")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    if getattr(args, "base_port", None) is not None:
        overrides["base_port"] = args.base_port
    if getattr(args, "home", None) is not None:
        overrides["home"] = args.home
    try:
        return StackConfig.model_validate(section.model_dump() | overrides)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc


def _home(config: StackConfig) -> Path:
    return Path(config.home) if config.home else kpmon_home() / "stack"


def _print_status(status: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(status, indent=2))
        return
    print(f"stack {status['state']}: Kafka {status['kafka_version']} in {status['home']}")
    print(f"  bootstrap servers: {status['bootstrap_servers']}")
    for node in status["nodes"]:
        where = f"port {node['client_port']}" if node["client_port"] else "controller only"
        if node["advertised"]:
            where += f", advertised as {node['advertised']}"
        alive = f"pid {node['pid']}" if node["alive"] else "not running"
        print(f"  node {node['node_id']} ({'+'.join(node['roles'])}): {where}, {alive}")
    for mechanism, user in status["sasl_users"].items():
        print(f"  SASL {mechanism}: {user['username']} / {user['password']}")


def _up(args: argparse.Namespace) -> int:
    from deploy.local.stack import LocalStack, StackError
    from kpconfig.mvn import FetchError

    config = _stack_config(args)
    stack = LocalStack(_home(config), config.kafka_version, config.brokers, config.sasl, config.base_port)
    try:
        stack.up(timeout=config.startup_timeout)
    except (StackError, FetchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print_status(stack.status(), args.json)
    return 0


def _existing(args: argparse.Namespace) -> Any:
    from deploy.local.stack import LocalStack, StackError

    try:
        return LocalStack.open(_home(_stack_config(args)))
    except StackError:
        return None


def _down(args: argparse.Namespace) -> int:
    stack = _existing(args)
    if stack is None:
        print("no stack to stop", file=sys.stderr)
        return 0
    stack.down()
    print(f"stack in {stack.home} stopped", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    stack = _existing(args)
    if stack is None:
        status: dict[str, Any] = {"state": "absent", "home": str(_home(_stack_config(args)))}
        print(json.dumps(status) if args.json else f"no stack in {status['home']}")
        return 3
    status = stack.status()
    _print_status(status, args.json)
    return 0 if status["state"] == "running" else 3


def _logs(args: argparse.Namespace) -> int:
    stack = _existing(args)
    if stack is None:
        print("no stack (nothing was started)", file=sys.stderr)
        return 1
    print(stack.logs(args.node, args.lines))
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "stack",
        help="start/stop a real local Kafka (KRaft) stack",
        description=(
            "A real Apache Kafka cluster on 127.0.0.1, from jars cached from Maven Central. "
            "State and logs live in $KPMON_HOME/stack (or stack.home / --home)."
        ),
    )
    parser.set_defaults(func=lambda _args: parser.print_help() or 2)
    actions = parser.add_subparsers(dest="stack_command", metavar="ACTION")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", help="stack directory (default: $KPMON_HOME/stack)")

    up = actions.add_parser(
        "up",
        parents=[common],
        help="start the stack (harmless if it is running) and wait until brokers answer metadata",
    )
    up.add_argument("--brokers", type=int, choices=(1, 3), help="1 combined node (default) or 3 brokers")
    up.add_argument(
        "--sasl", action=argparse.BooleanOptionalAction, default=None, help="SASL_PLAINTEXT listener"
    )
    up.add_argument("--kafka-version", help="broker release, e.g. 4.4.0 (default) or 3.9.2")
    up.add_argument("--base-port", type=int, help="first client port (default stack.base_port, 19092)")
    up.add_argument("--json", action="store_true", help="print the status as JSON")
    up.set_defaults(func=_up)

    down = actions.add_parser(
        "down", parents=[common], help="stop every stack process (SIGTERM, then SIGKILL)"
    )
    down.set_defaults(func=_down)

    status = actions.add_parser("status", parents=[common], help="show nodes, ports and SASL users")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)

    logs = actions.add_parser("logs", parents=[common], help="print the tail of the broker logs")
    logs.add_argument("--node", type=int, help="one node id (default: all)")
    logs.add_argument("-n", "--lines", type=int, default=100, help="lines per node (default 100)")
    logs.set_defaults(func=_logs)
