"""Alert hooks: what ``publish`` costs the caller, and how fast alerts reach a loopback receiver.

    python benchmarks/hooks_bench.py [--alerts 2000] [--batch 10] [--rounds 3]

Measures, in one run:

- ``publish`` time per call (``--batch`` alerts) for a log hook (no spool: the comparison), a webhook to a
  live receiver, and a webhook to a dead one (connection refused). Live and dead cost the same when
  publish never waits on the network; the spool's fsync is the difference to the log hook.
- delivery throughput (alerts/s) to a live loopback receiver: a generic webhook (one POST per alert)
  against Alertmanager (one POST per batch), and publish-to-receipt latency p50/p95 per alert (which,
  with ``--alerts`` published at once, is mostly queueing behind the earlier ones);
- publish-to-acknowledgement latency of one alert at a time (nothing queued ahead) for webhook, Slack
  and Alertmanager payloads.

Writes ``benchmarks/results/hooks_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results_file import machine  # noqa: E402
from kpconfig.model import KpmonConfig  # noqa: E402
from streaming.hooks import AlertHooks  # noqa: E402
from tests.streaming.hooks.builders import alert  # noqa: E402
from tests.streaming.hooks.receiver import Received, Receiver, Reply, free_port  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "hooks_bench.json"
FAST = {"min_severity": "info", "backoff_initial_seconds": 0.05, "backoff_max_seconds": 0.5}


def _config(hook: dict[str, Any]) -> KpmonConfig:
    return KpmonConfig.model_validate({"alerts": {"hooks": [{**FAST, **hook}]}})


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def publish_cost(hook: dict[str, Any], alerts: int, batch: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as spool:
        hooks = AlertHooks(_config(hook), Path(spool))
        times = []
        for start in range(0, alerts, batch):
            group = [alert(f"p{n}") for n in range(start, min(alerts, start + batch))]
            began = time.perf_counter()
            hooks.publish(group)
            times.append(time.perf_counter() - began)
        hooks.close(0.2)
    return {
        "calls": len(times),
        "mean_us": statistics.fmean(times) * 1e6,
        "p50_us": _percentile(times, 0.5) * 1e6,
        "p95_us": _percentile(times, 0.95) * 1e6,
    }


def _serve(port: int, conn: Connection) -> None:
    """The receiver runs in its own process, as a real one would: its threads must not compete with the
    publisher for this process's GIL."""
    received: dict[str, float] = {}

    def script(request: Received) -> Reply:
        now = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes on one machine
        entries = request.body if isinstance(request.body, list) else [request.body]
        for entry in entries:
            # webhook: the alert dict; Alertmanager: a list of entries; Slack: a message (not tracked).
            key = entry.get("id") or entry.get("labels", {}).get("alert_id")
            if key:
                received[key] = now
        return Reply()

    receiver = Receiver(port, script=script).start()
    conn.send("ready")
    conn.recv()
    receiver.stop()
    conn.send((received, len(receiver.requests)))


class RemoteReceiver:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._conn, child = multiprocessing.Pipe()
        self._process = multiprocessing.get_context("fork").Process(
            target=_serve, args=(self.port, child), daemon=True
        )
        self._process.start()
        assert self._conn.recv() == "ready"

    def stop(self) -> tuple[dict[str, float], int]:
        self._conn.send("stop")
        received, requests = self._conn.recv()
        self._process.join(5)
        return received, requests


def delivery(kind: str, alerts: int, batch: int) -> dict[str, float]:
    receiver = RemoteReceiver()
    hook: dict[str, Any] = {"kind": kind, "url": receiver.url}
    if kind == "alertmanager":
        hook["max_per_second"] = 1000.0
    published: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory() as spool:
            hooks = AlertHooks(_config(hook), Path(spool))
            began = time.monotonic()
            for start in range(0, alerts, batch):
                group = [alert(f"d{n}") for n in range(start, min(alerts, start + batch))]
                stamp = time.monotonic()
                hooks.publish(group)
                published.update((a.id, stamp) for a in group)
            hooks.flush(120.0)
            elapsed = time.monotonic() - began
            hooks.close(1.0)
    finally:
        received, requests = receiver.stop()
    latencies = [received[key] - published[key] for key in published if key in received]
    return {
        "delivered": len(latencies),
        "requests": requests,
        "alerts_per_s": len(latencies) / elapsed,
        "latency_p50_ms": _percentile(latencies, 0.5) * 1e3,
        "latency_p95_ms": _percentile(latencies, 0.95) * 1e3,
    }


def isolated(kind: str, samples: int) -> dict[str, float]:
    """One alert at a time, publish to the receiver's acknowledgement: the hook's share of alert latency
    when nothing is queued ahead (the stream's case: a few alerts per micro-batch)."""
    receiver = RemoteReceiver()
    hook: dict[str, Any] = {"kind": kind, "url": receiver.url, "max_per_second": 1000.0}
    times = []
    try:
        with tempfile.TemporaryDirectory() as spool:
            hooks = AlertHooks(_config(hook), Path(spool))
            for n in range(samples):
                began = time.monotonic()
                hooks.publish([alert(f"i{n}")])
                hooks.flush(30.0)
                times.append(time.monotonic() - began)
            hooks.close(1.0)
    finally:
        receiver.stop()
    return {
        "samples": samples,
        "p50_ms": _percentile(times, 0.5) * 1e3,
        "p95_ms": _percentile(times, 0.95) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alerts", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    host = machine()  # the load average as the run starts
    # The log hook's lines and the dead hook's warnings are part of the cost, not of the output.
    quiet = logging.getLogger("kpmon.alerts")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False

    dead = f"http://127.0.0.1:{free_port()}"
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        live = RemoteReceiver()
        try:
            cost = {
                "log": publish_cost({"kind": "log"}, args.alerts, args.batch),
                "webhook_live": publish_cost({"kind": "webhook", "url": live.url}, args.alerts, args.batch),
                "webhook_dead": publish_cost({"kind": "webhook", "url": dead}, args.alerts, args.batch),
            }
        finally:
            live.stop()
        result = {
            "publish": cost,
            "delivery": {
                "webhook": delivery("webhook", args.alerts, args.batch),
                "alertmanager": delivery("alertmanager", args.alerts, args.batch),
            },
            "isolated": {kind: isolated(kind, 50) for kind in ("webhook", "slack", "alertmanager")},
        }
        rounds.append(result)
        p, d = result["publish"], result["delivery"]
        print(
            f"round {number + 1}: publish of {args.batch} alerts: log {p['log']['mean_us']:.0f} us, "
            f"webhook live {p['webhook_live']['mean_us']:.0f} us, dead {p['webhook_dead']['mean_us']:.0f} us "
            f"(dead/live {p['webhook_dead']['mean_us'] / p['webhook_live']['mean_us']:.2f}, "
            f"spooled/log {p['webhook_live']['mean_us'] / p['log']['mean_us']:.2f}); "
            f"delivery webhook {d['webhook']['alerts_per_s']:.0f}/s p50 {d['webhook']['latency_p50_ms']:.1f} ms "
            f"p95 {d['webhook']['latency_p95_ms']:.1f} ms, alertmanager {d['alertmanager']['alerts_per_s']:.0f}/s "
            f"({d['alertmanager']['requests']} requests) p95 {d['alertmanager']['latency_p95_ms']:.1f} ms "
            f"(batched/webhook {d['alertmanager']['alerts_per_s'] / d['webhook']['alerts_per_s']:.1f}x); "
            f"one alert at a time, publish to ack p50/p95: "
            + ", ".join(f"{k} {v['p50_ms']:.1f}/{v['p95_ms']:.1f} ms" for k, v in result["isolated"].items()),
            flush=True,
        )

    def median(path: list[str]) -> float:
        values = []
        for result in rounds:
            node: Any = result
            for part in path:
                node = node[part]
            values.append(float(node))
        return statistics.median(values)

    summary = {
        "publish_us_log": median(["publish", "log", "mean_us"]),
        "publish_us_webhook_live": median(["publish", "webhook_live", "mean_us"]),
        "publish_us_webhook_dead": median(["publish", "webhook_dead", "mean_us"]),
        "webhook_alerts_per_s": median(["delivery", "webhook", "alerts_per_s"]),
        "webhook_latency_p50_ms": median(["delivery", "webhook", "latency_p50_ms"]),
        "webhook_latency_p95_ms": median(["delivery", "webhook", "latency_p95_ms"]),
        "alertmanager_alerts_per_s": median(["delivery", "alertmanager", "alerts_per_s"]),
        "alertmanager_latency_p95_ms": median(["delivery", "alertmanager", "latency_p95_ms"]),
        **{
            f"isolated_{kind}_p95_ms": median(["isolated", kind, "p95_ms"])
            for kind in ("webhook", "slack", "alertmanager")
        },
    }
    summary["dead_over_live_publish"] = (
        summary["publish_us_webhook_dead"] / summary["publish_us_webhook_live"]
    )
    summary["alertmanager_over_webhook_rate"] = (
        summary["alertmanager_alerts_per_s"] / summary["webhook_alerts_per_s"]
    )
    print("median of rounds:", json.dumps(summary, indent=1))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "args": vars(args),
                "machine": host,
                "summary": summary,
                "rounds": rounds,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
