"""``kpmon export --pcap FILE``: tap records (a capture file or the tap topic) as a pcap for Wireshark."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kpconfig.model import ConfigError, load_config
from kpmon.commands.report import frames_from_capture, frames_from_topic
from kpmon.commands.topicopts import InputError, add_source_options, resolve_cluster


def run(args: argparse.Namespace) -> int:
    from kpmon.pcap import export_pcap

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.capture:
            frames = list(frames_from_capture(Path(args.capture)))
        else:
            args.topic = args.topic or config.tap.topic
            resolve_cluster(args, config)
            frames = list(frames_from_topic(args, None))
        stats = export_pcap(frames, Path(args.pcap))
    except (InputError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    ports = ",".join(str(p) for p in sorted(stats.broker_ports))
    print(
        f"wrote {args.pcap}: {stats.frames} frames of {stats.connections} connections in {stats.packets} "
        f"packets; {stats.header_only} header-only frames had no bytes to write"
    )
    if ports and ports != "9092":
        print(
            f"Wireshark decodes Kafka on 9092 only: tshark -d tcp.port=={ports.split(',')[0]},kafka -r {args.pcap}"
        )
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "export",
        help="write tap records as a pcap file Wireshark opens",
        description=(
            "Write the frames of a capture file or of the tap topic as a pcap with synthesized TCP/IP "
            "framing (each connection's addresses, a handshake, its frames as segments, a FIN), so "
            "Wireshark and tshark dissect what the tap mirrored. Header-only frames (capture 'meta', "
            "or truncated) carry no bytes and are skipped, counted."
        ),
        epilog="examples:\n  kpmon export --capture tap.jsonl --pcap tap.pcap\n"
        "  kpmon export --topic kpmon.tap --max 10000 --pcap tap.pcap",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pcap", required=True, help="pcap file to write")
    add_source_options(parser)
    parser.set_defaults(func=run)
