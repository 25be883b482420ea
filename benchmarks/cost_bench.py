"""The cost of watching a cluster against the cost of serving it: CPU per wire frame, one run.

Starts a real single-node Kafka 4.4 broker (``deploy.local.LocalStack``, KRaft, loopback) whose client
listener advertises the tap, and runs the same real-client workload (confluent-kafka) **direct**
(clients -> broker, through the broker's inter-broker listener, which advertises the broker itself)
and **through the tap** (clients -> ``kpmon tap`` in its own process -> broker, the tap mirroring to
a tap topic on the same broker: the realistic worst case), then the streaming job over the tap topic
that run produced. Two workloads, each with its own tap process and tap topic:

- ``frame_heavy``: four idempotent producers, small records (``--record-bytes``, 100), ``linger.ms=0``,
  each paced at ``--frame-rate`` records/s, and a two-member consumer group consuming them;
- ``byte_heavy``: two idempotent producers writing bursts of ``--batch-kib`` KiB (16 KiB records,
  ``linger.ms=5``: one batch per burst) at ``--batch-rate`` bursts/s each, and a two-member group.

Each workload first runs direct for ``--warmup-seconds`` (a cold broker spends several times its
steady CPU per frame in its first minute), unmeasured. Then ``--rounds`` rounds of one direct and
one tapped phase of ``--seconds`` each, the order flipping every round, so drift shows in the
per-round figures. Every phase starts new clients (the group rejoins, as after a deploy) and ends
when each client has reported statistics after the workload stopped.

**Figures.** A wire frame is a request or a response. Both phases count them the same way, on the
client side: librdkafka's statistics (``statistics.interval.ms``), per broker connection, ``tx``
(requests sent) + ``rx`` (responses received), and ``txbytes`` + ``rxbytes`` for the wire bytes. CPU
is utime + stime from /proc/<pid>/stat of the broker's JVM and of the tap process, read before the
clients start and after their last statistics (and, through the tap, once its mirror queue is empty).
Per workload:

- ``broker_direct``: the broker's CPU per frame in the direct phases: the anchor;
- ``broker_mirroring``: the broker's CPU per frame in the tapped phases (it serves the clients and
  takes the tap's mirror writes);
- ``tap``: the tap process's CPU per frame in the tapped phases (the tap's own frame counter is
  reported beside the clients', as a check);
- ``job``: the whole streaming job over the workload's tap topic (``stream_bench.run_job``: read to
  the end with ``availableNow``, ``local[2]``, CPU of the driver, the Spark JVM and the Python
  workers as ``stream_bench`` measures it), per wire frame in the topic: every frame the tap
  forwarded in its lifetime, by its own counter. Before the first measured job run, one unmeasured
  run over the ``frame_heavy`` topic warms the JVM (``stream_bench`` runs the raw read first for the
  same reason);
- each also per MiB of wire traffic (ms of CPU per MiB, which is milli-cores per MiB/s), and as a
  ratio to ``broker_direct`` from the same run, so figures compare across hosts: ``ratios``
  ``tap_over_broker``, ``broker_mirroring_over_direct``, ``job_over_broker``, and per round;
- ``records_per_wire_frame``: records in the tap topic (end offsets) over the frames the tap forwarded.

    python benchmarks/cost_bench.py                # 2 rounds of 30 s phases, both workloads: ~15 min
    python benchmarks/cost_bench.py --quick        # a smoke run (~5 min): says the script works, no figure

Writes ``benchmarks/results/cost_bench.json`` (``--quick``: ``cost_bench.quick.json``, marked
``"quick": true``): ``machine`` (taken at the start), ``params``, ``ratios`` (the ``frame_heavy``
workload's), ``records_per_wire_frame`` (the same), and ``workloads.<name>``: every figure, the ratios,
the per-round ratios, the topic, every phase and ``job``: the job's run as ``stream_bench`` reports it
(its ``cpu_us_per_frame`` is per record read; ``figures.job`` is per wire frame).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from benchmarks.results_file import cores_changed, machine  # noqa: E402
from benchmarks.stream_bench import _config, run_job  # noqa: E402
from benchmarks.tap_bench import (  # noqa: E402
    TapProcess,
    _cpu_seconds,
    _free_port,
    tap_counters,
    wait_listening,
    wait_mirror_drained,
)
from deploy.local.stack import LocalStack  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "cost_bench.json"
QUICK_RESULTS = ROOT / "benchmarks" / "results" / "cost_bench.quick.json"
MIB = 2**20
#: How often each client reports its statistics; a phase ends with each client's first report after
#: the workload stopped, so this bounds the phase's tail.
STATS_INTERVAL_MS = 500
#: Tap topic partitions, as ``stream_bench`` preloads its backlog.
TAP_TOPIC_PARTITIONS = 2


@dataclass(frozen=True)
class Workload:
    name: str
    topic: str
    partitions: int
    producers: int
    record_bytes: int
    #: Records produced back to back, then the producer waits for its next slot.
    records_per_burst: int
    #: Bursts per second, per producer.
    burst_rate: float
    linger_ms: int
    consumers: int = 2

    @property
    def group(self) -> str:
        # One group per workload across phases: each phase's members resume where the last left off,
        # so every phase consumes what it produced rather than the topic's history.
        return f"cost-bench-{self.name}"


def workloads(args: argparse.Namespace) -> dict[str, Workload]:
    batch_bytes = args.batch_kib * 1024
    record = min(16 * 1024, batch_bytes)
    return {
        "frame_heavy": Workload(
            "frame_heavy", "cost.frames", 4, 4, args.record_bytes, 1, args.frame_rate, linger_ms=0
        ),
        "byte_heavy": Workload(
            "byte_heavy", "cost.bytes", 2, 2, record, batch_bytes // record, args.batch_rate, linger_ms=5
        ),
    }


# ----- clients and their wire counts ---------------------------------------------------------------


def wire_counts(stats: dict[str, Any]) -> dict[str, int]:
    """Requests sent and responses received (and their bytes) over every broker connection of one
    client, from one librdkafka statistics report (the group coordinator has its own connection)."""
    out = {"requests": 0, "responses": 0, "tx_bytes": 0, "rx_bytes": 0}
    for broker in (stats.get("brokers") or {}).values():
        out["requests"] += int(broker.get("tx", 0))
        out["responses"] += int(broker.get("rx", 0))
        out["tx_bytes"] += int(broker.get("txbytes", 0))
        out["rx_bytes"] += int(broker.get("rxbytes", 0))
    return out


class Clients:
    """One phase's clients: the workload's producers and consumer group, each in its own thread,
    each keeping its latest librdkafka statistics report."""

    def __init__(self, workload: Workload, bootstrap: str) -> None:
        self.workload = workload
        self.bootstrap = bootstrap
        self.stop = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.stopped_at = 0.0
        #: client name -> (arrival time, report)
        self.reports: dict[str, tuple[float, dict[str, Any]]] = {}
        self.final: dict[str, threading.Event] = {}
        self.produced = 0
        self.delivered = 0
        self.consumed = 0
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []

    def _conf(self, name: str) -> dict[str, Any]:
        def on_stats(text: str) -> None:
            with self.lock:
                self.reports[name] = (time.monotonic(), json.loads(text))

        return {
            "bootstrap.servers": self.bootstrap,
            "client.id": f"cost-bench-{name}",
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "stats_cb": on_stats,
        }

    def _fresh(self, name: str, since: float) -> bool:
        """Whether ``name`` has reported since ``since`` (monotonic)."""
        with self.lock:
            report = self.reports.get(name)
        return report is not None and report[0] > since

    def start(self) -> Clients:
        w = self.workload
        for index in range(w.producers):
            self._spawn(self._producer, f"producer-{index}")
        for index in range(w.consumers):
            self._spawn(self._consumer, f"consumer-{index}")
        return self

    def _spawn(self, target: Callable[[str], None], name: str) -> None:
        def run() -> None:
            try:
                target(name)
            except Exception as exc:  # reported, and the phase fails below
                self.errors.append(f"{name}: {exc!r}")
                self.final[name].set()

        self.final[name] = threading.Event()
        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _producer(self, name: str) -> None:
        from confluent_kafka import Producer

        w = self.workload
        conf = self._conf(name) | {"enable.idempotence": True, "acks": "all", "linger.ms": w.linger_ms}
        producer = Producer(conf)
        value = os.urandom(w.record_bytes)

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is None:
                with self.lock:
                    self.delivered += 1

        interval = 1.0 / w.burst_rate
        next_at = time.monotonic()
        while not self.stop.is_set():
            for _ in range(w.records_per_burst):
                while True:
                    try:
                        producer.produce(w.topic, value=value, on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.05)
            with self.lock:
                self.produced += w.records_per_burst
            producer.poll(0)
            next_at += interval
            now = time.monotonic()
            if next_at < now - 1.0:
                next_at = now  # fell a second behind: pace from here rather than burst to catch up
            self.stop.wait(max(0.0, next_at - now))
        producer.flush(60)
        # A report served during the flush may predate its last responses: wait for a later one.
        flushed = time.monotonic()
        deadline = flushed + 30
        while not self._fresh(name, flushed) and time.monotonic() < deadline:
            producer.poll(0.1)
        self.final[name].set()
        self.release.wait()
        producer.flush(10)

    def _consumer(self, name: str) -> None:
        from confluent_kafka import Consumer

        w = self.workload
        conf = self._conf(name) | {"group.id": w.group, "auto.offset.reset": "latest"}
        consumer = Consumer(conf)
        consumer.subscribe([w.topic])
        try:
            while not (
                self.stop.is_set()
                and (self._fresh(name, self.stopped_at) or time.monotonic() > self.stopped_at + 30)
            ):
                msg = consumer.poll(0.1)
                if msg is not None and msg.error() is None:
                    with self.lock:
                        self.consumed += 1
            self.final[name].set()
            self.release.wait()
        finally:
            consumer.close()

    def finish(self, timeout: float = 60.0) -> dict[str, int]:
        """Stop the workload; once every client reported after that, their summed wire counts."""
        self.stopped_at = time.monotonic()
        self.stop.set()
        deadline = time.monotonic() + timeout
        for name, event in self.final.items():
            event.wait(max(0.0, deadline - time.monotonic()))
            if not self._fresh(name, self.stopped_at):
                self.errors.append(f"{name}: no statistics within {timeout:.0f} s of the stop")
        if self.errors:
            raise RuntimeError("clients failed: " + "; ".join(self.errors))
        totals = {"requests": 0, "responses": 0, "tx_bytes": 0, "rx_bytes": 0}
        with self.lock:
            for _, report in self.reports.values():
                for key, value in wire_counts(report).items():
                    totals[key] += value
        return totals

    def close(self) -> None:
        self.release.set()
        for thread in self.threads:
            thread.join(60)


class RelayProcess:
    """``benchmarks/bare_relay.py`` on the tap's port, towards the broker: the relay floor."""

    def __init__(self, listen: int, broker: str) -> None:
        script = ROOT / "benchmarks" / "bare_relay.py"
        self.proc = subprocess.Popen([sys.executable, str(script), str(listen), broker], cwd=ROOT)
        wait_listening(self, listen, "the bare relay")

    def cpu(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ----- phases ------------------------------------------------------------------------------------------


def run_phase(
    workload: Workload,
    mode: str,
    bootstrap: str,
    seconds: float,
    broker_pid: int,
    tap: TapProcess | RelayProcess | None,
) -> dict[str, Any]:
    """One phase: new clients for ``seconds``, with the broker's (and the tap's, or the bare relay's)
    CPU around it."""
    counted = isinstance(tap, TapProcess)
    counters0 = tap_counters(tap.metrics_port) if isinstance(tap, TapProcess) else {}
    broker0 = _cpu_seconds(broker_pid)
    tap0 = tap.cpu() if tap else 0.0
    t0 = time.monotonic()
    clients = Clients(workload, bootstrap).start()
    try:
        time.sleep(seconds)
        wire = clients.finish()
        if isinstance(tap, TapProcess):
            # The mirror's writes belong to the tapped phase: wait until the tap handed them all on.
            deadline = time.monotonic() + 30
            while tap_counters(tap.metrics_port)["queue_depth"] > 0 and time.monotonic() < deadline:
                time.sleep(0.05)
        broker_cpu = _cpu_seconds(broker_pid) - broker0
        tap_cpu = tap.cpu() - tap0 if tap else None
        wall = time.monotonic() - t0
        counters1 = tap_counters(tap.metrics_port) if isinstance(tap, TapProcess) else {}
    finally:
        clients.close()
    entry: dict[str, Any] = {
        "mode": mode,
        "wall_s": round(wall, 2),
        "frames": wire["requests"] + wire["responses"],
        **wire,
        "wire_bytes": wire["tx_bytes"] + wire["rx_bytes"],
        "records_produced": clients.produced,
        "records_delivered": clients.delivered,
        "records_consumed": clients.consumed,
        "broker_cpu_s": round(broker_cpu, 3),
    }
    if tap:
        assert tap_cpu is not None
        entry["tap_cpu_s"] = round(tap_cpu, 3)
    if counted:
        entry.update(
            tap_counted_frames=int(counters1["forwarded"] - counters0["forwarded"]),
            mirror_drops=int(counters1["drops"] - counters0["drops"]),
            mirror_delivery_errors=int(counters1["delivery_errors"] - counters0["delivery_errors"]),
        )
    return entry


def phase_line(workload: str, round_no: int, entry: dict[str, Any]) -> str:
    frames = entry["frames"]
    line = (
        f"  {workload} {'' if round_no < 0 else f'round {round_no} '}{entry['mode']:>6}: {frames:,} frames "
        f"({entry['wire_bytes'] / MIB:,.1f} MiB) in {entry['wall_s']} s; broker "
        f"{us_per_frame(entry['broker_cpu_s'], frames)} us/frame"
    )
    if "tap_cpu_s" in entry:
        line += f", {'relay' if entry['mode'] == 'relay' else 'tap'} {us_per_frame(entry['tap_cpu_s'], frames)} us/frame"
    if "tap_counted_frames" in entry:
        line += f" (the tap counted {entry['tap_counted_frames']:,} frames)"
    return line


# ----- arithmetic ----------------------------------------------------------------------------------------


def us_per_frame(cpu_s: float, frames: int) -> float | None:
    return round(cpu_s / frames * 1e6, 2) if frames else None


def ms_per_mib(cpu_s: float, wire_bytes: int) -> float | None:
    """ms of CPU per MiB of wire traffic: the same number as milli-cores per MiB/s."""
    return round(cpu_s / (wire_bytes / MIB) * 1e3, 3) if wire_bytes else None


def _ratio(value: float | None, anchor: float | None) -> float | None:
    return round(value / anchor, 4) if value is not None and anchor else None


def _cost(cpu_s: float, frames: int, wire_bytes: int) -> dict[str, Any]:
    return {
        "cpu_s": round(cpu_s, 3),
        "frames": frames,
        "wire_bytes": wire_bytes,
        "us_per_frame": us_per_frame(cpu_s, frames),
        "ms_per_mib": ms_per_mib(cpu_s, wire_bytes),
    }


def _ratios(
    direct: dict[str, Any],
    mirroring: dict[str, Any],
    tap: dict[str, Any],
    job: dict[str, Any] | None,
    unit: str,
) -> dict[str, float | None]:
    anchor = direct[unit]
    return {
        "tap_over_broker": _ratio(tap[unit], anchor),
        "job_over_broker": _ratio(job[unit], anchor) if job else None,
        "broker_mirroring_over_direct": _ratio(mirroring[unit], anchor),
    }


def summarize(
    phases: list[dict[str, Any]], topic: dict[str, Any], job: dict[str, Any] | None
) -> dict[str, Any]:
    """One workload's figures from its phases (``run_phase`` entries with a ``round``), its tap topic
    (``records``, and ``wire_frames`` / ``wire_bytes`` the tap forwarded in its lifetime) and the job's
    run over that topic (``cpu_seconds``, or None when it did not run): CPU per frame and per MiB of
    each side, summed over the rounds, their ratios to the broker's direct figure, and per round."""

    def cost(rows: list[dict[str, Any]], cpu_key: str) -> dict[str, Any]:
        return _cost(
            sum(r[cpu_key] for r in rows), sum(r["frames"] for r in rows), sum(r["wire_bytes"] for r in rows)
        )

    direct = [p for p in phases if p["mode"] == "direct"]
    tapped = [p for p in phases if p["mode"] == "tap"]
    broker = cost(direct, "broker_cpu_s")
    mirroring = cost(tapped, "broker_cpu_s")
    tap = cost(tapped, "tap_cpu_s")
    job_cost = _cost(job["cpu_seconds"], topic["wire_frames"], topic["wire_bytes"]) if job else None
    per_round = []
    for round_no in sorted({p["round"] for p in phases}):
        d = [p for p in direct if p["round"] == round_no]
        t = [p for p in tapped if p["round"] == round_no]
        if d and t:
            round_broker = cost(d, "broker_cpu_s")
            round_ratios = _ratios(
                round_broker, cost(t, "broker_cpu_s"), cost(t, "tap_cpu_s"), job_cost, "us_per_frame"
            )
            per_round.append(
                {
                    "round": round_no,
                    "order": [p["mode"] for p in phases if p["round"] == round_no],
                    **round_ratios,
                    "broker_direct_us_per_frame": round_broker["us_per_frame"],
                }
            )
    floor = {}
    for mode in ("relay", "tap_nomirror"):
        rows = [p for p in phases if p["mode"] == mode]
        if rows:
            fig = cost(rows, "tap_cpu_s")
            floor[mode] = {**fig, "over_broker": _ratio(fig["us_per_frame"], broker["us_per_frame"])}
    wire_frames = topic["wire_frames"]
    return {
        "floor": floor or None,
        "figures": {"broker_direct": broker, "broker_mirroring": mirroring, "tap": tap, "job": job_cost},
        "ratios": _ratios(broker, mirroring, tap, job_cost, "us_per_frame"),
        "ratios_per_mib": _ratios(broker, mirroring, tap, job_cost, "ms_per_mib"),
        "ratios_per_round": per_round,
        "records_per_wire_frame": round(topic["records"] / wire_frames, 4) if wire_frames else None,
        "tap_counted_over_client_counted": _ratio(
            sum(p.get("tap_counted_frames", 0) for p in tapped), tap["frames"]
        ),
        # The tap's added latency can change how clients batch (more records per Produce and Fetch):
        # the same workload is not always the same frames, so say how far apart they are.
        "records_produced_per_frame": {
            "direct": _ratio(sum(p.get("records_produced", 0) for p in direct), broker["frames"]),
            "tap": _ratio(sum(p.get("records_produced", 0) for p in tapped), tap["frames"]),
        },
    }


# ----- the run -------------------------------------------------------------------------------------------


def measure_workload(
    workload: Workload, args: argparse.Namespace, stack: LocalStack, tap_port: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Warm-up, then the rounds of direct and tapped phases, with a tap of its own; returns the phases
    and the tap topic's figures (records by end offsets, frames and bytes by the tap's counters)."""
    from kpmon.traffic.workload import create_topic

    direct = stack.internal_bootstrap_servers
    broker_pid = int(stack.status()["nodes"][0]["pid"])
    tap_topic = f"kpmon.cost.{workload.name}"
    create_topic(direct, workload.topic, workload.partitions)
    create_topic(direct, tap_topic, TAP_TOPIC_PARTITIONS)
    print(f"{workload.name}: warming the broker up direct for {args.warmup_seconds:.0f} s", flush=True)
    warm = run_phase(workload, "warmup", direct, args.warmup_seconds, broker_pid, None)
    print(phase_line(workload.name, -1, warm), flush=True)
    tap = TapProcess(tap_port, stack.listen_endpoints[0].address, args.capture, direct, tap_topic)
    phases: list[dict[str, Any]] = []
    try:
        for round_no in range(args.rounds):
            order = ("direct", "tap") if round_no % 2 == 0 else ("tap", "direct")
            for mode in order:
                bootstrap = direct if mode == "direct" else f"127.0.0.1:{tap_port}"
                entry = run_phase(
                    workload, mode, bootstrap, args.seconds, broker_pid, tap if mode == "tap" else None
                )
                entry["round"] = round_no
                phases.append(entry)
                print(phase_line(workload.name, round_no, entry), flush=True)
        ends = wait_mirror_drained(tap.metrics_port, direct, tap_topic)
        life = tap_counters(tap.metrics_port)
    finally:
        tap.stop()
    if args.floor and workload.name == "frame_heavy":
        phases += measure_floor(workload, args, stack, tap_port, broker_pid)
    topic = {
        "name": tap_topic,
        "records": sum(ends.values()),
        "wire_frames": int(life["forwarded"]),
        "wire_bytes": int(life["bytes_forwarded"]),
        "mirror_drops": int(life["drops"]),
        "mirror_delivery_errors": int(life["delivery_errors"]),
    }
    print(
        f"  {workload.name}: tap topic {tap_topic}: {topic['records']:,} records for "
        f"{topic['wire_frames']:,} frames the tap forwarded",
        flush=True,
    )
    return [warm, *phases], topic


def measure_floor(
    workload: Workload, args: argparse.Namespace, stack: LocalStack, tap_port: int, broker_pid: int
) -> list[dict[str, Any]]:
    """``--floor``: rounds of the bare relay (``bare_relay.py``), the tap with its mirror off, and
    direct, each on the tap's port in turn, the order rotating every round: what the relay alone
    costs, and what the tap's per-frame work costs before it mirrors anything."""
    broker = stack.listen_endpoints[0].address
    direct = stack.internal_bootstrap_servers
    modes = ["relay", "tap_nomirror", "direct"]
    phases: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        for mode in modes[round_no % 3 :] + modes[: round_no % 3]:
            proc: TapProcess | RelayProcess | None = None
            if mode == "relay":
                proc = RelayProcess(tap_port, broker)
            elif mode == "tap_nomirror":
                proc = TapProcess(tap_port, broker, "off", direct)
            try:
                bootstrap = direct if proc is None else f"127.0.0.1:{tap_port}"
                entry = run_phase(workload, mode, bootstrap, args.seconds, broker_pid, proc)
            finally:
                if proc is not None:
                    proc.stop()
            entry["round"] = args.rounds + round_no
            phases.append(entry)
            print(phase_line(workload.name, entry["round"], entry), flush=True)
    return phases


def run_jobs(
    stack: LocalStack, topics: dict[str, dict[str, Any]], home: Path, warm_up: bool
) -> dict[str, dict[str, Any]]:
    """The whole job over each workload's tap topic, after one unmeasured warm-up run. A run that
    fails is recorded as ``{"error": ...}``: the phases' figures, minutes of measuring, still get
    written."""
    from streaming.session import build_session

    bootstrap = stack.internal_bootstrap_servers  # the client listener advertises the stopped tap
    names = list(topics)
    spark = build_session(
        _config(home / "job-warmup", bootstrap, topics[names[0]]["name"]), "kpmon-cost-bench"
    )
    out: dict[str, dict[str, Any]] = {}
    try:
        runs = ([("warmup", names[0])] if warm_up else []) + [(name, name) for name in names]
        for label, name in runs:
            print(f"job over {topics[name]['name']} ({label}) ...", flush=True)
            state = home / f"job-{label}"
            config = _config(state, bootstrap, topics[name]["name"])
            try:
                out[label] = run_job(spark, config, state / "stream", state / "checkpoint")
            except Exception as exc:  # e.g. a Python worker that did not connect back on a loaded host
                out[label] = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
                print(f"  failed: {out[label]['error'][:300]}", flush=True)
                continue
            print(
                f"  {out[label]['rows']:,} records, {out[label]['cpu_seconds']} CPU s "
                f"({out[label]['cpu_seconds_by_process']})",
                flush=True,
            )
    finally:
        spark.stop()
    return out


def report_lines(name: str, summary: dict[str, Any]) -> list[str]:
    figures, ratios = summary["figures"], summary["ratios"]
    lines = [f"{name}:"]
    for key in ("broker_direct", "broker_mirroring", "tap", "job"):
        fig = figures[key]
        if fig is None:
            lines.append(f"  {key:>16}: not measured")
            continue
        ratio = "1 (the anchor)" if key == "broker_direct" else None
        if ratio is None:
            ratio_key = {
                "broker_mirroring": "broker_mirroring_over_direct",
                "tap": "tap_over_broker",
                "job": "job_over_broker",
            }[key]
            ratio = str(ratios[ratio_key])
        lines.append(
            f"  {key:>16}: {fig['us_per_frame']} us/frame, {fig['ms_per_mib']} ms/MiB "
            f"({fig['frames']:,} frames, {fig['cpu_s']} CPU s); / broker direct: {ratio}"
        )
    for mode, fig in (summary.get("floor") or {}).items():
        lines.append(
            f"  {mode:>16}: {fig['us_per_frame']} us/frame ({fig['frames']:,} frames, {fig['cpu_s']} CPU s); "
            f"/ broker direct: {fig['over_broker']}"
        )
    lines.append(f"  records per wire frame in the tap topic: {summary['records_per_wire_frame']}")
    per_frame = summary["records_produced_per_frame"]
    lines.append(f"  records produced per frame: direct {per_frame['direct']}, tap {per_frame['tap']}")
    for entry in summary["ratios_per_round"]:
        lines.append(
            f"  round {entry['round']} ({'/'.join(entry['order'])}): tap {entry['tap_over_broker']}, "
            f"broker mirroring {entry['broker_mirroring_over_direct']}, job {entry['job_over_broker']}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each measured phase (30)")
    parser.add_argument(
        "--warmup-seconds", type=float, default=60.0, help="unmeasured direct run per workload first (60)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of a direct and a tapped phase (2)")
    parser.add_argument(
        "--capture", default="headers", choices=["meta", "headers", "full"], help="the tap's capture policy"
    )
    parser.add_argument(
        "--workloads", default="frame_heavy,byte_heavy", help="comma-separated: frame_heavy, byte_heavy"
    )
    parser.add_argument(
        "--frame-rate",
        type=float,
        default=250.0,
        help="frame_heavy: records/s per producer (250; 4 producers)",
    )
    parser.add_argument("--record-bytes", type=int, default=100, help="frame_heavy: record value size (100)")
    parser.add_argument(
        "--batch-kib", type=int, default=128, help="byte_heavy: KiB per burst, one batch (128)"
    )
    parser.add_argument(
        "--batch-rate", type=float, default=10.0, help="byte_heavy: bursts/s per producer (10; 2 producers)"
    )
    parser.add_argument("--no-job", action="store_true", help="skip the streaming job's runs")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="frame_heavy: also rounds of a bare relay (benchmarks/bare_relay.py) and of the tap with its "
        "mirror off: the relay floor (docs/decisions.md)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 5 s warm-up, 1 round of 5 s phases, no job warm-up; writes cost_bench.quick.json "
        'marked "quick": true, never a figure to quote',
    )
    parser.add_argument(
        "--output", type=Path, help="results file (default: benchmarks/results/cost_bench.json)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup_seconds, args.seconds, args.rounds = 5.0, 5.0, 1
    known = workloads(args)
    chosen = [name for name in args.workloads.split(",") if name]
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        parser.error(f"--workloads: unknown {unknown}; choose from {sorted(known)}")
    output = args.output or (QUICK_RESULTS if args.quick else RESULTS)
    started = time.monotonic()
    host = machine()  # the load average as the run starts

    tap_port = _free_port()
    home = Path(tempfile.mkdtemp(prefix="kpmon-cost-bench-"))
    stack = LocalStack(home / "stack", advertised={1: ("127.0.0.1", tap_port)})
    phases: dict[str, list[dict[str, Any]]] = {}
    topics: dict[str, dict[str, Any]] = {}
    jobs: dict[str, dict[str, Any]] = {}
    stack.up()
    try:
        for name in chosen:
            phases[name], topics[name] = measure_workload(known[name], args, stack, tap_port)
        if not args.no_job:
            jobs = run_jobs(stack, topics, home, warm_up=not args.quick)
    finally:
        stack.down()
        shutil.rmtree(home, ignore_errors=True)

    measured = {label: run for label, run in jobs.items() if "error" not in run}
    summaries = {
        name: {
            "workload": asdict(known[name]),
            **summarize([p for p in phases[name] if p["mode"] != "warmup"], topics[name], measured.get(name)),
            "topic": topics[name],
            "job": jobs.get(name),
            "phases": phases[name],
        }
        for name in chosen
    }
    lead = summaries.get("frame_heavy") or summaries[chosen[0]]
    report: dict[str, Any] = {
        "benchmark": "cost_bench",
        "quick": args.quick,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": round(time.monotonic() - started),
        "machine": {**host, "load_after": os.getloadavg()},
        "params": {
            "kafka": stack.version,
            "seconds_per_phase": args.seconds,
            "warmup_seconds": args.warmup_seconds,
            "rounds": args.rounds,
            "capture": args.capture,
            "stats_interval_ms": STATS_INTERVAL_MS,
            "job_warmup": "warmup" in measured,
            "floor": args.floor,
        },
        "anchor": "the broker's CPU per wire frame (request or response) with the same clients direct, same run",
        # ``ratios.tap_records_per_wire_frame``: the issue's key for the same figure (schema 3's target).
        "ratios": {**lead["ratios"], "tap_records_per_wire_frame": lead["records_per_wire_frame"]},
        "records_per_wire_frame": lead["records_per_wire_frame"],
        "workloads": summaries,
        "job_warmup": jobs.get("warmup"),
    }
    for name in chosen:
        print("\n".join(report_lines(name, summaries[name])))
    changed = cores_changed(host["compiled_cores"])
    if changed:
        print(f"cost_bench: not written: {changed}", file=sys.stderr)
        return 1
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {output}")
    failed = sorted(label for label, run in jobs.items() if "error" in run)
    if failed:
        print(f"the job failed on: {', '.join(failed)} (the errors are in the results file)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
