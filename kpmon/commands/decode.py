"""``kpmon decode``: decode Kafka frames given as hex, a capture file, or a tap topic, to JSON."""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import codec
import codec.peek
from codec.jsonable import message_to_jsonable
from codec.taprecord import REQ, RESP, RecordError, parse_records
from kpconfig.model import ConfigError, load_config
from kpmon.commands.topicopts import (
    InputError,
    add_cluster_options,
    add_pcap_options,
    open_tap_topic,
    poll_records,
    resolve_cluster,
)

_SIZE = struct.Struct(">i")
#: Larger than any frame a broker accepts by default (socket.request.max.bytes is 100 MiB).
MAX_FRAME = 1 << 30


@dataclass
class InputFrame:
    """One frame to decode, from hex, a capture file or a tap record (not a decoded ``TapFrame``)."""

    data: bytes
    direction: str | None = None  # REQ / RESP / None (work it out)
    api_key: int | None = None
    api_version: int | None = None
    source: str = ""


class Pairer:
    """Pairs responses with earlier requests by correlation id, as a client or the tap does."""

    def __init__(self) -> None:
        self.pending: dict[int, codec.Request] = {}

    def decode(self, frame: InputFrame) -> codec.Request | codec.Response:
        if frame.direction == RESP or (frame.direction is None and frame.api_key is not None):
            if frame.api_key is None or frame.api_version is None:
                raise codec.DecodeError("a response needs --api-key and --api-version", 0)
            corr = codec.peek.peek_correlation_id(frame.data)
            return codec.decode_response(
                frame.data, frame.api_key, frame.api_version, request=self.pending.pop(corr, None)
            )
        if frame.direction is None and len(frame.data) >= 4:
            corr = codec.peek.peek_correlation_id(frame.data)
            request = self.pending.get(corr)
            if request is not None:
                del self.pending[corr]
                return codec.decode_response(
                    frame.data, request.api_key, request.api_version, request=request
                )
        request = codec.decode_request(frame.data)
        self.pending[request.correlation_id] = request
        return request


def frames_from_hex(values: list[str], args: argparse.Namespace) -> Iterator[InputFrame]:
    for i, value in enumerate(values):
        text = "".join(value.split())
        try:
            data = bytes.fromhex(text)
        except ValueError as exc:
            raise InputError(f"argument {i + 1} is not hex: {exc}") from None
        if args.size_prefixed:
            yield from _split(data, f"hex#{i + 1}", args)
        else:
            yield InputFrame(data, _direction(args), args.api_key, args.api_version, f"hex#{i + 1}")


def _direction(args: argparse.Namespace) -> str | None:
    return {"request": REQ, "response": RESP}.get(args.direction)


def _split(data: bytes, name: str, args: argparse.Namespace) -> Iterator[InputFrame]:
    pos = 0
    while pos < len(data):
        if len(data) - pos < 4:
            raise InputError(f"{name}: {len(data) - pos} stray bytes at offset {pos}, not a size prefix")
        (size,) = _SIZE.unpack_from(data, pos)
        if size < 0 or size > MAX_FRAME or pos + 4 + size > len(data):
            raise InputError(
                f"{name}: frame at offset {pos} declares {size} bytes, {len(data) - pos - 4} remain"
            )
        yield InputFrame(
            data[pos + 4 : pos + 4 + size], _direction(args), args.api_key, args.api_version, f"{name}@{pos}"
        )
        pos += 4 + size


def frames_from_file(path: Path, args: argparse.Namespace) -> Iterator[InputFrame]:
    try:
        data = path.read_bytes() if str(path) != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    yield from _split(data, str(path), args)


def frames_from_topic(args: argparse.Namespace) -> Iterator[InputFrame]:
    consumer = open_tap_topic(args, "kpmon-decode")
    try:
        # Only frames count towards --max: the tap's open/close records are skipped.
        records = poll_records(consumer, idle_timeout=args.idle_timeout)
        seen = 0
        while args.max is None or seen < args.max:
            record = next(records, None)
            if record is None:
                return
            try:
                entries = parse_records(record.headers, record.value, record.partition)
            except RecordError as exc:
                print(
                    f"kpmon decode: {record.topic}/{record.partition}@{record.offset}: {exc}", file=sys.stderr
                )
                continue
            parts = [part for entry in entries for part in entry.parts]
            for index, part in enumerate(parts):
                if part.direction not in (REQ, RESP) or (args.max is not None and seen >= args.max):
                    continue
                seen += 1
                where = f"{record.topic}/{record.partition}@{record.offset}"
                yield InputFrame(
                    part.value or b"",
                    part.direction,
                    part.api_key,
                    part.api_version,
                    where if len(parts) == 1 else f"{where}#{index}",
                )
    finally:
        consumer.close()


def frames_from_pcap_file(args: argparse.Namespace) -> Iterator[InputFrame]:
    from kpmon.pcap import PcapError, frames_from_pcap

    try:
        frames, stats = frames_from_pcap(Path(args.pcap), args.broker_port)
    except PcapError as exc:
        raise InputError(str(exc)) from None
    for frame in frames:
        if frame.direction in (REQ, RESP) and frame.raw is not None:
            yield InputFrame(
                frame.raw,
                frame.direction,
                frame.api_key,
                frame.api_version,
                f"{args.pcap}:{frame.conn}#{frame.seq}",
            )
    print(f"kpmon decode: {stats.summary()}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if args.pcap:
        frames: Iterator[InputFrame] = frames_from_pcap_file(args)
    elif args.topic:
        try:
            resolve_cluster(args, load_config(args.config))
        except (ConfigError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        frames = frames_from_topic(args)
    elif args.file:
        frames = frames_from_file(Path(args.file), args)
    elif args.hex:
        frames = frames_from_hex(args.hex, args)
    else:
        print("error: give hex frames, --file, --topic or --pcap (see kpmon decode --help)", file=sys.stderr)
        return 2
    pairer = Pairer()
    failures = 0
    try:
        for frame in frames:
            try:
                out: dict[str, Any] = message_to_jsonable(pairer.decode(frame))
            except codec.DecodeError as exc:
                failures += 1
                out = {
                    "error": "decode_error",
                    "reason": exc.reason,
                    "offset": exc.offset,
                    "api_key": exc.api_key,
                    "api_version": exc.api_version,
                    "size": len(frame.data),
                }
            out["source"] = frame.source
            print(json.dumps(out, indent=2 if args.pretty else None, ensure_ascii=False))
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if failures:
        print(f"kpmon decode: {failures} frame(s) failed to decode", file=sys.stderr)
        return 1
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "decode",
        help="decode Kafka frames to JSON",
        description=(
            "Decode Kafka protocol frames (without their 4-byte size prefix unless --size-prefixed) to JSON lines. "
            "Requests decode on their own; a response needs --api-key/--api-version, or is paired automatically "
            "with an earlier request of the same stream by correlation id."
        ),
        epilog="examples:\n  kpmon decode 00120003000000070007...\n  kpmon decode --file capture.bin --pretty\n"
        "  kpmon decode --topic kpmon.tap --bootstrap-servers 127.0.0.1:9092 --max 100\n"
        "  kpmon --config kpmon.yaml decode --topic kpmon.tap   # a secured cluster: tap.cluster.properties",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("hex", nargs="*", help="frames as hex strings (whitespace ignored)")
    parser.add_argument("--file", help="binary file of size-prefixed frames ('-' for stdin)")
    parser.add_argument("--topic", help="read frames from this tap topic")
    add_pcap_options(parser, parser)
    add_cluster_options(parser)
    parser.add_argument("--max", type=int, default=None, help="stop after this many frames from the topic")
    parser.add_argument(
        "--idle-timeout", type=float, default=5.0, help="stop reading the topic after this many idle seconds"
    )
    parser.add_argument("--size-prefixed", action="store_true", help="hex input carries 4-byte size prefixes")
    parser.add_argument("--direction", choices=["auto", "request", "response"], default="auto")
    parser.add_argument("--api-key", type=int, help="API key of the request a response answers")
    parser.add_argument("--api-version", type=int, help="API version of the request a response answers")
    parser.add_argument("--pretty", action="store_true", help="indent the JSON output")
    parser.set_defaults(func=run)
