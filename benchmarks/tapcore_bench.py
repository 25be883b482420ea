"""Per-frame cost of the tap's Python reference against the native one (``kpmon_tapcore``), on the same
captured frames in the same run: the whole per-connection core (``tap.core.PyTapCore`` against
``kpmon_tapcore.TapCore``, per capture policy and with mirroring off), then its pieces one by one:
framing, header peeks, ``expects_response``, correlation (one request held and matched per exchange)
and the schema-3 record writer.

Frames: every capture of the test corpus (tests/data/tap_frames.jsonl, tests/data/golden), repeated.
Each piece runs over all of them a few times, best of ``--repeat``; figures are ns per frame (per
entry for the writer). Writes benchmarks/results/tapcore_bench.json (``--quick``: a smoke run, to
tapcore_bench.quick.json, not committed). Run it with nothing else on the machine:

    .venv/bin/python -m benchmarks.tapcore_bench
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import codec.peek  # noqa: E402
import codec.taprecord as taprecord  # noqa: E402
from benchmarks.results_file import header, write  # noqa: E402
from codec.taprecord import Connection, Part  # noqa: E402
from tap import native_core  # noqa: E402
from tap.core import CoreSettings, PyTapCore, TapCore, capture_slow, tables  # noqa: E402
from tap.framing import Correlations, FrameSplitter, HoldLimits, Pending, expects_response  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
DATA = REPO / "tests" / "data"


def corpus() -> list[tuple[str, int, int, bytes]]:
    """(direction, api key, api version, frame) of every captured frame."""
    out = []
    for line in (DATA / "tap_frames.jsonl").read_text().splitlines():
        f = json.loads(line)
        out.append((f["dir"], f["api_key"], f["api_version"], bytes.fromhex(f["hex"])))
    for path in sorted((DATA / "golden").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            f = json.loads(line)
            direction = "req" if f["direction"] == "request" else "resp"
            out.append((direction, f["api_key"], f["api_version"], bytes.fromhex(f["hex"])))
    return out


def best_ns(run: Callable[[], int], repeat: int) -> float:
    """The fastest of ``repeat`` runs, in ns per unit (``run`` returns how many units it did)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter_ns()
        units = run()
        best = min(best, (time.perf_counter_ns() - started) / units)
    return best


def pieces(
    frames: list[tuple[str, int, int, bytes]], native: Any
) -> dict[str, tuple[Callable[[], int], ...]]:
    """Each piece as (Python run, native run) over the same frames."""
    chunks = [struct.pack(">i", len(f)) + f for _, _, _, f in frames]
    requests = [f for d, _, _, f in frames if d == "req"]
    responses = [f for d, _, _, f in frames if d == "resp"]
    keyed = [(f, *struct.unpack_from(">hh", f)) for f in requests]
    table = native_core.produce_table(native)

    def split_py() -> int:
        s = FrameSplitter(900_000)
        return sum(len(s.feed(c)) for c in chunks)

    def split_native() -> int:
        s = native.FrameSplitter(900_000)
        return sum(len(s.feed(c)) for c in chunks)

    def peek_py() -> int:
        for f in requests:
            codec.peek.peek_request_header(f)
        for f in responses:
            codec.peek.peek_correlation_id(f)
        return len(requests) + len(responses)

    def peek_native() -> int:
        for f in requests:
            native.peek_request_header(f)
        for f in responses:
            native.peek_correlation_id(f)
        return len(requests) + len(responses)

    def expects_py() -> int:
        for f, key, version in keyed:
            expects_response(f, key, version)
        return len(keyed)

    def expects_native() -> int:
        for f, key, version in keyed:
            table.expects_response(f, key, version)
        return len(keyed)

    held = [Part("req", i, key, version, i, f) for i, (f, key, version) in enumerate(keyed)]

    def pair_py() -> int:
        c = Correlations(HoldLimits())
        for i, part in enumerate(held):
            c.add(i, Pending(part.api_key or 0, part.api_version or 0, i, held=part))
            c.match(i)
        return 2 * len(held)

    def pair_native() -> int:
        c = native_core.correlations(native, HoldLimits())
        for i, part in enumerate(held):
            c.add(i, part.api_key or 0, part.api_version or 0, i, part, len(part.value or b""))
            c.match(i)
        return 2 * len(held)

    static = taprecord.pack_static(
        Connection("c-1", "127.0.0.1:5000", "127.0.0.1:9092", 1, "PLAINTEXT", "tap")
    )
    entries = [
        ("ex" if d == "req" else "resp", seq, [Part(d, 1_700_000_000_000_000_000 + seq, k, v, seq, f)])
        for seq, (d, k, v, f) in enumerate(frames, start=1)
    ]
    flushes = [entries[at : at + 64] for at in range(0, len(entries), 64)]

    def flush_py() -> int:
        for flush in flushes:
            taprecord.pack_flush(static, flush)
        return len(entries)

    def flush_native() -> int:
        for flush in flushes:
            native.pack_flush(static, flush)
        return len(entries)

    cores = {
        f"core_{name}": core_pieces(frames, native, settings) for name, settings in CORE_SETTINGS.items()
    }
    return {
        **cores,
        "framing": (split_py, split_native),
        "peek_headers": (peek_py, peek_native),
        "expects_response": (expects_py, expects_native),
        "pairing": (pair_py, pair_native),
        "pack_flush_per_entry": (flush_py, flush_native),
    }


#: The whole per-connection core under each capture policy, and with mirroring off.
CORE_SETTINGS: dict[str, CoreSettings] = {
    "headers": CoreSettings(capture="headers"),
    "full": CoreSettings(capture="full"),
    "meta": CoreSettings(capture="meta"),
    "off": CoreSettings(mirror=False),
}


def core_pieces(
    frames: list[tuple[str, int, int, bytes]], native: Any, settings: CoreSettings
) -> tuple[Callable[[], int], Callable[[], int]]:
    """A connection's core fed the captured frames in their order, a chunk per frame, as the adapter
    drives it (slow frames resolved, records taken as they fall due, the rest flushed): per frame."""
    chunks = [(d == "req", struct.pack(">i", len(f)) + f) for d, _, _, f in frames]
    static = taprecord.pack_static(Connection("c-1", "127.0.0.1:5000", "127.0.0.1:9092", 1, "L", "tap"))
    core_tables = tables()

    def drive(core: TapCore) -> int:
        mono = 0
        for from_client, chunk in chunks:
            mono += 1_000
            core.feed(from_client, chunk, mono, mono, 0)
            while (slow := core.slow()) is not None:
                core.resolve(*capture_slow(slow, settings))
                core.feed(slow.from_client, b"", mono, mono, 0)
            while core.take_record(0, 0) is not None:
                pass
        core.flush(0, 0)
        return len(chunks)

    def python_core() -> int:
        return drive(PyTapCore(core_tables, settings, static))

    def native_core_() -> int:
        core: TapCore = native.TapCore(core_tables, settings, static)
        return drive(core)

    return python_core, native_core_


def run(times: int, repeat: int) -> dict[str, Any]:
    native, why = native_core.status()
    if native is None:
        raise SystemExit(f"tapcore_bench: {why}: nothing to compare (make setup builds it)")
    frames = corpus() * times
    out: dict[str, Any] = {}
    for name, (py, nat) in pieces(frames, native).items():
        python_ns, native_ns = best_ns(py, repeat), best_ns(nat, repeat)
        out[name] = {
            "python_ns": round(python_ns, 1),
            "native_ns": round(native_ns, 1),
            "python_over_native": round(python_ns / native_ns, 2),
        }
        print(
            f"{name:22} python {python_ns:9.1f} ns  native {native_ns:8.1f} ns  x{python_ns / native_ns:.1f}"
        )
    return {"frames": len(frames), "core": why, "per_frame": out}


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: few frames, 2 repetitions")
    args = parser.parse_args(list(argv) if argv is not None else None)
    record = header("tapcore_bench")
    record.update(run(times=2 if args.quick else 50, repeat=2 if args.quick else 7))
    name = "tapcore_bench.quick.json" if args.quick else "tapcore_bench.json"
    write(RESULTS / name, record, REPO)
    return 0


if __name__ == "__main__":
    sys.exit(main())
