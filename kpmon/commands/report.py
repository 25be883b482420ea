"""``kpmon report``: run every check over a saved capture or a tap topic; print a summary, write HTML.

The I/O half of the report: reading records and writing files. What goes in the report, and how it
looks, is ``checks.report`` (pure).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from checks.model import Severity
from checks.report import (
    ReportData,
    TimelineEntry,
    build_report,
    failing_findings,
    frames_from_json,
    record_to_json,
    render_coverage_png,
    render_html,
    report_json,
    run_checks,
    summary_text,
)
from codec.taprecord import TapFrame
from kpconfig.model import ConfigError, load_config
from kpmon.commands.topicopts import (
    InputError,
    add_pcap_options,
    add_source_options,
    open_tap_topic,
    open_topic,
    poll_records,
    resolve_cluster,
)

#: Exit codes of ``kpmon report`` (docs/quickstart.md, "Gating CI"). 2 is also argparse's usage error.
EXIT_OK, EXIT_ERROR, EXIT_CONFIG, EXIT_FINDINGS = 0, 1, 2, 3


def frames_from_capture(path: Path) -> Iterator[TapFrame]:
    try:
        handle = sys.stdin if str(path) == "-" else path.open(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield from frames_from_json(line)
            except (ValueError, TypeError, AttributeError) as exc:
                raise InputError(f"{path}:{number}: not a capture record ({exc})") from None


def frames_from_topic(args: argparse.Namespace, save: Any | None) -> Iterator[TapFrame]:
    from codec.taprecord import frames_from_record

    consumer = open_tap_topic(args, "kpmon-report")
    try:
        for record in poll_records(consumer, idle_timeout=args.idle_timeout, max_records=args.max):
            if save is not None:
                save.write(
                    record_to_json(record.headers, record.value, record.partition, record.offset) + "\n"
                )
            yield from frames_from_record(record.headers, record.value, record.partition, record.offset)
    finally:
        consumer.close()


class TapTopicReader:
    """A consumer on every partition of the tap topic, from the start, read in steps up to its end.

    For a topic that keeps growing (the live monitor's report): each ``read_to_end`` stops at the end
    offsets taken when it is called, and the next call carries on from there.
    """

    def __init__(self, bootstrap_servers: str, topic: str, properties: dict[str, str] | None = None) -> None:
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.properties: dict[str, str] = dict(properties or {})
        self._consumer: Any | None = None
        self._partitions: list[int] = []
        self._next: dict[int, int] = {}

    def read_to_end(self, timeout: float = 10.0, save: Any | None = None) -> Iterator[TapFrame]:
        """Frames from where the last call stopped up to the end offsets as of now. Raises InputError
        (TopicReadError) while the topic cannot be read, e.g. before it is created."""
        from confluent_kafka import TopicPartition

        from codec.taprecord import frames_from_record

        if self._consumer is None:
            self._consumer, self._partitions = open_topic(
                self.bootstrap_servers, self.properties, self.topic, "kpmon-report"
            )
        consumer = self._consumer
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=timeout)[1]
            for p in self._partitions
        }
        records = poll_records(
            consumer,
            idle_timeout=timeout,
            done=lambda: all(self._next.get(p, 0) >= end for p, end in ends.items()),
            idle_error=f"tap topic {self.topic!r}: no records for {timeout:.0f} s before its end",
        )
        for record in records:
            self._next[record.partition] = record.offset + 1
            if save is not None:
                save.write(
                    record_to_json(record.headers, record.value, record.partition, record.offset) + "\n"
                )
            yield from frames_from_record(record.headers, record.value, record.partition, record.offset)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


def write_report(
    report: ReportData,
    out: Path,
    timeline: list[TimelineEntry] | None = None,
    links: list[tuple[str, str]] | None = None,
) -> Path:
    """Write ``out`` (HTML) and the heatmap PNG next to it; returns the PNG's path.

    The HTML is written to a temporary name and renamed, so a browser refreshing it never sees half.
    """
    png_path = out.with_suffix(".png")
    png = render_coverage_png(report.coverage)
    out.parent.mkdir(parents=True, exist_ok=True)
    png_path.write_bytes(png)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render_html(report, png, png_path.name, timeline, links), encoding="utf-8")
    os.replace(tmp, out)
    return png_path


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    out = Path(args.out)
    try:
        with contextlib.ExitStack() as stack:
            if args.capture:
                source = f"capture {args.capture}"
                monitor, findings = run_checks(
                    frames_from_capture(Path(args.capture)), config.checks.settings()
                )
            elif args.pcap:
                from kpmon.pcap import frames_from_pcap

                frames, read = frames_from_pcap(Path(args.pcap), args.broker_port)
                source = f"pcap {args.pcap}: {read.summary()}"
                monitor, findings = run_checks(frames, config.checks.settings())
            else:
                args.topic = args.topic or config.tap.topic
                resolve_cluster(args, config)
                source = f"tap topic {args.topic} on {args.bootstrap_servers}"
                save = (
                    stack.enter_context(Path(args.save_capture).open("w", encoding="utf-8"))
                    if args.save_capture
                    else None
                )
                monitor, findings = run_checks(frames_from_topic(args, save), config.checks.settings())
    except (InputError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    report = build_report(monitor.states, findings, monitor.stats, source)
    png_path = write_report(report, out)
    fail_on = Severity(args.fail_on) if args.fail_on else None
    # With the JSON on stdout, the human summary goes to stderr so a pipe gets JSON only.
    human = sys.stderr if args.json == "-" else sys.stdout
    print(summary_text(report), file=human)
    print(f"wrote {out} and {png_path}", file=human)
    if args.json:
        text = json.dumps(report_json(report, fail_on), indent=2, default=str) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            try:
                Path(args.json).write_text(text, encoding="utf-8")
            except OSError as exc:
                print(f"error: cannot write {args.json}: {exc.strerror}", file=sys.stderr)
                return EXIT_ERROR
            print(f"wrote {args.json}", file=human)
    if fail_on is not None:
        failing = failing_findings(report, fail_on)
        if failing:
            print(
                f"fail: {len(failing)} finding(s) at or above {fail_on.value} (--fail-on {fail_on.value})",
                file=sys.stderr,
            )
            return EXIT_FINDINGS
    return EXIT_OK


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "report",
        help="check a capture or tap topic and write an HTML report",
        description=(
            "Run every invariant check over a saved capture (JSON lines: headers, value_hex, partition, "
            "offset) or a tap topic, print a summary and write an HTML report with the ApiVersions "
            "coverage heatmap (PNG next to it), groups, producers and findings."
        ),
        epilog="examples:\n  kpmon report --capture tap.jsonl --out report.html\n"
        "  kpmon report --topic kpmon.tap --bootstrap-servers 127.0.0.1:9092 --save-capture tap.jsonl\n"
        "  kpmon report --capture tap.jsonl --json - --fail-on warning   # a CI gate\n\n"
        "exit codes: 0 done (and nothing at or above --fail-on); 1 the input or an output could not be\n"
        "read or written; 2 bad usage or config; 3 a finding at or above --fail-on exists.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_pcap_options(add_source_options(parser), parser)
    parser.add_argument(
        "--save-capture", help="also save the records read from the topic to this capture file"
    )
    parser.add_argument("--out", default="kpmon-report.html", help="HTML file to write (default %(default)s)")
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the findings and the summary as JSON to PATH ('-': stdout, the text summary "
        "then goes to stderr)",
    )
    parser.add_argument(
        "--fail-on",
        choices=[s.value for s in Severity],
        help="exit 3 when a finding at or above this severity exists (incomplete findings count as info)",
    )
    parser.set_defaults(func=run)
