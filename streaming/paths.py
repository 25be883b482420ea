"""Where the streaming job keeps its files, all under ``<state_dir>/stream`` unless configured."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kpconfig.model import KpmonConfig


@dataclass(frozen=True)
class StreamPaths:
    root: Path

    @classmethod
    def of(cls, config: KpmonConfig) -> StreamPaths:
        return cls(Path(config.state_dir).resolve() / "stream")

    def checkpoint(self, config: KpmonConfig) -> str:
        return config.stream.checkpoint_dir or str(self.root / "checkpoint")

    @property
    def progress(self) -> Path:
        """The newest query progress, as JSON with kpmon's own figures added (``kpmon stream status``)."""
        return self.root / "progress.json"

    @property
    def stop_marker(self) -> Path:
        """Create this file to stop the job gracefully (after the running batch)."""
        return self.root / "STOP"

    @property
    def pid_file(self) -> Path:
        return self.root / "stream.pid"

    @property
    def alert_books(self) -> Path:
        return self.root / "alerts"

    @property
    def batches(self) -> Path:
        """One JSON file per micro-batch: its findings, the alerts it published and its counters."""
        return self.root / "batches"

    @property
    def spool(self) -> Path:
        return self.root / "hooks-spool"

    @property
    def data_docs(self) -> Path:
        return self.root / "data-docs"

    @property
    def spark_log(self) -> Path:
        return self.root / "spark.log"

    def make(self) -> None:
        for path in (self.root, self.alert_books, self.batches, self.spool):
            path.mkdir(parents=True, exist_ok=True)
