"""The supervisor's metrics endpoint: the workers' registries summed, each worker's queue its own series."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from tap.metrics import TapMetrics
from tap.workers import PER_WORKER, SummedMetrics, as_families, merge, read_snapshot, write_snapshot


def _worker(frames: int, depth: int) -> TapMetrics:
    metrics = TapMetrics()
    listener = metrics.listener(1, "PLAINTEXT")
    for _ in range(frames):
        listener.frame("req", 0, 9, 100)
    listener.latency(0, False, 0.0001 * frames)
    listener.connections.set(frames)
    metrics.queue_depth.set(depth)
    return metrics


def test_counters_and_histograms_sum_and_queue_gauges_stay_per_worker(tmp_path: Path) -> None:
    paths = []
    for index, (frames, depth) in enumerate(((3, 5), (4, 7))):
        path = str(tmp_path / f"w{index}")
        write_snapshot(_worker(frames, depth).registry, path)
        paths.append(path)
    sums: dict = {}
    for index, path in enumerate(paths):
        merge(sums, read_snapshot(path), str(index))
    samples = {
        (sample, labels): value
        for _, (_, _, found) in sums.items()
        for (sample, labels), value in found.items()
    }
    where = (
        ("api", "PRODUCE"),
        ("api_version", "9"),
        ("broker_id", "1"),
        ("dir", "req"),
        ("listener", "PLAINTEXT"),
    )
    assert samples[("kpmon_tap_frames_total", where)] == 7
    assert samples[("kpmon_tap_bytes_total", where)] == 700
    assert samples[("kpmon_tap_active_connections", (("broker_id", "1"), ("listener", "PLAINTEXT")))] == 7
    count = [v for (s, _), v in samples.items() if s == "kpmon_tap_inside_seconds_count"]
    assert count == [2]
    assert samples[("kpmon_tap_mirror_queue_depth", (("worker", "0"),))] == 5
    assert samples[("kpmon_tap_mirror_queue_depth", (("worker", "1"),))] == 7
    assert not any(s.endswith("_created") for s, _ in samples)
    assert "kpmon_tap_mirror_queue_depth" in PER_WORKER


def test_a_dead_workers_counters_stay_in_the_totals(tmp_path: Path) -> None:
    class Supervisor:
        def __init__(self) -> None:
            self.workers: list = []
            self.retired: list = []
            self.registry = CollectorRegistry()

    supervisor = Supervisor()
    path = str(tmp_path / "dead")
    write_snapshot(_worker(5, 9).registry, path)
    retired: dict = {}
    merge(retired, read_snapshot(path), kinds=("counter", "histogram"))
    supervisor.retired = as_families(retired)
    registry = CollectorRegistry()
    registry.register(SummedMetrics(supervisor))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert (
        'kpmon_tap_frames_total{api="PRODUCE",api_version="9",broker_id="1",dir="req",listener="PLAINTEXT"} 5.0'
        in text
    )
    assert "kpmon_tap_mirror_queue_depth" not in text, "a dead worker's queue is gone, not frozen"
    assert "kpmon_tap_active_connections{" not in text
