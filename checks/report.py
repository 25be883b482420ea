"""The offline report: what a capture tells about the fleet, as plain data, a heatmap PNG and HTML.

Pure: records in, ``ReportData`` out (``build_report``), and ``ReportData`` to bytes/text
(``render_coverage_png``, ``render_html``, ``summary_text``). Reading captures or the tap topic and
writing files is ``kpmon report``'s job (kpmon/commands/report.py).

Capture format (JSON Lines, one tap record per line)::

    {"headers": {"dir": "req", "conn": "...", "seq": "3", ...}, "value_hex": "0003000c...",
     "partition": 0, "offset": 41}

``headers`` are the tap record headers (ARCHITECTURE.md, "Tap record") as strings; ``value_hex`` is the
record value in hex (null for lifecycle and header-only records).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from checks.engine import Monitor
from checks.model import SEVERITY_RANK, Finding, Severity
from checks.rule import Context, State, StateKey, Stats
from checks.rules import all_rules
from checks.rules.apiversions import CLUSTER_KEY, CoverageCell, FleetRow, coverage, fleet_matrix
from checks.rules.groups import CLASSIC, group_protocol_label
from checks.settings import ChecksSettings
from codec.api import api_name
from codec.schema import load_table
from codec.taprecord import TapFrame, frames_from_record

# -- capture records ----------------------------------------------------------------------------------


def record_to_json(headers: Mapping[str, str], value: bytes | None, partition: int, offset: int) -> str:
    """One capture line for a tap record."""
    return json.dumps(
        {
            "headers": dict(headers),
            "value_hex": value.hex() if value is not None else None,
            "partition": partition,
            "offset": offset,
        },
        sort_keys=True,
    )


def frames_from_json(line: str) -> list[TapFrame]:
    """Decode one capture line (the inverse of ``record_to_json``) to its frames (one for a schema-1
    record, the request and its response for a schema-2 exchange)."""
    record = json.loads(line)
    headers = {str(k): str(v) for k, v in (record.get("headers") or {}).items() if v is not None}
    value_hex = record.get("value_hex")
    value = bytes.fromhex(value_hex) if value_hex else None
    return frames_from_record(headers, value, int(record.get("partition", -1)), int(record.get("offset", -1)))


# -- report data ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupRow:
    """What the frames showed of one group id (not only what was left of it at the end)."""

    group: str
    #: The group protocol(s) it was answered under: ``classic``, ``consumer`` (KIP-848), ``share``
    #: (KIP-932), ``streams`` (KIP-1071), or several joined by ``+`` (an online migration).
    protocol: str
    #: Classic groups: the agreed protocol type and name (KIP-559); the others: the type is None and the
    #: name is the assignor the members asked for (``ServerAssignor``), else ``server default`` (after
    #: the name a describe answer gave it, when one did).
    protocol_type: str | None
    protocol_name: str | None
    #: Classic: the newest generation answered; the others: the highest group epoch seen (a describe's
    #: GroupEpoch, or the highest member epoch answered, which the group epoch is at least); -1 unknown.
    generation: int
    #: Members at the end: the newest describe answer's count when it came after the last membership
    #: answer, else the members seen that had not left or been fenced.
    members: int
    #: The state at the end: the newest describe answer's when it came last (``state_from`` "describe"),
    #: else worked out from the members seen (``state_from`` "members"): Empty when none is left;
    #: classic Stable once the newest generation synced (else CompletingRebalance); the others Stable
    #: when every member has the highest member epoch (else Reconciling).
    state: str | None = None
    state_from: str = ""
    #: The highest member epoch the coordinator answered (KIP-848, share, streams; -1 classic/unknown).
    member_epoch: int = -1
    #: Distinct members answered, and how many left (LeaveGroup, or a heartbeat with epoch -1/-2) or were
    #: fenced (a fencing answer; classic: missing from a newer generation, or UNKNOWN_MEMBER_ID).
    members_seen: int = 0
    members_left: int = 0
    members_fenced: int = 0


@dataclass(frozen=True)
class ProducerRow:
    producer_id: int
    epoch: int
    epoch_source: str
    transactional_ids: tuple[str, ...]
    open_transaction: bool


@dataclass
class ReportData:
    source: str
    stats: dict[str, Any]
    findings: list[dict[str, Any]]
    coverage: list[CoverageCell]
    fleet: list[FleetRow]
    groups: list[GroupRow]
    producers: list[ProducerRow]
    brokers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def finding_counts(self) -> list[tuple[str, str, int]]:
        counts = Counter((f["rule"], f["severity"]) for f in self.findings)
        return sorted(((r, s, n) for (r, s), n in counts.items()), key=lambda t: (-SEVERITY_RANK[t[1]], t[0]))


def run_checks(
    frames: Iterable[TapFrame], config: ChecksSettings | None = None
) -> tuple[Monitor, list[Finding]]:
    """Every rule over the frames, flushed at the end (a capture is finite)."""
    monitor = Monitor(all_rules(), Context(config or ChecksSettings()))
    findings = monitor.feed_all(frames)
    findings.extend(monitor.flush())
    return monitor, findings


def build_report(
    states: Mapping[StateKey, State], findings: Iterable[Finding], stats: Stats, source: str = ""
) -> ReportData:
    """The report's content from a monitor's rule states, its findings and its counters."""
    cluster = states.get(("apiversions.cluster", CLUSTER_KEY), {})
    groups = group_rows(states)
    txn_by_pid: dict[int, list[tuple[str, bool]]] = {}
    for (rule, key), state in states.items():
        if rule == "txn" and state.get("pid") is not None:
            txn_by_pid.setdefault(int(state["pid"]), []).append((key, bool(state.get("open"))))
    producers: list[ProducerRow] = []
    for (rule, key), state in states.items():
        if rule != "producer":
            continue
        pid = int(key)
        txns = sorted(txn_by_pid.get(pid, []))
        producers.append(
            ProducerRow(
                producer_id=pid,
                epoch=int(state.get("epoch", -1)),
                epoch_source=str(state.get("epoch_src", "")),
                transactional_ids=tuple(t for t, _ in txns),
                open_transaction=any(o for _, o in txns),
            )
        )
    producers.sort(key=lambda p: p.producer_id)
    brokers = sorted((label, str(b.get("role", ""))) for label, b in (cluster.get("brokers") or {}).items())
    ordered = sorted(findings, key=lambda f: (-f.severity.rank, f.ts_ns, f.rule, f.subject))
    return ReportData(
        source=source,
        stats=stats.as_dict(),
        findings=[f.to_dict() for f in ordered],
        coverage=coverage(cluster),
        fleet=fleet_matrix(cluster),
        groups=groups,
        producers=producers,
        brokers=brokers,
    )


def group_rows(states: Mapping[StateKey, State]) -> list[GroupRow]:
    """One row per group id, from the classic rule's state (``group``) and the protocol rule's
    (``group_protocol``: KIP-848 consumer, share and streams groups, and which protocols served it).
    A group served under both (a KIP-848 online migration) counts the members each saw."""
    classic = {key: state for (rule, key), state in states.items() if rule == "group"}
    modern = {key: state for (rule, key), state in states.items() if rule == "group_protocol"}
    rows: list[GroupRow] = []
    for key in sorted(classic.keys() | modern.keys()):
        old, new = classic.get(key) or {}, modern.get(key) or {}
        protocols = dict(new.get("protocols") or {})
        if "gen" in old:
            protocols.setdefault(CLASSIC, 0)
        label = group_protocol_label(protocols)
        parts = (old, new)
        live = [m for part in parts for m in _live(part)]
        counts = {
            name: sum(int(part.get(f"n_{name}", 0)) for part in parts) for name in ("seen", "left", "fenced")
        }
        top = int(new.get("max_epoch", -1))
        if label == CLASSIC:
            gen = int(old.get("gen", -1))
            busy = "Stable" if int(old.get("synced_gen", -1)) >= gen else "CompletingRebalance"
            assignor = old.get("pname")
        else:
            gen = max(int(new.get("group_epoch", -1)), top)
            epochs = {int(m.get("epoch", -1)) for m in _live(new)}
            busy = "Stable" if len(epochs) <= 1 else "Reconciling"
            described = new.get("describe") or {}
            default = (
                f"{described['assignor']} (server default)" if described.get("assignor") else "server default"
            )
            assignor = ",".join(new.get("assignors") or []) or default
        rows.append(
            GroupRow(
                key,
                label,
                old.get("ptype"),
                assignor,
                gen,
                *_end_state(parts, live, busy),
                member_epoch=top,
                members_seen=counts["seen"],
                members_left=counts["left"],
                members_fenced=counts["fenced"],
            )
        )
    return rows


def _live(state: State) -> list[dict[str, Any]]:
    """The members in the group at the end: those seen that had not left or been fenced."""
    return [m for m in (state.get("members") or {}).values() if "fenced" not in m]


def _end_state(
    parts: tuple[State, ...], live: list[dict[str, Any]], busy: str
) -> tuple[int, str | None, str]:
    """(members, state, where the state comes from) at the end: the newest describe answer when it came
    after the last membership answer, else worked out from the members seen (``busy`` when some are left)."""
    described = [p["describe"] for p in parts if p.get("describe")]
    newest = max(described, key=lambda d: int(d.get("ts", 0)), default=None)
    last = max(int(p.get("last_ts", -1)) for p in parts)
    if newest is not None and int(newest.get("ts", 0)) >= last:
        return int(newest.get("members", len(live))), newest.get("state"), "describe"
    if not any(int(p.get("n_seen", 0)) for p in parts):
        return 0, None, ""
    return len(live), busy if live else "Empty", "members"


# -- heatmap ----------------------------------------------------------------------------------------------

#: Cell categories of the coverage heatmap, in colour-map order.
CATEGORIES = (
    ("not defined", "#ffffff"),
    ("defined, unused, not advertised", "#eeeeee"),
    ("advertised, unused", "#b9d4ec"),
    ("advertised and used", "#2e8b57"),
    ("used, NOT advertised", "#d62728"),
)


def coverage_grid(cells: list[CoverageCell]) -> tuple[list[int], int, list[list[int]]]:
    """(api keys as rows, number of version columns, category index per cell) for the heatmap.

    Rows are the APIs something advertised or used; columns run from v0 to the highest version any of
    them defines, advertises or uses. A version the codec defines (in 4.x or 3.9) but nobody advertised
    or used is shown as "defined", so removed versions stay visible.
    """
    table = load_table()
    apis = sorted({c.api_key for c in cells})
    by_cell = {(c.api_key, c.version): c for c in cells}
    top = 0
    for api in apis:
        spec = table.requests.get(api)
        top = max([top, *(v for (a, v) in by_cell if a == api)] + ([spec.max_version] if spec else []))
    grid: list[list[int]] = []
    for api in apis:
        spec = table.requests.get(api)
        defined = set(spec.versions()) if spec else set()
        row: list[int] = []
        for version in range(top + 1):
            cell = by_cell.get((api, version))
            if cell is None:
                row.append(1 if version in defined else 0)
            elif cell.used and not cell.advertised:
                row.append(4)
            elif cell.used:
                row.append(3)
            else:
                row.append(2)
        grid.append(row)
    return apis, top + 1, grid


def render_coverage_png(cells: list[CoverageCell]) -> bytes:
    """The ApiVersions coverage heatmap (API x version), removed-in-4.0 versions hatched, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch, Rectangle

    from checks.rules.apiversions import removed_in_4_0

    apis, columns, grid = coverage_grid(cells)
    used = {(c.api_key, c.version): c.used for c in cells if c.used}
    rows = max(len(apis), 1)
    width = max(7.0, 2.6 + 0.42 * columns)
    height = 1.9 + 0.3 * rows
    fig, ax = plt.subplots(figsize=(width, height), dpi=110)
    try:
        if not apis:
            ax.text(0.5, 0.5, "no ApiVersions or requests in this capture", ha="center", va="center")
            ax.set_axis_off()
        else:
            cmap = ListedColormap([c for _, c in CATEGORIES])
            norm = BoundaryNorm([i - 0.5 for i in range(len(CATEGORIES) + 1)], cmap.N)
            ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
            for y, api in enumerate(apis):
                for x in range(columns):
                    if grid[y][x] and removed_in_4_0(api, x):
                        ax.add_patch(
                            Rectangle(
                                (x - 0.5, y - 0.5), 1, 1, fill=False, hatch="////", edgecolor="#555555", lw=0
                            )
                        )
                    count = used.get((api, x))
                    if count:
                        ax.text(
                            x,
                            y,
                            _short(count),
                            ha="center",
                            va="center",
                            fontsize=7,
                            color="white",
                            fontweight="bold",
                        )
            ax.set_xticks(range(columns), [f"v{v}" for v in range(columns)], fontsize=8)
            ax.set_yticks(range(len(apis)), [f"{api_name(a)} ({a})" for a in apis], fontsize=8)
            ax.set_xticks([x - 0.5 for x in range(1, columns)], minor=True)
            ax.set_yticks([y - 0.5 for y in range(1, len(apis))], minor=True)
            ax.grid(which="minor", color="#cccccc", linewidth=0.5)
            ax.tick_params(which="minor", length=0)
            # Version labels on both edges: a broker advertising every API makes a tall chart.
            ax.tick_params(axis="x", which="major", top=True, labeltop=True, bottom=True, labelbottom=True)
            ax.set_title(
                "ApiVersions coverage: advertised by brokers vs used by clients", fontsize=10, pad=24
            )
            handles = [Patch(facecolor=c, edgecolor="#999999", label=name) for name, c in CATEGORIES[1:]]
            handles.append(
                Patch(facecolor="white", edgecolor="#555555", hatch="////", label="removed in Kafka 4.0")
            )
            ax.legend(
                handles=handles,
                loc="upper center",
                bbox_to_anchor=(0.5, -0.3 / height - 0.01),
                ncol=3,
                fontsize=8,
                frameon=False,
            )
            fig.text(0.01, 0.005, "numbers: requests seen", fontsize=7, color="#555555")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def _short(n: int) -> str:
    return str(n) if n < 1000 else f"{n / 1000:.0f}k" if n < 1_000_000 else f"{n / 1_000_000:.0f}M"


# -- text and HTML ----------------------------------------------------------------------------------------


def summary_text(report: ReportData, timeline: list[TimelineEntry] | None = None) -> str:
    """The report's summary. ``timeline`` (the live report) adds the streaming job's alerts, counted
    apart from the findings: the two come from different monitors (this report's own checks over the
    records it read, and the job's batches), so one must never be shown under the other's count."""
    s = report.stats
    # Where the tap itself may have lost records (its findings say which others are incomplete).
    by_rule = s.get("findings") or {}
    lines = [
        f"kpmon report: {report.source}" if report.source else "kpmon report",
        f"frames {s.get('frames', 0)}, exchanges {s.get('exchanges', 0)}, decode errors "
        f"{s.get('decode_errors', 0)}, gaps {s.get('gaps', 0)}, tap worker deaths "
        f"{by_rule.get('tap.worker_lost', 0)}, tap starts {by_rule.get('tap.tap_start', 0)}, late "
        f"{s.get('late_frames', 0)}",
        f"brokers {len(report.brokers)}, groups {len(report.groups)}, producers {len(report.producers)}, "
        f"client software {len({r.software for r in report.fleet})}",
        f"findings: {len(report.findings)}"
        + (" (this report's checks over the records above; see Findings)" if timeline is not None else ""),
    ]
    lines += [f"  {sev:<8} {rule:<42} {n}" for rule, sev, n in report.finding_counts]
    if timeline is not None:
        firing = sum(1 for e in timeline if e.status != "resolved")
        lines.append(
            f"alerts: {len(timeline)} raised by the streaming job, {firing} still firing (see Alert timeline)"
        )
        lines += [f"  {sev:<8} {rule:<42} {n}" for (rule, sev), n in _counts_by_rule(timeline)]
    removed = sorted({(r.software, r.api_name, r.version) for r in report.fleet if r.removed_in_4_0})
    if removed:
        lines.append("not ready for Kafka 4.0 (KIP-896):")
        lines += [f"  {sw}: {api} v{v}" for sw, api, v in removed]
    return "\n".join(lines)


# -- JSON and the CI gate ---------------------------------------------------------------------------------

#: The ``kpmon report --json`` document's layout; raised when a field changes meaning or goes away.
JSON_SCHEMA_VERSION = 1


def finding_severity(finding: Mapping[str, Any]) -> Severity:
    """A finding's severity as alerts count it: an ``incomplete`` one (the tap lost records of its
    connection) is only ``info``, whatever the rule said."""
    return Severity.INFO if finding.get("incomplete") else Severity(finding["severity"])


def highest_severity(report: ReportData) -> Severity | None:
    """The most urgent severity among the report's findings, None when there are none."""
    severities = [finding_severity(f) for f in report.findings]
    return max(severities, key=lambda s: s.rank) if severities else None


def failing_findings(report: ReportData, threshold: Severity) -> list[dict[str, Any]]:
    """The findings at or above ``threshold`` (``--fail-on``)."""
    return [f for f in report.findings if finding_severity(f).rank >= threshold.rank]


def report_json(report: ReportData, fail_on: Severity | None = None) -> dict[str, Any]:
    """The findings and the summary as one JSON-ready document (``kpmon report --json``)."""
    worst = highest_severity(report)
    doc: dict[str, Any] = {
        "schema": JSON_SCHEMA_VERSION,
        "source": report.source,
        "stats": report.stats,
        "summary": {
            "findings": len(report.findings),
            "highest_severity": worst.value if worst is not None else None,
            "by_rule": [{"rule": r, "severity": s, "count": n} for r, s, n in report.finding_counts],
            "brokers": [{"broker": b, "role": role} for b, role in report.brokers],
            "groups": [asdict(g) for g in report.groups],
            "producers": [
                {**asdict(p), "transactional_ids": list(p.transactional_ids)} for p in report.producers
            ],
            "not_ready_for_4_0": [
                {"software": sw, "api": api, "version": v}
                for sw, api, v in sorted(
                    {(r.software, r.api_name, r.version) for r in report.fleet if r.removed_in_4_0}
                )
            ],
        },
        "findings": report.findings,
    }
    if fail_on is not None:
        doc["fail_on"] = {"severity": fail_on.value, "failing": len(failing_findings(report, fail_on))}
    return doc


# -- alert timeline (from the streaming job's per-batch results) --------------------------------------


@dataclass(frozen=True)
class TimelineEntry:
    """One alert as its newest batch result left it; times are event times (tap ``ts_ns``)."""

    id: str
    rule: str
    severity: str
    status: str
    subject: str
    summary: str
    first_seen: int
    last_seen: int
    count: int


def alert_timeline(batches: Iterable[Mapping[str, Any]]) -> list[TimelineEntry]:
    """Fold per-batch results (oldest first) into one entry per alert id, the newest update winning.

    A batch lists the alerts it opened, updated or resolved; results files that are malformed (a batch
    written by another version, a truncated file) are skipped rather than failing the whole report.
    """
    latest: dict[str, TimelineEntry] = {}
    for batch in batches:
        for alert in batch.get("alerts") or []:
            try:
                entry = TimelineEntry(
                    id=str(alert["id"]),
                    rule=str(alert["rule"]),
                    severity=str(alert["severity"]),
                    status=str(alert["status"]),
                    subject=str(alert.get("subject", "")),
                    summary=str(alert.get("summary", "")),
                    first_seen=int(alert["first_seen"]),
                    last_seen=int(alert["last_seen"]),
                    count=int(alert.get("count", 1)),
                )
            except (KeyError, TypeError, ValueError):
                continue
            latest[entry.id] = entry
    return sorted(latest.values(), key=lambda e: (e.first_seen, e.rule, e.subject, e.id))


_SEV_COLOUR = {"critical": "#b00020", "warning": "#e6a100", "info": "#4a90d9"}


def _clock(ts_ns: int) -> str:
    seconds = ts_ns // 1_000_000_000
    return f"{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def render_timeline_svg(entries: list[TimelineEntry], width: int = 900) -> str:
    """An inline SVG: one lane per rule (most severe first), each alert a mark from first to last seen.

    Firing alerts are filled, resolved ones hollow; the axis is event time, UTC.
    """
    if not entries:
        return ""
    lanes = sorted(
        {(e.rule, e.severity) for e in entries}, key=lambda rs: (-SEVERITY_RANK.get(rs[1], 0), rs[0])
    )
    lane_of = {lane: i for i, lane in enumerate(lanes)}
    start = min(e.first_seen for e in entries)
    end = max(max(e.last_seen, e.first_seen) for e in entries)
    span = max(end - start, 1_000_000_000)
    label_w, lane_h, top = 300, 22, 24
    plot_w = width - label_w - 20
    height = top + lane_h * len(lanes) + 24

    def x(ts: int) -> float:
        return label_w + plot_w * (ts - start) / span

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="alert timeline" font-family="sans-serif" font-size="11">'
    ]
    for (rule, severity), i in lane_of.items():
        y = top + i * lane_h
        out.append(
            f'<rect x="0" y="{y}" width="{width}" height="{lane_h}" fill="{"#f7f7f7" if i % 2 else "#fff"}"/>'
        )
        out.append(f'<text x="4" y="{y + 15}">{html.escape(f"{rule} ({severity})")}</text>')
    for tick in range(5):
        ts = start + span * tick // 4
        tx = x(ts)
        out.append(f'<line x1="{tx:.1f}" y1="{top - 4}" x2="{tx:.1f}" y2="{height - 20}" stroke="#ddd"/>')
        out.append(f'<text x="{tx:.1f}" y="{height - 6}" text-anchor="middle">{_clock(ts)}</text>')
    out.append(f'<text x="{label_w}" y="14" fill="#555">event time (UTC)</text>')
    for e in entries:
        cy = top + lane_of[(e.rule, e.severity)] * lane_h + lane_h / 2
        colour = _SEV_COLOUR.get(e.severity, "#777")
        x0, x1 = x(e.first_seen), x(max(e.last_seen, e.first_seen))
        fill = colour if e.status != "resolved" else "#fff"
        title = html.escape(
            f"{_clock(e.first_seen)} {e.status} {e.rule} {e.subject}: {e.summary} (x{e.count})"
        )
        out.append("<g>")
        out.append(f"<title>{title}</title>")
        if x1 - x0 >= 1:
            out.append(
                f'<line x1="{x0:.1f}" y1="{cy}" x2="{x1:.1f}" y2="{cy}" stroke="{colour}" stroke-width="3"/>'
            )
        out.append(
            f'<circle cx="{x0:.1f}" cy="{cy}" r="5" fill="{fill}" stroke="{colour}" stroke-width="2"/>'
        )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def _counts_by_rule(entries: list[TimelineEntry]) -> list[tuple[tuple[str, str], int]]:
    """((rule, severity), alerts), the most severe first."""
    counts = Counter((e.rule, e.severity) for e in entries)
    return sorted(counts.items(), key=lambda item: (-SEVERITY_RANK.get(item[0][1], 0), item[0][0]))


def render_timeline_html(entries: list[TimelineEntry]) -> str:
    """The timeline section: counts by rule and severity, the SVG, and every alert in order."""
    if not entries:
        return '<p class="muted">no alerts yet</p>'
    firing = Counter((e.rule, e.severity) for e in entries if e.status != "resolved")
    by_rule = _counts_by_rule(entries)
    parts = [
        _table(
            ["severity", "rule", "alerts", "still firing"],
            [[sev, rule, str(n), str(firing[(rule, sev)])] for (rule, sev), n in by_rule],
            [[sev, "", "", ""] for (_rule, sev), _n in by_rule],
        ),
        render_timeline_svg(entries),
        _table(
            ["first seen (UTC)", "last seen", "severity", "rule", "subject", "status", "count", "summary"],
            [
                [
                    _clock(e.first_seen),
                    _clock(e.last_seen),
                    e.severity,
                    e.rule,
                    e.subject,
                    e.status,
                    str(e.count),
                    e.summary,
                ]
                for e in entries
            ],
            [["", "", e.severity, "", "", "", "", ""] for e in entries],
        ),
    ]
    return "\n".join(parts)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.critical { color: #fff; background: #b00020; } td.warning { background: #ffd666; } td.info { background: #e6f0fa; }
td.removed { background: #f8d7da; }
.muted { color: #777; }
"""


def _table(headers: list[str], rows: list[list[str]], classes: list[list[str]] | None = None) -> str:
    if not rows:
        return '<p class="muted">none</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = classes[i] if classes else [""] * len(row)
        cells = "".join(
            f'<td class="{c}">{html.escape(v)}</td>' if c else f"<td>{html.escape(v)}</td>"
            for v, c in zip(row, cls, strict=True)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def render_html(
    report: ReportData,
    coverage_png: bytes | None,
    png_name: str | None = None,
    timeline: list[TimelineEntry] | None = None,
    links: list[tuple[str, str]] | None = None,
) -> str:
    """A self-contained HTML page (the PNG embedded; ``png_name`` links the file written next to it).

    ``timeline`` (the live monitor's alerts) adds an "Alert timeline" section; ``links`` (label, href)
    adds a list of links, e.g. to the Great Expectations Data Docs.
    """
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>kpmon report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>kafka-protocol-monitor report</h1>",
        f"<p class='muted'>{html.escape(report.source)}</p>",
    ]
    if links:
        items = "".join(
            f"<li><a href='{html.escape(href, quote=True)}'>{html.escape(label)}</a></li>"
            for label, href in links
        )
        parts.append(f"<ul class='links'>{items}</ul>")
    parts += ["<h2>Summary</h2>", f"<pre>{html.escape(summary_text(report, timeline))}</pre>"]
    if timeline is not None:
        parts += ["<h2>Alert timeline</h2>", render_timeline_html(timeline)]
    parts.append("<h2>ApiVersions coverage</h2>")
    if coverage_png:
        data = base64.b64encode(coverage_png).decode()
        img = f"<img alt='ApiVersions coverage heatmap' src='data:image/png;base64,{data}'>"
        parts.append(f"<a href='{html.escape(png_name)}'>{img}</a>" if png_name else img)
    parts.append("<h3>Brokers</h3>")
    parts.append(_table(["broker", "role"], [[label, role] for label, role in report.brokers]))
    parts.append("<h3>Fleet readiness (client software x API x version)</h3>")
    parts.append(
        _table(
            ["client software", "API", "version", "requests", "removed in 4.0"],
            [
                [
                    r.software,
                    f"{r.api_name} ({r.api_key})",
                    str(r.version),
                    str(r.count),
                    "yes" if r.removed_in_4_0 else "",
                ]
                for r in report.fleet
            ],
            [["", "", "", "", "removed" if r.removed_in_4_0 else ""] for r in report.fleet],
        )
    )
    parts.append("<h2>Consumer groups</h2>")
    parts.append(
        "<p>Group protocol: classic (JoinGroup/SyncGroup), consumer (KIP-848), share (KIP-932), streams "
        "(KIP-1071); several joined by + when one group id was served under more than one (a KIP-848 "
        "online migration). What the frames showed: classic groups the newest generation, the others "
        "the highest group and member epochs answered and the assignor asked for; the members seen, "
        "how many left or were fenced, and those left at the end; the state at the end, from the newest "
        "describe answer or (marked <i>members</i>) worked out from the members seen.</p>"
    )
    parts.append(
        _table(
            [
                "group",
                "group protocol",
                "protocol type",
                "protocol / assignor",
                "generation / group epoch",
                "member epoch",
                "members seen",
                "left",
                "fenced",
                "members at end",
                "state at end",
            ],
            [
                [
                    g.group,
                    g.protocol,
                    str(g.protocol_type or ""),
                    str(g.protocol_name or ""),
                    str(g.generation) if g.generation >= 0 else "",
                    str(g.member_epoch) if g.member_epoch >= 0 else "",
                    str(g.members_seen),
                    str(g.members_left),
                    str(g.members_fenced),
                    str(g.members),
                    str(g.state or "") + (" (members)" if g.state_from == "members" else ""),
                ]
                for g in report.groups
            ],
        )
    )
    parts.append("<h2>Producers</h2>")
    parts.append(
        _table(
            ["producer id", "newest epoch", "epoch learnt from", "transactional ids", "open transaction"],
            [
                [
                    str(p.producer_id),
                    str(p.epoch),
                    p.epoch_source,
                    ", ".join(p.transactional_ids),
                    "yes" if p.open_transaction else "",
                ]
                for p in report.producers
            ],
        )
    )
    parts.append("<h2>Findings</h2>")
    parts.append(
        _table(
            ["severity", "rule", "subject", "summary", "evidence"],
            [
                [
                    f["severity"] + (" (incomplete)" if f["incomplete"] else ""),
                    f["rule"],
                    f["subject"],
                    f["summary"],
                    json.dumps(f["evidence"], default=str, sort_keys=True)[:400],
                ]
                for f in report.findings
            ],
            [[f["severity"], "", "", "", ""] for f in report.findings],
        )
    )
    parts.append("</body></html>")
    return "\n".join(parts)
