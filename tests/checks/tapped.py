"""Real traffic through the real tap, read back from the tap topic as ``checks`` frames and findings.

``read_tap_frames`` turns (a range of) a tap topic into decoded ``TapFrame`` objects, exactly as the
report and the streaming job see them. ``ScenarioTap`` shares one tap and one tap topic between several
scenarios: each ``run`` reads back only the records its own scenario produced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import checks
from checks.model import Finding, Severity
from checks.rule import StateKey
from codec.taprecord import TapFrame, frames_from_record, headers_dict
from tests.tap.harness import TappedCluster, TapRecord, TapThread, read_topic_range, topic_end_offsets


def frames_of(records: list[TapRecord]) -> list[TapFrame]:
    """Tap records (as read from the topic) to frames, decoded with the codec like any consumer would."""
    return [
        frame
        for r in records
        for frame in frames_from_record(headers_dict(r.headers), r.value, r.partition, r.offset)
    ]


def read_tap_frames(bootstrap: str, topic: str, since: dict[int, int] | None = None) -> list[TapFrame]:
    """Every frame of tap topic ``topic`` after ``since`` (partition -> offset; default: all of it)."""
    return frames_of(read_topic_range(bootstrap, topic, since))


@dataclass
class Checked:
    """What one scenario did, the frames the tap mirrored for it and what the whole catalogue found."""

    result: dict[str, Any]
    frames: list[TapFrame]
    findings: list[Finding]
    stats: checks.Stats
    states: dict[StateKey, Any] = field(default_factory=dict)

    def of(self, rule: str) -> list[Finding]:
        return [f for f in self.findings if f.rule == rule]

    def above_info(self) -> list[Finding]:
        return [f for f in self.findings if f.severity != Severity.INFO]

    def requests(self, api_key: int) -> list[TapFrame]:
        return [f for f in self.frames if f.direction == "req" and f.api_key == api_key]

    def describe(self) -> str:
        """For assertion messages: the scenario's outcome and every finding."""
        lines = [f"scenario: {self.result}", f"frames: {len(self.frames)}, stats: {self.stats}"]
        lines += [f"  {f.severity.value} {f.rule} {f.subject}: {f.summary}" for f in self.findings]
        return "\n".join(lines)


class ScenarioTap:
    """One running tap and tap topic; scenarios run one after another, each read back on its own."""

    def __init__(self, cluster: TappedCluster, capture: str = "full") -> None:
        self.cluster = cluster
        self.tap: TapThread
        self.tap, self.topic = cluster.start_tap(capture=capture)

    def run(self, scenario: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> Checked:
        """Run ``scenario(bootstrap, *args, **kwargs)`` through the tap; check what it sent."""
        mirror = self.cluster.mirror_bootstrap
        since = topic_end_offsets(mirror, self.topic)
        result = scenario(self.cluster.bootstrap, *args, **kwargs)
        # Every connection closed and every record delivered: the range read next is complete.
        self.tap.wait_mirrored()
        frames = read_tap_frames(mirror, self.topic, since)
        monitor = checks.new_monitor()
        findings = monitor.feed_all(frames)
        findings.extend(monitor.flush())
        return Checked(result, frames, findings, monitor.stats, dict(monitor.states))

    def stop(self) -> None:
        self.tap.stop()
