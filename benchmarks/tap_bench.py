"""Tap overhead: kafka-producer-perf-test direct vs through the tap, alternating, per capture policy.

Starts a local single-broker stack that advertises the tap's port, and runs the tap as its own
process (``kpmon tap``) so its CPU can be read from /proc. "Direct" runs bootstrap from the broker's
inter-broker listener, which advertises the broker itself; "tap" runs bootstrap from the tap.
Capture ``off`` forwards and counts only (``--no-mirror``); the others mirror to a tap topic on the
same broker (through the internal listener, never through the tap).

    python benchmarks/tap_bench.py [--records 200000] [--rounds 2] [--policies off,meta,headers,full]

Writes ``benchmarks/results/tap_bench.json``: throughput, p50/p99 latency, and the tap's CPU
(seconds, mean cores, and milli-cores per MB/s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy.local.stack import LocalStack  # noqa: E402
from deploy.local.tools import run_tool  # noqa: E402
from deploy.versions import KAFKA_LATEST, KAFKA_LEGACY  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "tap_bench.json"
_PERF = re.compile(
    r"(?P<n>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th"
)
_TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def _perf(version: str, bootstrap: str, topic: str, records: int) -> dict[str, float]:
    args = ["--topic", topic, "--num-records", str(records), "--record-size", "1024", "--throughput", "-1"]
    args += ["--producer-props", f"bootstrap.servers={bootstrap}", "acks=all", "linger.ms=5"]
    done = run_tool(version, "kafka-producer-perf-test", args, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    match = None
    for line in done.stdout.splitlines():
        match = _PERF.search(line) or match
    if match is None:
        raise RuntimeError(f"no summary in perf-test output:\n{done.stdout[-2000:]}")
    return {
        "records_per_sec": float(match["rps"]),
        "mb_per_sec": float(match["mbps"]),
        "p50_ms": float(match["p50"]),
        "p99_ms": float(match["p99"]),
        "avg_ms": float(match["avg"]),
    }


class TapProcess:
    def __init__(self, listen: int, broker: str, policy: str, mirror_bootstrap: str) -> None:
        cmd = [sys.executable, "-m", "kpmon.cli", "tap", "--listen", f"127.0.0.1:{listen}={broker}@1"]
        cmd += ["--no-metrics", "--log-level", "WARNING"]
        if policy == "off":
            cmd.append("--no-mirror")
        else:
            cmd += [
                "--capture",
                policy,
                "--tap-bootstrap-servers",
                mirror_bootstrap,
                "--topic",
                f"kpmon.bench.{policy}",
            ]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", listen), 0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("tap did not start") from None
                time.sleep(0.1)

    def cpu(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--policies", default="off,meta,headers,full")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]

    tap_port = _free_port()
    home = Path(tempfile.mkdtemp(prefix="kpmon-tap-bench-"))
    stack = LocalStack(home, advertised={1: ("127.0.0.1", tap_port)})
    stack.up()
    runs: list[dict[str, Any]] = []
    try:
        broker = stack.listen_endpoints[0].address
        direct = stack.internal_bootstrap_servers
        probe = run_tool(KAFKA_LATEST, "kafka-topics", ["--bootstrap-server", direct, "--list"], timeout=60)
        version = KAFKA_LEGACY if "NoClassDefFoundError" in probe.stderr else KAFKA_LATEST
        topic = "tap-bench"
        run_tool(
            version, "kafka-topics", ["--bootstrap-server", direct, "--create", "--topic", topic], timeout=60
        )
        _perf(version, direct, topic, min(args.records, 20_000))  # warm the broker up
        for policy in policies:
            tap = TapProcess(tap_port, broker, policy, direct)
            try:
                for round_no in range(args.rounds):
                    # Alternate, so drift (page cache, JIT, log segments) hits both sides alike.
                    for mode in ("direct", "tap") if round_no % 2 == 0 else ("tap", "direct"):
                        cpu0, t0 = tap.cpu(), time.monotonic()
                        result = _perf(
                            version,
                            direct if mode == "direct" else f"127.0.0.1:{tap_port}",
                            topic,
                            args.records,
                        )
                        wall = time.monotonic() - t0
                        cpu = tap.cpu() - cpu0
                        entry = {"policy": policy, "mode": mode, "round": round_no, "wall_s": wall, **result}
                        if mode == "tap":
                            entry["tap_cpu_s"] = cpu
                            entry["tap_cores"] = cpu / wall
                            entry["tap_mcores_per_mb_s"] = (
                                1000 * (cpu / wall) / max(result["mb_per_sec"], 1e-9)
                            )
                        runs.append(entry)
                        print(json.dumps(entry), flush=True)
            finally:
                tap.stop()
    finally:
        stack.down()

    summary: dict[str, Any] = {}
    for policy in policies:

        def mean(mode: str, key: str, policy: str = policy) -> float:
            values = [r[key] for r in runs if r["policy"] == policy and r["mode"] == mode and key in r]
            return sum(values) / len(values) if values else float("nan")

        summary[policy] = {
            "direct_mb_per_sec": mean("direct", "mb_per_sec"),
            "tap_mb_per_sec": mean("tap", "mb_per_sec"),
            "throughput_ratio": mean("tap", "mb_per_sec") / mean("direct", "mb_per_sec"),
            "direct_p50_ms": mean("direct", "p50_ms"),
            "tap_p50_ms": mean("tap", "p50_ms"),
            "direct_p99_ms": mean("direct", "p99_ms"),
            "tap_p99_ms": mean("tap", "p99_ms"),
            "tap_cores": mean("tap", "tap_cores"),
            "tap_mcores_per_mb_s": mean("tap", "tap_mcores_per_mb_s"),
        }
    report = {
        "benchmark": "tap_bench",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "params": {
            "records": args.records,
            "record_size": 1024,
            "acks": "all",
            "rounds": args.rounds,
            "tools": version,
        },
        "summary": summary,
        "runs": runs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
