"""The streaming job as a real process for end-to-end tests: start, kill -9, stop gracefully."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from streaming.paths import StreamPaths
from streaming.status import read_progress

REPO = Path(__file__).resolve().parents[2]


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


class StreamProcess:
    """``python -m streaming --config FILE`` in its own process group (the JVM dies with it)."""

    def __init__(self, config_path: Path, state_dir: Path, log_path: Path) -> None:
        self.config_path = config_path
        self.paths = StreamPaths(state_dir / "stream")
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> StreamProcess:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streaming", "--config", str(self.config_path)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    def batch_id(self) -> int:
        progress = read_progress(self.paths.progress) or {}
        value = progress.get("batchId")
        return int(value) if isinstance(value, int) else -1

    def wait_batches(self, at_least: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.batch_id() < at_least:
            self.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"no batch {at_least} within {timeout:.0f} s; log: {self.tail()}")
            time.sleep(0.5)

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the job exited with {self.proc.returncode}: {self.tail()}")

    def kill9(self) -> None:
        """SIGKILL the whole process group: no graceful anything, as a crashed host would."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout: float = 120.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.paths.stop_marker.parent.mkdir(parents=True, exist_ok=True)
            self.paths.stop_marker.touch()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        return int(self.proc.returncode)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class KeepTrafficFlowing:
    """A real consumer polling through the tap, as every live cluster has: Fetch long-polls keep the
    tap topic's event time, and so Spark's watermark, moving while nothing else happens."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keep-traffic-flowing", daemon=True)

    def _run(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"kpmon-keepalive-{uuid.uuid4().hex[:6]}",
                "client.id": "kpmon-keepalive",
                "fetch.wait.max.ms": 300,
                "topic.metadata.refresh.interval.ms": 2000,
            }
        )
        consumer.subscribe([self.topic])
        try:
            while not self._stop.is_set():
                consumer.poll(0.3)
        finally:
            consumer.close()

    def start(self) -> KeepTrafficFlowing:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def batch_results(paths: StreamPaths) -> list[dict[str, Any]]:
    out = []
    for path in sorted(paths.batches.glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[1])):
        out.append(json.loads(path.read_text()))
    return out
