"""The live report of ``kpmon run``: ``kpmon report`` over the growing tap topic, plus the alert timeline.

The tap topic is read incrementally (each update reads only what arrived since the last one) into one
monitor that lives as long as the run, so a report costs the new records, not the whole topic. What the
page contains, and how it looks, is ``checks.report``'s; the timeline comes from the streaming job's
per-batch results (what it actually alerted on), not from this second monitor.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from checks.engine import Monitor
from checks.model import Finding
from checks.report import alert_timeline, build_report
from kpconfig.model import KpmonConfig
from kpmon.commands.report import TapTopicReader, write_report
from kpmon.commands.topicopts import InputError


class LiveReport:
    def __init__(self, config: KpmonConfig, out: Path) -> None:
        import checks
        from streaming.paths import StreamPaths

        self.config = config
        self.out = out
        self.stream = StreamPaths.of(config)
        self.monitor: Monitor = checks.new_monitor(config.checks.settings())
        self.findings: list[Finding] = []
        self.records = 0
        self._reader: TapTopicReader | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _read_new(self) -> None:
        cluster = self.config.tap_cluster
        if self._reader is None:
            self._reader = TapTopicReader(
                cluster.bootstrap_servers, self.config.tap.topic, cluster.properties
            )
        for frame in self._reader.read_to_end():
            self.records += 1
            self.findings.extend(self.monitor.feed(frame))

    def links(self) -> list[tuple[str, str]]:
        base = self.out.parent

        def rel(path: Path) -> str:
            return os.path.relpath(path, base)

        # streaming.quality_docs.DocsSite.index: <data-docs>/site/index.html (importing it loads GX).
        docs = self.stream.data_docs / "site" / "index.html"
        out = [
            (
                "Great Expectations Data Docs"
                + ("" if docs.exists() else " (rendered after the first batches)"),
                rel(docs),
            ),
            ("per-batch results of the streaming job (JSON)", rel(self.stream.batches)),
            ("streaming job progress (JSON)", rel(self.stream.progress)),
        ]
        return out

    def write(self, final: bool = False) -> Path:
        """Read what is new in the tap topic and rewrite the report; ``final`` also flushes the monitor
        (open transactions and timers are judged as at the end of a capture).

        Raises ``InputError`` when the tap topic cannot be read (e.g. not created yet).
        """
        from streaming.sink import read_batches

        with self._lock:
            if self._closed:
                raise InputError("the report is closed (the run is stopping)")
            self._read_new()
            if final:
                self.findings.extend(self.monitor.flush())
            cluster = self.config.tap_cluster.bootstrap_servers
            stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            source = (
                f"tap topic {self.config.tap.topic} on {cluster}: {self.records} records; "
                f"{'final report' if final else 'updated'} {stamp}"
            )
            report = build_report(self.monitor.states, self.findings, self.monitor.stats, source)
            timeline = alert_timeline(read_batches(self.stream))
            write_report(report, self.out, timeline, self.links())
            return self.out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._reader is not None:
                self._reader.close()
                self._reader = None


__all__ = ["InputError", "LiveReport"]
