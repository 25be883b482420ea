"""``kpmon tap``: run the proxy tap in front of one or more brokers."""

from __future__ import annotations

import argparse
from typing import Any

from kpmon.config import ConfigError, KpmonConfig, TapListenerConfig, load_config


def _listener(text: str) -> TapListenerConfig:
    """``LISTEN=BROKER[@ID]``, e.g. ``127.0.0.1:29092=127.0.0.1:19092@1``."""
    listen, sep, broker = text.partition("=")
    if not sep or not listen or not broker:
        raise argparse.ArgumentTypeError(
            f"expected LISTEN_HOST:PORT=BROKER_HOST:PORT[@BROKER_ID], got {text!r}"
        )
    broker_id: int | None = None
    if "@" in broker:
        broker, _, raw_id = broker.rpartition("@")
        if not raw_id.isdigit():
            raise argparse.ArgumentTypeError(f"broker id must be an integer in {text!r}")
        broker_id = int(raw_id)
    return TapListenerConfig(listen=listen, broker=broker, broker_id=broker_id)


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
        tap["listeners"] = list(args.listen)
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
        metavar="LISTEN=BROKER[@ID]",
        help="a tap port in front of one broker, e.g. 127.0.0.1:29092=127.0.0.1:19092@1 (repeat per broker)",
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
