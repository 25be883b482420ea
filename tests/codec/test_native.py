"""The compiled per-frame cores (codec/native.py): built by the set-up, used, and equal to plain Python.

The build is mypyc over the very source the rest of the suite tests, so the suite itself runs on the
compiled modules; ``make test`` runs the cores' tests once more with ``KPMON_NATIVE=0``. Here: the
loader's verdict, that the set-up's build is what runs, and a differential run of the staged
pipeline, compiled against plain Python, on the same frames, row for row.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import checks.engine
import checks.rules.producers
import codec.taprecord
import streaming.stages
from codec import native

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = {"checks/engine.py": "aa", "streaming/stages.py": "bb"}
ABI = ".cpython-311-x86_64-linux-gnu.so"
GOOD: dict[str, Any] = {"abi": ABI, "group": "x__mypyc.so", "modules": dict(DIGESTS)}


def test_a_build_is_used_only_when_it_matches_the_source_and_the_interpreter() -> None:
    abi = ABI
    assert native.verdict(GOOD, DIGESTS, abi) is None
    assert "not built" in str(native.verdict(None, DIGESTS, abi))
    assert "built for" in str(native.verdict(GOOD, DIGESTS, ".cpython-312-x86_64-linux-gnu.so"))
    edited = {**DIGESTS, "streaming/stages.py": "cc"}
    assert "out of date" in str(native.verdict(GOOD, edited, abi))
    assert "streaming/stages.py" in str(native.verdict(GOOD, edited, abi))
    added = {**DIGESTS, "checks/sharding.py": "dd"}
    assert "checks/sharding.py" in str(native.verdict(GOOD, added, abi))
    assert "shared library" in str(native.verdict({**GOOD, "group": ""}, DIGESTS, abi))


def range_bounds_assigned_in_their_loop(source: str) -> list[int]:
    """Lines of the ``for ... in range(...)`` loops whose body assigns a name the range's arguments read.

    mypyc (2.4) reads a local that bounds a ``range`` loop again at every iteration, where Python reads
    it once: ``for _ in range(n)`` whose body sets ``n`` runs a different number of times compiled."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.For)
            and isinstance(node.iter, ast.Call)
            and isinstance(node.iter.func, ast.Name)
            and node.iter.func.id == "range"
        ):
            continue
        read = {n.id for arg in node.iter.args for n in ast.walk(arg) if isinstance(n, ast.Name)}
        assigned = {
            n.id
            for stmt in node.body
            for n in ast.walk(stmt)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        if read & assigned:
            lines.append(node.lineno)
    return lines


def test_the_range_rule_finds_a_bound_its_loop_assigns() -> None:
    assert range_bounds_assigned_in_their_loop("for _ in range(n):\n    n -= 1\n") == [1]
    assert range_bounds_assigned_in_their_loop("for _ in range(0, len(xs)):\n    xs = []\n") == [1]
    assert range_bounds_assigned_in_their_loop("for i in range(n):\n    m = i\n") == []
    assert range_bounds_assigned_in_their_loop("for x in xs:\n    xs = []\n") == []


def test_no_compiled_module_assigns_a_range_bound_inside_its_loop() -> None:
    found = {
        path: lines
        for path in native.MODULES
        if (lines := range_bounds_assigned_in_their_loop((ROOT / path).read_text()))
    }
    assert found == {}, f"copy the bound into a local before the loop: {found}"


HOT_MODULES = (checks.engine, checks.rules.producers, codec.taprecord, streaming.stages)


def test_the_set_up_build_is_what_runs() -> None:
    used, why = native.status()
    if native.disabled():
        assert not used
        assert not any(native.compiled(m) for m in HOT_MODULES)
        return
    # `make setup` builds the cores: a suite that ran them as plain Python would measure nothing of
    # what the job runs (a stale or missing build says why here).
    assert used, why
    assert all(native.compiled(m) for m in HOT_MODULES), [m.__file__ for m in HOT_MODULES]


#: Runs in a child Python: the staged pipeline (bucketed, as the job runs it) over the proofs' frames
#: and real traffic, plus a fleet with fenced producers; every output row, as JSON.
_PIPELINE = """
import json, sys
from benchmarks.stream_bench import session
from codec.taprecord import frames_from_record
from tests.checks.test_sharding import corpus_frames, single_run, summary, with_headers_only
from tests.streaming.test_stages import run_bucketed

def fleet():
    start = 1_700_000_000 * 10**9
    records = [r for i in range(60) for r in session(i, start + i * 3_000_000, zombie=i % 7 == 0)]
    out = []
    for offset, (key, raw, headers) in enumerate(records):
        out.extend(frames_from_record(dict(headers or {}), raw, 0, offset))
    return sorted(out, key=lambda f: (f.ts_ns, f.conn, f.seq))

out = {}
for name, frames in (("proofs", with_headers_only()), ("corpus", corpus_frames()), ("fleet", fleet())):
    out[name + "/single"] = [list(map(str, s)) for s in summary(single_run(frames))]
    for batch, buckets in ((1, 1), (7, 3), (1000, 16)):
        rows, calls = run_bucketed(frames, batch, buckets)
        out[f"{name}/{batch}/{buckets}"] = [r._asdict() for r in rows] + [calls]
json.dump(out, sys.stdout, sort_keys=True)
"""


def _pipeline(native_env: str) -> dict[str, Any]:
    env = {**os.environ, native.ENV: native_env, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _PIPELINE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


@pytest.mark.skipif(not native.status()[0], reason="the compiled build is not in use (see the test above)")
def test_the_compiled_pipeline_makes_exactly_what_plain_python_makes() -> None:
    compiled, plain = _pipeline("1"), _pipeline("0")
    assert compiled.keys() == plain.keys()
    for name in plain:
        assert compiled[name] == plain[name], name
    # Not vacuous: the fleet's fenced producers and the proofs' scenarios raise findings, and the real
    # traffic (clean) makes its aggregates and counters.
    findings = [r for r in plain["fleet/7/3"][:-1] if r["kind"] == "finding"]
    assert findings and plain["proofs/single"] and len(plain["corpus/7/3"]) > 1
