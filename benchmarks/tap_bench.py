"""Tap overhead: Kafka's perf tools direct vs through the tap, alternating, per capture policy.

Starts a local single-broker stack that advertises the tap's port, and runs the tap as its own
process (``kpmon tap``) so its CPU can be read from /proc. "Direct" runs bootstrap from the broker's
inter-broker listener, which advertises the broker itself; "tap" runs bootstrap from the tap.
Capture ``off`` forwards and counts only (``--no-mirror``); the others mirror to a tap topic on the
same broker (through the internal listener, never through the tap).

Per policy and round, each step runs direct and through the tap back to back (the order flips
every policy and round, so drift hits both sides alike):

- ``produce``: kafka-producer-perf-test at full speed (1 KiB records, acks=all, linger.ms=5);
- ``consume``: kafka-consumer-perf-test reading twice that many records from the start;
- ``produce_half``: the producer throttled (``--throughput``) to half of this policy's measured
  direct saturation rate, for the "added p99 at 50 % load" target.

Each run lasts about ``--seconds``: the record count comes from a warm-up run's rate.

Every run through a mirroring tap also measures its **completeness**: the request and response
records read back from the tap topic between the run's start and end offsets (once the mirror queue
has drained) over the frames the tap's own counter says it forwarded, with the mirror drops and
delivery errors from its counters. The produce step runs at the direct saturation rate, so the
``headers`` policy's produce runs are the issue's figure (target 99.9 %). Afterwards
one more tap (policy ``--profile``) runs a produce and a consume step under py-spy (attached by pid,
so it is not in the measured runs); the top frames go into the JSON.

    .venv/bin/python benchmarks/tap_bench.py                     # 2 rounds of ~12 s runs: ~10 minutes
    .venv/bin/python benchmarks/tap_bench.py --seconds 30        # the issue's 30 s runs, ~20 minutes
    .venv/bin/pip install py-spy                                 # once, for the profile (else skipped)

Two more modes each write their own key of the same file, keeping the rest (each with its own date
and machine; run ``overhead`` first, it rewrites everything else):

- ``--mode scale`` (``workers``): a tap with 1 and 2 workers (``tap.workers``) in front of an
  in-process stub broker, driven by a synthetic load one worker cannot carry
  (``benchmarks/tap_load.py``: many connections of small Produce requests, pipelined); MB/s and
  frames/s for each, and ``scale_2_over_1``. The tap forwards without mirroring (the stub is no
  Kafka), so this measures the forwarding path.
- ``--mode latency`` (``latency_pinned``): the tap pinned to one CPU, the broker, the perf tools and
  this process to the others; the producer at half of its direct saturation rate, direct and through
  the tap per policy: added p50/p99 next to the tap's own ``kpmon_tap_inside_seconds``.

    .venv/bin/python benchmarks/tap_bench.py --mode scale --seconds 20 --rounds 3
    .venv/bin/python benchmarks/tap_bench.py --mode latency --seconds 30 --rounds 2

Writes ``benchmarks/results/tap_bench.json``: per run throughput, producer p50/p99, the tap's CPU
(seconds, mean cores, milli-cores per MB/s and that figure over Kroxylicious's published ~25 mcores
per MB/s for pass-through), a per-policy summary with a verdict per target, and the profile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results_file import machine  # noqa: E402
from deploy.local.stack import LocalStack  # noqa: E402
from deploy.local.tools import run_tool  # noqa: E402
from deploy.versions import KAFKA_LATEST, KAFKA_LEGACY  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "tap_bench.json"
RECORD_SIZE = 1024
#: Kroxylicious's published pass-through cost, the named comparison for the tap's CPU figure.
KROXYLICIOUS_MCORES_PER_MB_S = 25.0
#: ``completeness``: frames mirrored / frames forwarded at the direct saturation rate (issue 10).
TARGETS = {
    "headers_ratio": 0.90,
    "full_ratio": 0.75,
    "added_p99_ms_at_half": 2.0,
    "completeness": 0.999,
    "scale_2_over_1": 1.7,
}
TOPIC_CONFIG = ["retention.bytes=3221225472", "segment.bytes=268435456"]
_PERF = re.compile(
    r"(?P<n>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th"
)
_TICKS = os.sysconf("SC_CLK_TCK")
#: Frames of the tap and the codec (including the codec's generated decoders, ``<kpmon:...>``).
_OURS = re.compile(r"\((tap|codec)/|\(<kpmon:")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0  # gone between listing and reading
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime, all threads


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it (the tap's workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def _tool(version: str, tool: str, args: list[str], timeout: float) -> str:
    done = run_tool(version, tool, args, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{tool} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def produce(
    version: str, bootstrap: str, topic: str, records: int, throughput: float = -1
) -> dict[str, float]:
    args = ["--topic", topic, "--num-records", str(records), "--record-size", str(RECORD_SIZE)]
    args += ["--throughput", str(int(throughput)) if throughput > 0 else "-1"]
    args += ["--producer-props", f"bootstrap.servers={bootstrap}", "acks=all", "linger.ms=5"]
    out = _tool(version, "kafka-producer-perf-test", args, timeout=900)
    match = None
    for line in out.splitlines():
        match = _PERF.search(line) or match
    if match is None:
        raise RuntimeError(f"no summary in producer perf-test output:\n{out[-2000:]}")
    return {
        "records_per_sec": float(match["rps"]),
        "mb_per_sec": float(match["mbps"]),
        "p50_ms": float(match["p50"]),
        "p99_ms": float(match["p99"]),
        "avg_ms": float(match["avg"]),
    }


def consume(version: str, bootstrap: str, topic: str, records: int) -> dict[str, float]:
    count = "--num-records" if version == KAFKA_LATEST else "--messages"
    args = ["--bootstrap-server", bootstrap, "--topic", topic, count, str(records), "--timeout", "60000"]
    args += ["--group", f"tap-bench-{time.monotonic_ns()}"]
    out = _tool(version, "kafka-consumer-perf-test", args, timeout=900)
    return parse_consumer(out)


def parse_consumer(out: str) -> dict[str, float]:
    """The summary line of kafka-consumer-perf-test (header, then one CSV row)."""
    lines = [line for line in out.splitlines() if line.count(",") >= 5]
    header = next((line for line in lines if "MB.sec" in line), None)
    rows = [line for line in lines if line is not header]
    if header is None or not rows:
        raise RuntimeError(f"no summary in consumer perf-test output:\n{out[-2000:]}")
    names, values = header.split(","), rows[-1].split(",")
    if len(names) != len(values):
        raise RuntimeError(f"consumer perf-test summary does not match its header:\n{header}\n{rows[-1]}")
    row = {n.strip(): v.strip() for n, v in zip(names, values, strict=True)}
    # fetch.* exclude the group join (rebalance.time.ms), which is the same work with or without a tap.
    return {
        "records_consumed": float(row["data.consumed.in.nMsg"]),
        "mb_per_sec": float(row["fetch.MB.sec"]),
        "records_per_sec": float(row["fetch.nMsg.sec"]),
        "overall_mb_per_sec": float(row["MB.sec"]),
        "rebalance_ms": float(row["rebalance.time.ms"]),
    }


Buckets = dict[float, float]


def histograms(metrics_port: int, api_key: int) -> dict[str, Buckets]:
    """Cumulative bucket counts of the tap's two latency histograms for one API."""
    from prometheus_client.parser import text_string_to_metric_families

    from tap.metrics import api_label

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, Buckets] = {"inside": {}, "broker": {}}
    names = {"kpmon_tap_inside_seconds": "inside", "kpmon_tap_broker_seconds": "broker"}
    for family in text_string_to_metric_families(text):
        kind = names.get(family.name)
        if kind is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket") and sample.labels.get("api") == api_label(api_key):
                # Summed over the listeners (broker_id, listener labels).
                le = float(sample.labels["le"])
                out[kind][le] = out[kind].get(le, 0.0) + sample.value
    return out


def quantile_le_ms(before: Buckets, after: Buckets, q: float) -> float | None:
    """The upper bound (ms) of the histogram bucket holding quantile ``q`` of what was observed between."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for le in sorted(delta):
        if delta[le] >= q * total:
            return le * 1000 if le != float("inf") else None
    return None


def tap_counters(metrics_port: int) -> dict[str, float]:
    """The tap's own counters, summed over their labels: frames and bytes forwarded, mirror drops,
    delivery errors, and the mirror queue's depth now."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    wanted = {
        "kpmon_tap_frames_total": "forwarded",
        "kpmon_tap_bytes_total": "bytes_forwarded",
        "kpmon_tap_mirror_drops_total": "drops",
        "kpmon_tap_mirror_delivery_errors_total": "delivery_errors",
        "kpmon_tap_mirror_queue_depth": "queue_depth",
    }
    out = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                out[wanted[sample.name]] += sample.value
    return out


def topic_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """The tap topic's end offset per partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "kpmon-tap-bench", "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions
        }
    finally:
        consumer.close()


def mirrored_frames(bootstrap: str, topic: str, start: dict[int, int], end: dict[int, int]) -> int:
    """Request and response records (not connection open/close) the tap wrote between two sets of
    end offsets: read back from the tap topic, the independent side of the completeness figure."""
    from confluent_kafka import Consumer, TopicPartition

    from codec.taprecord import REQ, RESP, RecordError, headers_dict, parse_records

    left = {p: end[p] - start.get(p, 0) for p in end if end[p] > start.get(p, 0)}
    if not left:
        return 0
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "kpmon-tap-bench", "enable.auto.commit": False}
    )
    frames = 0
    try:
        consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in left])
        deadline = time.monotonic() + 120
        while any(n > 0 for n in left.values()) and time.monotonic() < deadline:
            for record in consumer.consume(10_000, timeout=1.0):
                partition, offset = record.partition(), record.offset()
                if record.error() is not None or partition is None or offset is None:
                    continue
                if offset >= end[partition]:
                    continue
                left[partition] -= 1
                try:
                    entries = parse_records(headers_dict(record.headers() or []), record.value())
                except RecordError:
                    continue
                frames += sum(1 for e in entries for part in e.parts if part.direction in (REQ, RESP))
        if any(n > 0 for n in left.values()):
            raise RuntimeError(f"could not read back the tap topic {topic}: {left} records unread")
    finally:
        consumer.close()
    return frames


def wait_mirror_drained(
    metrics_port: int, bootstrap: str, topic: str, timeout: float = 60.0
) -> dict[int, int]:
    """End offsets once the tap's mirror queue is empty and the topic stopped growing."""
    deadline = time.monotonic() + timeout
    ends = topic_ends(bootstrap, topic)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        again = topic_ends(bootstrap, topic)
        if tap_counters(metrics_port)["queue_depth"] == 0 and again == ends:
            return again
        ends = again
    return ends


def wait_listening(server: Any, port: int, what: str, timeout: float = 30.0) -> None:
    """Wait until ``server`` (with ``proc`` and ``stop()``) accepts on ``port``; stop it and raise if
    it exits or does not listen in time."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline or server.proc.poll() is not None:
                server.stop()
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.1)


class TapProcess:
    def __init__(
        self,
        listen: int,
        broker: str,
        policy: str,
        mirror_bootstrap: str,
        topic: str | None = None,
        workers: int = 1,
        cpus: set[int] | None = None,
        wrapper: list[str] | None = None,
    ) -> None:
        self.metrics_port = _free_port()
        self.policy = policy
        self.topic = None if policy == "off" else (topic or f"kpmon.bench.{policy}")
        self.mirror_bootstrap = mirror_bootstrap
        cmd = [sys.executable, *(wrapper or []), "-m", "kpmon.cli", "tap"]
        cmd += ["--listen", f"127.0.0.1:{listen}={broker}@1", "--workers", str(workers)]
        cmd += ["--metrics-port", str(self.metrics_port), "--log-level", "WARNING"]
        if policy == "off":
            cmd.append("--no-mirror")
        else:
            cmd += ["--capture", policy, "--tap-bootstrap-servers", mirror_bootstrap]
            cmd += ["--topic", str(self.topic)]
        # ``cpus``: the tap (and its workers, which inherit the mask) runs on these CPUs only.
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.DEVNULL, preexec_fn=pin)
        wait_listening(self, listen, "tap")

    def cpu(self) -> float:
        """CPU seconds of the tap and its worker processes."""
        return sum(_cpu_seconds(pid) for pid in _tree(self.proc.pid))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Bench:
    def __init__(self, version: str, direct: str, via_tap: str, topic: str) -> None:
        self.version, self.direct, self.via_tap, self.topic = version, direct, via_tap, topic
        self.runs: list[dict[str, Any]] = []

    def step(
        self,
        tap: TapProcess,
        policy: str,
        round_no: int,
        step: str,
        order: tuple[str, str],
        records: int,
        throughput: float = -1,
    ) -> None:
        for mode in order:
            bootstrap = self.direct if mode == "direct" else self.via_tap
            api_key = 1 if step == "consume" else 0
            hist0 = histograms(tap.metrics_port, api_key) if mode == "tap" else {}
            mirror = mode == "tap" and tap.topic is not None
            if mirror:
                assert tap.topic is not None
                ends0 = wait_mirror_drained(tap.metrics_port, tap.mirror_bootstrap, tap.topic)
                counters0 = tap_counters(tap.metrics_port)
            cpu0, t0 = tap.cpu(), time.monotonic()
            if step == "consume":
                result = consume(self.version, bootstrap, self.topic, records)
            else:
                result = produce(self.version, bootstrap, self.topic, records, throughput)
            wall = time.monotonic() - t0
            cpu = tap.cpu() - cpu0
            entry: dict[str, Any] = {"policy": policy, "step": step, "mode": mode, "round": round_no}
            entry.update(wall_s=round(wall, 3), records=records, **result)
            if throughput > 0:
                entry["target_records_per_sec"] = int(throughput)
            if mode == "tap":
                # Per MB moved, not per wall second: the wall time includes the tool's JVM start-up,
                # when the tap idles. cpu / MB is the same as cores / (MB/s), over the active time.
                moved = result.get("records_consumed", records)
                mcores = 1000 * cpu / (moved * RECORD_SIZE / 2**20)
                active = moved / max(result["records_per_sec"], 1e-9)
                entry.update(
                    tap_cpu_s=round(cpu, 3),
                    tap_cores=round(cpu / active, 4),
                    tap_mcores_per_mb_s=round(mcores, 3),
                    vs_kroxylicious=round(mcores / KROXYLICIOUS_MCORES_PER_MB_S, 3),
                )
                # The tap's own view (bucket bounds): time a frame spends inside it before being
                # written on, and request forwarded -> response received (the broker plus the network).
                hist1 = histograms(tap.metrics_port, api_key)
                for kind in ("inside", "broker"):
                    for q, name in ((0.5, "p50"), (0.99, "p99")):
                        entry[f"tap_{kind}_{name}_le_ms"] = quantile_le_ms(hist0[kind], hist1[kind], q)
            if mirror:
                assert tap.topic is not None
                # Completeness: frames read back from the tap topic over frames the tap forwarded
                # (its own counter), once the mirror queue has drained; drops from its own counters.
                ends1 = wait_mirror_drained(tap.metrics_port, tap.mirror_bootstrap, tap.topic)
                counters1 = tap_counters(tap.metrics_port)
                forwarded = counters1["forwarded"] - counters0["forwarded"]
                mirrored = mirrored_frames(tap.mirror_bootstrap, tap.topic, ends0, ends1)
                entry.update(
                    frames_forwarded=int(forwarded),
                    frames_mirrored=mirrored,
                    mirror_drops=int(counters1["drops"] - counters0["drops"]),
                    mirror_delivery_errors=int(counters1["delivery_errors"] - counters0["delivery_errors"]),
                    completeness=round(mirrored / forwarded, 6) if forwarded else None,
                )
            self.runs.append(entry)
            print(json.dumps(entry), flush=True)

    def pairs(self, policy: str, step: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(direct, tap) runs of each round."""
        out = []
        for round_no in sorted({r["round"] for r in self.runs}):
            by_mode = {
                r["mode"]: r
                for r in self.runs
                if (r["policy"], r["step"], r["round"]) == (policy, step, round_no)
            }
            if len(by_mode) == 2:
                out.append((by_mode["direct"], by_mode["tap"]))
        return out

    def mean(self, policy: str, step: str, mode: str, key: str) -> float:
        values = [
            r[key]
            for r in self.runs
            if (r["policy"], r["step"], r["mode"]) == (policy, step, mode) and key in r
        ]
        return sum(values) / len(values) if values else float("nan")


def summarize(bench: Bench, policies: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for policy in policies:

        def m(step: str, mode: str, key: str, policy: str = policy) -> float:
            return bench.mean(policy, step, mode, key)

        entry: dict[str, Any] = {}
        for step in ("produce", "consume"):
            direct, tapped = m(step, "direct", "mb_per_sec"), m(step, "tap", "mb_per_sec")
            entry[step] = {
                "direct_mb_per_sec": round(direct, 2),
                "tap_mb_per_sec": round(tapped, 2),
                "direct_records_per_sec": round(m(step, "direct", "records_per_sec")),
                "tap_records_per_sec": round(m(step, "tap", "records_per_sec")),
                "throughput_ratio": round(tapped / direct, 3),
                "throughput_ratio_per_round": [
                    round(t["mb_per_sec"] / d["mb_per_sec"], 3) for d, t in bench.pairs(policy, step)
                ],
                "tap_cores": round(m(step, "tap", "tap_cores"), 3),
                "tap_mcores_per_mb_s": round(m(step, "tap", "tap_mcores_per_mb_s"), 2),
                "vs_kroxylicious": round(
                    m(step, "tap", "tap_mcores_per_mb_s") / KROXYLICIOUS_MCORES_PER_MB_S, 3
                ),
            }
            if step == "produce":
                entry[step].update(
                    direct_p50_ms=m(step, "direct", "p50_ms"),
                    tap_p50_ms=m(step, "tap", "p50_ms"),
                    direct_p99_ms=m(step, "direct", "p99_ms"),
                    tap_p99_ms=m(step, "tap", "p99_ms"),
                )
        mirrored_runs = [
            r for r in bench.runs if r["policy"] == policy and r["mode"] == "tap" and "completeness" in r
        ]
        if mirrored_runs:
            forwarded = sum(r["frames_forwarded"] for r in mirrored_runs)
            mirrored = sum(r["frames_mirrored"] for r in mirrored_runs)
            entry["completeness"] = {
                "frames_forwarded": forwarded,
                "frames_mirrored": mirrored,
                "mirror_drops": sum(r["mirror_drops"] for r in mirrored_runs),
                "mirror_delivery_errors": sum(r["mirror_delivery_errors"] for r in mirrored_runs),
                "ratio": round(mirrored / forwarded, 6) if forwarded else None,
                "ratio_per_run": {f"{r['step']}/{r['round']}": r["completeness"] for r in mirrored_runs},
            }
        half: dict[str, Any] = {
            "target_records_per_sec": round(m("produce_half", "direct", "target_records_per_sec")),
            "direct_records_per_sec": round(m("produce_half", "direct", "records_per_sec")),
            "tap_records_per_sec": round(m("produce_half", "tap", "records_per_sec")),
            "direct_p50_ms": m("produce_half", "direct", "p50_ms"),
            "tap_p50_ms": m("produce_half", "tap", "p50_ms"),
            "direct_p99_ms": m("produce_half", "direct", "p99_ms"),
            "tap_p99_ms": m("produce_half", "tap", "p99_ms"),
        }
        half["added_p99_ms"] = half["tap_p99_ms"] - half["direct_p99_ms"]
        half["added_p99_ms_per_round"] = [
            t["p99_ms"] - d["p99_ms"] for d, t in bench.pairs(policy, "produce_half")
        ]
        half["added_p50_ms_per_round"] = [
            t["p50_ms"] - d["p50_ms"] for d, t in bench.pairs(policy, "produce_half")
        ]
        inside = [
            r.get("tap_inside_p99_le_ms")
            for r in bench.runs
            if (r["policy"], r["step"], r["mode"]) == (policy, "produce_half", "tap")
        ]
        half["tap_inside_p99_le_ms_max"] = max((v for v in inside if v is not None), default=None)
        entry["produce_half"] = half
        verdict: dict[str, bool] = {
            "added_p99_at_half_ok": half["added_p99_ms"] <= TARGETS["added_p99_ms_at_half"]
        }
        if policy in ("headers", "full"):
            verdict["throughput_ok"] = entry["produce"]["throughput_ratio"] >= TARGETS[f"{policy}_ratio"]
        ratio = entry.get("completeness", {}).get("ratio")
        if ratio is not None:
            verdict["completeness_ok"] = ratio >= TARGETS["completeness"]
        entry["verdict"] = verdict
        summary[policy] = entry
    return summary


# ----- profile (py-spy) -------------------------------------------------------------------------------


def _short(frame: str) -> str:
    """``func (path:line)`` -> ``func (short/path)``: lines merged, site-packages and the repo trimmed."""
    match = re.match(r"(?P<func>.*) \((?P<path>.*?)(?::\d+)?\)$", frame)
    if match is None:
        return frame
    path = match["path"]
    for marker in ("site-packages/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    if "/lib/python3" in path:
        path = "stdlib/" + path.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return f"{match['func']} ({path})"


def summarize_profile(raw: Iterable[str], top: int = 12) -> dict[str, Any]:
    """Self and inclusive sample shares per frame from py-spy's raw (collapsed-stack) output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";") if not f.startswith("process ")]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count

    def share(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"frame": f, "share": round(n / total, 4)} for f, n in counter.most_common(top)]

    # Inclusive shares only for kpmon's own code: the frames above it (runpy, the CLI, asyncio.run)
    # hold every sample and say nothing.
    ours = Counter({f: n for f, n in inclusive.items() if _OURS.search(f)})
    return {"samples": total, "self": share(own), "inclusive": share(ours)} if total else {"samples": 0}


def profile(bench: Bench, policy: str, args: argparse.Namespace, records: int, work: Path) -> dict[str, Any]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return {"skipped": "py-spy is not installed (.venv/bin/pip install py-spy)"}
    out = work / "tap.pyspy.txt"
    tap = TapProcess(args.tap_port, args.broker, policy, bench.direct)
    try:
        command = [spy, "record", "--pid", str(tap.proc.pid), "--format", "raw", "--rate", "200"]
        command += ["--nonblocking", "-o", str(out)]
        recorder = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1)
        if recorder.poll() is not None:
            return {
                "skipped": f"py-spy cannot attach: {(recorder.stderr.read() if recorder.stderr else '')[:300]}"
            }
        cpu0 = tap.cpu()
        produce(bench.version, bench.via_tap, bench.topic, records)
        consume(bench.version, bench.via_tap, bench.topic, 2 * records)
        cpu = tap.cpu() - cpu0
    finally:
        tap.stop()  # py-spy writes its file when the process it watches exits
    try:
        recorder.wait(60)
    except subprocess.TimeoutExpired:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(30)
    if not out.exists():
        return {
            "skipped": f"py-spy wrote nothing: {(recorder.stderr.read() if recorder.stderr else '')[:300]}"
        }
    with out.open() as fh:
        result = summarize_profile(fh)
    return {"policy": policy, "steps": ["produce", "consume"], "tap_cpu_s": round(cpu, 2), **result}


# ----- scale: 1 and 2 workers on a load one worker cannot carry ---------------------------------------


def scale(args: argparse.Namespace) -> dict[str, Any]:
    """Throughput of a tap with 1 and 2 workers in front of an in-process stub broker, driven by a
    synthetic load (``benchmarks/tap_load.py``) that saturates one worker. The tap forwards without
    mirroring (the stub is no Kafka to mirror to), so the per-frame work measured is the forwarding
    path's: frame boundaries, header peeks, correlation, metrics."""
    import asyncio

    from benchmarks.tap_load import exchange, run_load, start_stub
    from tap.proxy import install_uvloop

    install_uvloop()
    request, response = exchange(args.load, args.frame_kb)
    runs: list[dict[str, Any]] = []

    async def measure(workers: int, round_no: int) -> None:
        server, broker_port = await start_stub(len(request), response)
        port = _free_port()
        tap = TapProcess(port, f"127.0.0.1:{broker_port}", "off", "", workers=workers)
        try:
            if workers > 1:
                await asyncio.to_thread(_wait_workers, tap.metrics_port, workers)
            cpu: list[float] = []
            result = await run_load(
                port,
                request,
                len(response),
                args.connections,
                args.depth,
                warmup=2.0,
                seconds=args.seconds,
                probe=lambda: cpu.append(tap.cpu()),
            )
        finally:
            tap.stop()
            server.close()
        entry = {"workers": workers, "round": round_no, **result}
        entry["tap_cores"] = round((cpu[1] - cpu[0]) / result["seconds"], 3)
        runs.append(entry)
        print(json.dumps(entry), flush=True)

    async def all_runs() -> None:
        for round_no in range(args.rounds):
            order = (1, 2) if round_no % 2 == 0 else (2, 1)
            for workers in order:
                await measure(workers, round_no)

    asyncio.run(all_runs())

    def mean(workers: int, key: str) -> float:
        values = [r[key] for r in runs if r["workers"] == workers]
        return sum(values) / len(values)

    summary: dict[str, Any] = {
        str(n): {
            key: round(mean(n, key), 2)
            for key in ("mb_per_sec", "frames_per_sec", "tap_cores", "load_process_cores")
        }
        for n in (1, 2)
    }
    return {
        "scale_2_over_1": round(mean(2, "mb_per_sec") / mean(1, "mb_per_sec"), 3),
        "frames_scale_2_over_1": round(mean(2, "frames_per_sec") / mean(1, "frames_per_sec"), 3),
        "target": TARGETS["scale_2_over_1"],
        "load": {
            "kind": args.load,
            "frame_kb": args.frame_kb,
            "connections": args.connections,
            "depth": args.depth,
            "seconds_per_run": args.seconds,
            "rounds": args.rounds,
            "broker": "in-process stub (benchmarks/tap_load.py), same process as the clients",
            "tap": "kpmon tap --no-mirror --workers N",
        },
        "summary": summary,
        "runs": runs,
    }


# ----- latency: the tap on a core of its own ----------------------------------------------------------


def _wait_workers(metrics_port: int, workers: int, timeout: float = 60.0) -> None:
    """Until every worker is up: each publishes its metrics (a ``worker`` label) once it is."""
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            up = {
                sample.labels.get("worker")
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "kpmon_tap_mirror_queue_capacity"
            }
            if len(up - {None}) >= workers:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the tap's {workers} workers did not come up in {timeout:.0f} s")
        time.sleep(0.2)


def latency(args: argparse.Namespace, policies: list[str]) -> dict[str, Any]:
    """Added producer latency at half load, per capture policy, with the tap pinned to one CPU and the
    broker, the perf tools and this process to the others: the tap's own delay, not scheduling noise
    between processes sharing a core. ``kpmon_tap_inside_seconds`` (the tap's own view) beside it."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("latency mode needs two CPUs: one for the tap, the rest for the broker and clients")
    tap_cpu = cpus[-1]
    others = set(cpus[:-1])
    os.sched_setaffinity(0, others)  # the broker JVM and the perf tools inherit this mask
    home = Path(tempfile.mkdtemp(prefix="kpmon-tap-bench-"))
    args.tap_port = _free_port()
    stack = LocalStack(home / "stack", advertised={1: ("127.0.0.1", args.tap_port)})
    stack.up()
    try:
        broker = stack.listen_endpoints[0].address
        direct = stack.internal_bootstrap_servers
        version, topic = _prepare_topics(direct, policies)
        bench = Bench(version, direct, f"127.0.0.1:{args.tap_port}", topic)
        warm = produce(version, direct, topic, 50_000)
        records = max(20_000, int(warm["records_per_sec"] * args.seconds))
        saturation = produce(version, direct, topic, records)["records_per_sec"]
        half = 0.5 * saturation
        print(json.dumps({"direct_saturation_records_per_sec": saturation, "half": half}), flush=True)
        for index, policy in enumerate(policies):
            tap = TapProcess(args.tap_port, broker, policy, direct, workers=args.workers, cpus={tap_cpu})
            try:
                for round_no in range(args.rounds):
                    order = ("direct", "tap") if (index + round_no) % 2 == 0 else ("tap", "direct")
                    bench.step(
                        tap,
                        policy,
                        round_no,
                        "produce_half",
                        order,
                        max(1000, int(half * args.seconds)),
                        half,
                    )
            finally:
                tap.stop()
    finally:
        stack.down()
        shutil.rmtree(home, ignore_errors=True)
        os.sched_setaffinity(0, set(cpus))
    summary: dict[str, Any] = {}
    for policy in policies:

        def m(mode: str, key: str, policy: str = policy) -> float:
            return bench.mean(policy, "produce_half", mode, key)

        summary[policy] = {
            "added_p50_ms": round(m("tap", "p50_ms") - m("direct", "p50_ms"), 2),
            "added_p99_ms": round(m("tap", "p99_ms") - m("direct", "p99_ms"), 2),
            "direct_p99_ms": round(m("direct", "p99_ms"), 2),
            "tap_inside_p50_le_ms": m("tap", "tap_inside_p50_le_ms"),
            "tap_inside_p99_le_ms": m("tap", "tap_inside_p99_le_ms"),
            "tap_cores": round(m("tap", "tap_cores"), 3),
        }
    return {
        "pinning": {"tap_cpus": [tap_cpu], "broker_and_clients_cpus": sorted(others)},
        "half_load_records_per_sec": round(half),
        "target_added_p99_ms": TARGETS["added_p99_ms_at_half"],
        "note": "producer p50/p99 are kafka-producer-perf-test's whole milliseconds; tap_inside_* are "
        "upper bounds of the tap's histogram buckets (kpmon_tap_inside_seconds)",
        "summary": summary,
        "runs": bench.runs,
    }


def _prepare_topics(direct: str, policies: list[str]) -> tuple[str, str]:
    """The perf tools' Kafka version for this broker, and the benchmark topic (tap topics created too)."""
    probe = run_tool(KAFKA_LATEST, "kafka-topics", ["--bootstrap-server", direct, "--list"], timeout=60)
    version = KAFKA_LEGACY if "NoClassDefFoundError" in probe.stderr else KAFKA_LATEST
    topic = "tap-bench"
    for name in [topic] + [f"kpmon.bench.{p}" for p in policies if p != "off"]:
        create = ["--bootstrap-server", direct, "--create", "--topic", name]
        for setting in TOPIC_CONFIG:
            create += ["--config", setting]
        _tool(version, "kafka-topics", create, timeout=60)
    return version, topic


def _merge_into(path: Path, key: str, value: dict[str, Any], host: dict[str, Any]) -> None:
    """Write ``value`` under ``key`` of the results file, keeping what the other modes wrote there."""
    report: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"benchmark": "tap_bench"}
    report[key] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {**host, "loadavg_at_end": os.getloadavg()},
        **value,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


# ----- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=12.0, help="approximate length of each run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--policies", default="off,meta,headers,full")
    parser.add_argument("--profile", default="headers", help="policy to profile with py-spy, or 'none'")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--mode",
        choices=["overhead", "scale", "latency"],
        default="overhead",
        help="overhead: direct vs through the tap (summary); scale: 1 vs 2 workers on a synthetic load "
        "(workers); latency: added p50/p99 at half load with the tap on a CPU of its own (latency_pinned)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="overhead, latency: the tap's tap.workers (default 1)"
    )
    parser.add_argument("--load", choices=["produce", "fetch"], default="produce", help="scale: the load")
    parser.add_argument("--frame-kb", type=int, default=1, help="scale: KiB of records per frame")
    parser.add_argument("--connections", type=int, default=32, help="scale: client connections")
    parser.add_argument("--depth", type=int, default=8, help="scale: requests in flight per connection")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    started = time.monotonic()
    host = machine()  # the load average as the run starts
    if args.mode == "scale":
        _merge_into(args.output, "workers", scale(args), host)
        return 0
    if args.mode == "latency":
        _merge_into(args.output, "latency_pinned", latency(args, policies), host)
        return 0

    args.tap_port = _free_port()
    home = Path(tempfile.mkdtemp(prefix="kpmon-tap-bench-"))
    stack = LocalStack(home / "stack", advertised={1: ("127.0.0.1", args.tap_port)})
    stack.up()
    prof: dict[str, Any] = {"skipped": "--profile none"}
    try:
        args.broker = stack.listen_endpoints[0].address
        direct = stack.internal_bootstrap_servers
        version, topic = _prepare_topics(direct, policies)
        bench = Bench(version, direct, f"127.0.0.1:{args.tap_port}", topic)
        # Warm the broker up, and size every run from its rate so runs last about --seconds.
        warm = produce(version, direct, topic, 50_000)
        records = max(20_000, int(warm["records_per_sec"] * args.seconds))
        print(json.dumps({"warm_up": warm, "records_per_run": records}), flush=True)
        for index, policy in enumerate(policies):
            tap = TapProcess(args.tap_port, args.broker, policy, direct, workers=args.workers)
            try:
                for round_no in range(args.rounds):
                    order = ("direct", "tap") if (index + round_no) % 2 == 0 else ("tap", "direct")
                    bench.step(tap, policy, round_no, "produce", order, records)
                    # Twice as many: consuming is several times faster than producing here, and the
                    # topic holds the warm-up and both produce runs before the first consume step.
                    bench.step(tap, policy, round_no, "consume", order, 2 * records)
                    half = 0.5 * bench.mean(policy, "produce", "direct", "records_per_sec")
                    bench.step(
                        tap,
                        policy,
                        round_no,
                        "produce_half",
                        order,
                        max(1000, int(half * args.seconds)),
                        half,
                    )
            finally:
                tap.stop()
        if args.profile != "none":
            prof = profile(bench, args.profile, args, records, home)
            print(json.dumps({"profile": prof}), flush=True)
    finally:
        stack.down()
        shutil.rmtree(home, ignore_errors=True)

    summary = summarize(bench, policies)
    report = {
        "benchmark": "tap_bench",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": round(time.monotonic() - started),
        "machine": {**host, "loadavg_at_end": os.getloadavg()},
        "params": {
            "seconds_per_run": args.seconds,
            "records_per_run": records,
            "record_size": RECORD_SIZE,
            "acks": "all",
            "linger_ms": 5,
            "rounds": args.rounds,
            "tools": version,
            "tap_workers": args.workers,
        },
        "comparison": {
            "direct": "the same tool against the broker's own listener, in the same run",
            "kroxylicious_mcores_per_mb_s": KROXYLICIOUS_MCORES_PER_MB_S,
        },
        "targets": TARGETS,
        "summary": summary,
        "profile": prof,
        "runs": bench.runs,
    }
    if args.output.exists():
        # What the scale and latency modes wrote stays, each with its own date and machine.
        previous = json.loads(args.output.read_text())
        report.update({key: previous[key] for key in ("workers", "latency_pinned") if key in previous})
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
