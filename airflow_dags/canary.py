"""The redeploy canary: a window of the tap topic through one build's checks in batch mode, and the
comparison of what it raised with what the running job raised over the same records.

Run it with the interpreter of the build under test, so that build's code does the checking::

    <new python> -m airflow_dags.canary --config NEW.yaml --source-config CURRENT.yaml --minutes 10
    <old python> -m airflow_dags.canary --config CURRENT.yaml --window '{"topic": ..., "start": ..., "end": ...}'

It prints one JSON object: the window it read (offsets per partition) and the alerts the checks raised
(``checks.new_monitor`` fed ``codec.taprecord.frames_from_record`` per record, flushed, folded by
``checks.alerts.AlertBook``: what the streaming job computes, proven in tests/streaming/test_stages.py).
The tap topic is the one the running job reads (``--source-config``); the checks configuration is the
build's own (``--config``).

Comparing (``compare``): an alert is its (rule, subject). The canary starts with empty state at the
window's start, so an alert that needs frames from before the window (the handshake of a long-lived
connection, a producer's earlier epoch) can be missing for reasons that have nothing to do with the new
build. The running build's own replay of the same window (the *baseline*) tells these apart: an alert the
running job raised that the baseline replay also misses is a window-edge effect; one the baseline finds
and the new build does not is a regression. Data-quality (``quality.*``) and operational (``ops.*``)
alerts are not the checks' and are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_dags.tapwindow import TapRecord, TapWindowError, Window, choose_window, read_window
from checks.model import SEVERITY_RANK
from checks.settings import ChecksSettings
from kpconfig.model import ConfigError, load_config

#: Rule-id prefixes that do not come from the checks catalogue.
NOT_CHECKS = ("quality.", "ops.")
#: Canary gate policies: which regressions fail the deploy.
GATES = ("critical", "any", "report")

AlertKey = tuple[str, str]


@dataclass
class Replay:
    records: int
    ts_min: int | None
    ts_max: int | None
    findings_by_rule: dict[str, int]
    alerts: list[dict[str, Any]]
    stats: dict[str, Any]


def replay(records: Iterable[TapRecord], settings: ChecksSettings) -> Replay:
    """The checks over ``records`` (in event-time order), flushed at the end, folded into alerts."""
    import checks
    from checks.alerts import Alert, AlertBook
    from codec.taprecord import frames_from_record

    monitor = checks.new_monitor(settings)
    findings = []
    count = 0
    ts_min: int | None = None
    ts_max: int | None = None
    for record in records:
        count += 1
        ts = record.ts_ns
        ts_min = ts if ts_min is None else min(ts_min, ts)
        ts_max = ts if ts_max is None else max(ts_max, ts)
        for frame in frames_from_record(record.headers, record.value, record.partition, record.offset):
            findings.extend(monitor.feed(frame))
    findings.extend(monitor.flush())
    book = AlertBook()
    touched: dict[str, Alert] = {}
    # Findings and resolves in event-time order, as the job's sink sees them batch after batch.
    events: list[tuple[int, int, Any]] = [(f.ts_ns, 0, f) for f in findings]
    events += [(ts, 1, (rule, subject, ts)) for rule, subject, ts in monitor.ctx.resolved]
    for _ts, kind, item in sorted(events, key=lambda e: (e[0], e[1])):
        if kind == 0:
            alert = book.add(item)
        else:
            resolved = book.resolve(*item)
            if resolved is None:
                continue
            alert = resolved
        touched[alert.id] = alert
    by_rule: dict[str, int] = {}
    for finding in findings:
        by_rule[finding.rule] = by_rule.get(finding.rule, 0) + 1
    alerts = [{k: v for k, v in a.to_dict().items() if k != "evidence"} for a in touched.values()]
    stats = {k: v for k, v in monitor.stats.as_dict().items() if k != "findings"}
    return Replay(count, ts_min, ts_max, by_rule, alerts, stats)


# -- comparing ----------------------------------------------------------------------------------------


def alert_keys(items: Iterable[Mapping[str, Any]]) -> dict[AlertKey, str]:
    """(rule, subject) -> highest severity, over findings or alerts (incomplete findings count as info,
    as in the alert book); rules that are not checks are left out."""
    out: dict[AlertKey, str] = {}
    for item in items:
        rule = str(item["rule"])
        if rule.startswith(NOT_CHECKS):
            continue
        severity = "info" if item.get("incomplete") else str(item["severity"])
        key = (rule, str(item["subject"]))
        if SEVERITY_RANK.get(severity, 0) >= SEVERITY_RANK.get(out.get(key, "info"), 0):
            out[key] = severity
    return out


def finding_in_window(finding: Mapping[str, Any], window: Window, ts_range: tuple[int, int] | None) -> bool:
    """Whether a running-job finding is about records of the window: by its tap offsets when it names
    them, else by its event time within the window's."""
    offsets = (finding.get("evidence") or {}).get("offsets")
    if offsets:
        return any(
            # [partition, offset], and a schema-3 record's entry index after them when not the first.
            isinstance(pair, list | tuple) and len(pair) >= 2 and window.contains(int(pair[0]), int(pair[1]))
            for pair in offsets
            if pair[0] is not None and pair[1] is not None
        )
    if ts_range is None:
        return False
    return ts_range[0] <= int(finding.get("ts_ns", -1)) <= ts_range[1]


def running_alerts(
    batches: Iterable[Mapping[str, Any]], window: Window, ts_range: tuple[int, int] | None
) -> dict[AlertKey, str]:
    """The running job's alerts over the window, from its per-batch results (``streaming.sink.read_batches``)."""
    findings = [
        f for batch in batches for f in batch.get("findings") or [] if finding_in_window(f, window, ts_range)
    ]
    return alert_keys(findings)


def processed_offsets(progress: Mapping[str, Any] | None, topic: str) -> dict[int, int] | None:
    """Where the running job has read ``topic`` up to (exclusive), from its newest progress."""
    if not progress:
        return None
    out: dict[int, int] = {}
    for source in progress.get("sources") or []:
        end = source.get("endOffset")
        if isinstance(end, str):
            try:
                end = json.loads(end)
            except ValueError:
                continue
        if isinstance(end, dict) and isinstance(end.get(topic), dict):
            out.update({int(p): int(o) for p, o in end[topic].items()})
    return out or None


@dataclass
class Difference:
    rule: str
    subject: str
    severity: str
    #: missing only: "regression" (the running build's replay raises it), "window edge" (it does not
    #: either), "unexplained" (no baseline replay to tell).
    cause: str = ""


@dataclass
class Comparison:
    running: int
    new: int
    matched: int
    missing: list[Difference] = field(default_factory=list)
    extra: list[Difference] = field(default_factory=list)
    baseline: bool = False

    def regressions(self) -> list[Difference]:
        return [d for d in self.missing if d.cause in ("regression", "unexplained")]

    def failures(self, gate: str) -> list[str]:
        """What fails the deploy under ``gate`` ("critical": a lost critical alert; "any": any lost alert;
        "report": nothing)."""
        if gate not in GATES:
            raise ValueError(f"canary gate must be one of {', '.join(GATES)}")
        if gate == "report":
            return []
        lost = [d for d in self.regressions() if gate == "any" or d.severity == "critical"]
        return [f"{d.severity} {d.rule} on {d.subject} ({d.cause})" for d in lost]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(
    running: Mapping[AlertKey, str], new: Mapping[AlertKey, str], baseline: Mapping[AlertKey, str] | None
) -> Comparison:
    result = Comparison(
        len(running), len(new), len(running.keys() & new.keys()), baseline=baseline is not None
    )
    for key in sorted(running.keys() - new.keys()):
        cause = "unexplained" if baseline is None else "regression" if key in baseline else "window edge"
        result.missing.append(Difference(key[0], key[1], running[key], cause))
    for key in sorted(new.keys() - running.keys()):
        result.extra.append(Difference(key[0], key[1], new[key]))
    return result


# -- command line ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_dags.canary", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="this build's config (its checks section is used)")
    parser.add_argument(
        "--source-config", help="config of the running job: the tap topic to read (default: --config)"
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--minutes", type=float, help="replay the last N minutes of the tap topic")
    which.add_argument("--window", help="replay exactly this window (JSON, as printed by a previous run)")
    parser.add_argument("--end-offsets", help='with --minutes: stop at these offsets, JSON {"0": 1234}')
    parser.add_argument("--timeout", type=float, default=300.0, help="give up reading after this long")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        source = load_config(args.source_config) if args.source_config else config
    except ConfigError as exc:
        print(f"canary: {exc}", file=sys.stderr)
        return 2
    cluster = source.tap_cluster
    try:
        if args.window:
            window = Window.from_dict(json.loads(args.window))
        else:
            end = (
                {int(p): int(o) for p, o in json.loads(args.end_offsets).items()}
                if args.end_offsets
                else None
            )
            window = choose_window(cluster, source.tap.topic, args.minutes, end)
        result = replay(read_window(cluster, window, args.timeout), config.checks.settings())
    except (TapWindowError, ValueError, KeyError) as exc:
        print(f"canary: {exc}", file=sys.stderr)
        return 1
    from kpconfig import __version__

    out = {
        "build": {"kpmon_version": __version__, "python": sys.executable},
        "window": window.to_dict(),
        "replay": asdict(result),
    }
    print(json.dumps(out, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
