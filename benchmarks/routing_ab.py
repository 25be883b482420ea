"""A/B of the streaming job's routing between two checkouts: the same work, builds alternating.

The routing stage's Python (``streaming.bundles``: decode the tap records into frames, then route the
decoded frames into bundles) is timed as ``stages_bench.route_parts`` times it, over the same
``stages_bench`` workload, in a child process per checkout (its own compiled cores, ``make native`` in
each), pinned to one CPU and timed in the process's CPU time: on a shared host, wall time between two
runs a minute apart moves by more than a change may gain. The builds alternate ``--rounds`` times; each
run keeps its fastest of ``--repeats``. The comparison each build is measured against is the full codec
decode of the same records in the same child (the routing's anchor in ``stages_bench``), timed in CPU
time as well: both checkouts need ``stages_bench.full_decode``'s ``clock`` and
``stages_bench.routing_work``. A checkout with ``streaming.frames.batch_frames`` is timed decoding the
source batches with it (reading the records included); one from before, decoding the columns its
``routing_work`` read.

    .venv/bin/python benchmarks/routing_ab.py --before ../before --after . --out NAME

writes ``benchmarks/results/NAME.json`` (``--no-write``: print only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results_file import header, write  # noqa: E402

#: Runs in the child, with the checkout under test first on ``sys.path``: CPU seconds per part.
_CHILD = """
import json, sys, time
from benchmarks import stages_bench as sb
from codec import native, taprecord
from streaming.router import route_frames
from streaming.workergc import collector_paused, tune_worker_gc

sessions, repeats = int(sys.argv[1]), int(sys.argv[2])
records = sb.tap_records(sessions)
work = sb.routing_work(records, 20_000, 0)
tune_worker_gc()
try:
    from streaming.frames import batch_frames

    def decode(batch, count):
        return batch_frames(batch)[0]
except ImportError:  # a checkout from before ``batch_frames``: its routing_work gives the columns
    def decode(columns, count):
        return taprecord.frames_from_columns(columns, count)
frames = [decode(b, n) for b, n, _ in work]
best = {"decode": float("inf"), "routing": float("inf"), "full_decode": float("inf")}
for _ in range(repeats):
    with collector_paused(True):
        t0 = time.process_time()
        for batch, count, _ in work:
            decode(batch, count)
        t1 = time.process_time()
        for decoded, (_, _, newest_ms) in zip(frames, work):
            route_frames(sb.SETTINGS, decoded, newest_ms, len(sb.LABELS))
        t2 = time.process_time()
    best["decode"] = min(best["decode"], t1 - t0)
    best["routing"] = min(best["routing"], t2 - t1)
    best["full_decode"] = min(best["full_decode"], sb.full_decode(records, time.process_time))
count = sum(n for _, n, _ in work)
us = {part: best[part] / count * 1e6 for part in ("decode", "routing")}
us["full_decode"] = best["full_decode"] / sb.frames_of(records) * 1e6
print(json.dumps({"frames": count, "native": native.status()[1], "us_per_frame": us}))
"""


def measure(tree: Path, sessions: int, repeats: int, cpu: int | None) -> dict[str, Any]:
    command = [sys.executable, "-c", _CHILD, str(sessions), str(repeats)]
    if cpu is not None:
        command = ["taskset", "-c", str(cpu), *command]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["native"].startswith("compiled"):
        raise SystemExit(f"{tree}: the compiled cores are not in use ({result['native']}): make native there")
    return result


def _git(tree: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree, capture_output=True, text=True
    )
    return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the checkout without the change")
    parser.add_argument("--after", type=Path, required=True, help="the checkout with it")
    parser.add_argument("--rounds", type=int, default=8, help="alternations of the two builds")
    parser.add_argument("--repeats", type=int, default=6, help="timed passes per run (its fastest is kept)")
    parser.add_argument(
        "--sessions", type=int, default=2000, help="stages_bench client sessions (43 frames each)"
    )
    parser.add_argument("--cpu", type=int, default=1, help="the CPU each run is pinned to (-1: not pinned)")
    parser.add_argument("--out", default="routing_ab", help="the results file's name, without .json")
    parser.add_argument("--what", default="", help="what the change is, for the results file")
    parser.add_argument(
        "--quick", action="store_true", help="one round, one pass, 100 sessions: a smoke run, no file"
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.repeats, args.sessions, args.no_write = 1, 1, 100, True
    cpu = None if args.cpu < 0 else args.cpu
    load_before = os.getloadavg()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for round_ in range(args.rounds):
        for build, tree in trees.items():
            result = measure(tree, args.sessions, args.repeats, cpu)
            runs[build].append(result["us_per_frame"])
            figures = ", ".join(f"{part} {us:.2f}" for part, us in result["us_per_frame"].items())
            print(f"round {round_ + 1} {build:6} {figures} µs/frame", flush=True)
    summary: dict[str, Any] = {}
    for build, measured in runs.items():
        summary[build] = {
            part: {
                "min": min(m[part] for m in measured),
                "median": statistics.median(m[part] for m in measured),
            }
            for part in measured[0]
        }
    ratios = {
        part: {
            stat: summary["after"][part][stat] / summary["before"][part][stat] for stat in ("min", "median")
        }
        for part in ("decode", "routing")
    }
    for build in runs:
        routing, anchor = summary[build]["routing"]["median"], summary[build]["full_decode"]["median"]
        print(f"{build:6} routing {routing:.2f} µs/frame median, {routing / anchor:.2f}x a full decode")
    print(
        f"after / before: routing {ratios['routing']['median']:.3f} (median), {ratios['routing']['min']:.3f} (min); "
        f"decode {ratios['decode']['median']:.3f} (median)"
    )
    if not args.no_write:
        record = header("routing_ab")
        record.update(
            what=args.what,
            builds={build: _git(tree) for build, tree in trees.items()},
            method=f"{args.rounds} rounds alternating, fastest of {args.repeats} passes per run, CPU time, "
            f"pinned to CPU {cpu}, {args.sessions} stages_bench sessions",
            load_average={"before": load_before, "after": os.getloadavg()},
            runs=runs,
            summary=summary,
            ratios_after_over_before=ratios,
        )
        write(ROOT / "benchmarks" / "results" / f"{args.out}.json", record, ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
