"""``kpmon tap``: run the proxy tap in front of one or more brokers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from kpconfig.model import ConfigError, KpmonConfig, TapListenerConfig, load_config


@dataclass(frozen=True)
class ListenArg:
    """One ``--listen``: a tap port, and the broker behind it unless the config's listener gives it."""

    listen: str
    broker: str | None = None
    broker_id: int | None = None


def _listener(text: str) -> ListenArg:
    """``LISTEN[=BROKER[@ID]]``, e.g. ``127.0.0.1:29092=127.0.0.1:19092@1``."""
    listen, sep, broker = text.partition("=")
    if not listen or (sep and not broker):
        raise argparse.ArgumentTypeError(
            f"expected LISTEN_HOST:PORT[=BROKER_HOST:PORT[@BROKER_ID]], got {text!r}"
        )
    broker_id: int | None = None
    if "@" in broker:
        broker, _, raw_id = broker.rpartition("@")
        if not raw_id.isdigit():
            raise argparse.ArgumentTypeError(f"broker id must be an integer in {text!r}")
        broker_id = int(raw_id)
    return ListenArg(listen, broker or None, broker_id)


def select_listeners(configured: list[TapListenerConfig], wanted: list[ListenArg]) -> list[TapListenerConfig]:
    """The listeners ``--listen`` asks for. With listeners in the config, each ``--listen`` *selects*
    one of them, by broker id when it gives one, else by listen address, and keeps every setting of it
    (TLS, advertise, listener name, identities): the command line sets only the address and broker it
    names. A ``--listen`` that selects none is an error, since a tap started without its listener's
    TLS settings would relay ciphertext it cannot read. With none configured, each one is a listener."""
    out: list[TapListenerConfig] = []
    for arg in wanted:
        if not configured:
            if arg.broker is None:
                raise ConfigError(
                    f"--listen {arg.listen} names no broker and the config has no tap.listeners"
                )
            out.append(TapListenerConfig(listen=arg.listen, broker=arg.broker, broker_id=arg.broker_id))
            continue
        if arg.broker_id is not None:
            found = [c for c in configured if c.broker_id == arg.broker_id]
            how = f"broker id {arg.broker_id}"
        else:
            found = [c for c in configured if c.listen == arg.listen]
            how = f"listen address {arg.listen}"
        if len(found) != 1:
            known = ", ".join(f"{c.listen} (broker id {c.broker_id})" for c in configured)
            problem = "no" if not found else "more than one"
            raise ConfigError(
                f"--listen {arg.listen}: {problem} configured tap listener has {how} "
                f"(tap.listeners: {known}); name one by its listen address or broker id"
            )
        update: dict[str, Any] = {"listen": arg.listen}
        if arg.broker is not None:
            update["broker"] = arg.broker
        out.append(found[0].model_copy(update=update))
    return out


def _port_range(text: str) -> tuple[int, int]:
    """``LOW-HIGH``, e.g. ``29100-29199``."""
    low, sep, high = text.partition("-")
    if not sep or not low.isdigit() or not high.isdigit() or not 1 <= int(low) <= int(high) <= 65535:
        raise argparse.ArgumentTypeError(
            f"expected LOW-HIGH with 1 <= LOW <= HIGH <= 65535, e.g. 29100-29199, got {text!r}"
        )
    return int(low), int(high)


def parse_workers(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number or 'auto', got {text!r}")
    return int(text)


def configure(args: argparse.Namespace) -> KpmonConfig:
    config = load_config(getattr(args, "config", None))
    tap: dict[str, Any] = {}
    if args.listen:
        tap["listeners"] = select_listeners(config.tap.listeners, list(args.listen))
    for name in ("topic", "capture", "instance_id", "metrics_port", "max_mirrored_frame_bytes"):
        value = getattr(args, name)
        if value is not None:
            tap[name] = value
    if args.tap_bootstrap_servers:
        # Another address for the same cluster: its credentials (properties) still apply.
        tap["cluster"] = config.tap_cluster.model_copy(
            update={"bootstrap_servers": args.tap_bootstrap_servers}
        )
    if args.rewrite_broker_addresses:
        tap["rewrite_broker_addresses"] = True
    if args.dynamic_listener_ports:
        tap["dynamic_listener_ports"] = args.dynamic_listener_ports
    if args.no_dynamic_listeners:
        tap["dynamic_listeners"] = False
    if args.clamp_api_versions:
        tap["clamp_api_versions"] = True
    if args.workers is not None:
        tap["workers"] = args.workers
    if args.no_metrics:
        tap["metrics_port"] = None
    if not tap:
        return config
    return config.model_copy(update={"tap": config.tap.model_copy(update=tap)})


def run(args: argparse.Namespace) -> int:
    from tap.app import run as run_tap
    from tap.app import setup_logging

    setup_logging(args.log_level)
    try:
        config = configure(args)
    except ConfigError as exc:
        print(f"kpmon tap: {exc}")
        return 2
    if config.tap.worker_count > 1:
        from tap.workers import run_workers

        return run_workers(config, mirror=not args.no_mirror)
    return run_tap(config, mirror=not args.no_mirror)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "tap",
        help="run the proxy tap: forward client<->broker bytes unchanged and mirror every frame to a topic",
        description=(
            "Listen on one port per broker, forward bytes unchanged both ways, and mirror each Kafka frame "
            "(with its connection, sequence number, API and correlation id) to the tap topic. Secrets "
            "(SASL tokens, SCRAM salts and salted passwords, delegation-token HMACs) never leave the tap. "
            "Make brokers advertise the tap's addresses so clients stay on it. Command-line options "
            "override the config file's tap section."
        ),
        epilog=(
            "examples:\n"
            "  kpmon tap --listen 127.0.0.1:29092=127.0.0.1:19092@1 --capture headers\n"
            "  kpmon tap --config kpmon.yaml\n"
            "  kpmon tap --listen 0.0.0.0:29092=broker1:9092@1 --listen 0.0.0.0:29093=broker2:9092@2 \\\n"
            "            --tap-bootstrap-servers monitor-kafka:9092 --topic kpmon.tap\n"
            "metrics: Prometheus text on --metrics-port (default from config: 9464)\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", default=argparse.SUPPRESS, help="YAML config file (KPMON__TAP__* env vars override it)"
    )
    parser.add_argument(
        "--listen",
        action="append",
        type=_listener,
        metavar="LISTEN[=BROKER[@ID]]",
        help="a tap port in front of one broker, e.g. 127.0.0.1:29092=127.0.0.1:19092@1 (repeat per broker). "
        "With tap.listeners in --config it selects one of them (by @ID, else by LISTEN) and keeps its "
        "TLS and other settings; naming none of them is an error",
    )
    parser.add_argument("--topic", help="tap topic (default from config: kpmon.tap)")
    parser.add_argument(
        "--capture", choices=["full", "headers", "meta"], help="capture policy for frame values"
    )
    parser.add_argument(
        "--tap-bootstrap-servers", help="cluster holding the tap topic (default: the monitored one)"
    )
    parser.add_argument("--instance-id", help="tap instance id, part of every connection id")
    parser.add_argument(
        "--max-mirrored-frame-bytes", type=int, help="frames above this are mirrored header-only"
    )
    parser.add_argument("--metrics-port", type=int, help="Prometheus port")
    parser.add_argument(
        "--workers",
        type=parse_workers,
        metavar="N|auto",
        help="forwarding processes sharing every listener; auto = the cores this process may use "
        "(default from config: 1)",
    )
    parser.add_argument("--no-metrics", action="store_true", help="do not serve Prometheus metrics")
    parser.add_argument(
        "--rewrite-broker-addresses",
        action="store_true",
        help="rewrite broker addresses in Metadata/FindCoordinator/DescribeCluster to the tap's listeners "
        "(needs --listen ...@ID; otherwise make brokers advertise the tap)",
    )
    parser.add_argument(
        "--dynamic-listener-ports",
        type=_port_range,
        metavar="LOW-HIGH",
        help="with --rewrite-broker-addresses: ports for listeners opened on the fly for broker ids "
        "that have none (default: ephemeral ports)",
    )
    parser.add_argument(
        "--no-dynamic-listeners",
        action="store_true",
        help="with --rewrite-broker-addresses: leave brokers without a --listen ...@ID at their own address",
    )
    parser.add_argument(
        "--clamp-api-versions",
        action="store_true",
        help="clamp ApiVersions responses to the versions the codec knows",
    )
    parser.add_argument(
        "--no-mirror", action="store_true", help="forward only; count frames but mirror nothing"
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.set_defaults(func=run)
