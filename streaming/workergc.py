"""The garbage collector's settings in the job's Python workers: the routing ``mapInArrow`` stage's and
the stateful stage's.

The stage allocates a few dicts and tuples per frame and frees almost all of them by reference count, so
CPython's young-generation collections (every 700 net container allocations by default) find next to
nothing to free; and each full collection walks every object the worker holds, most of them pyspark,
pandas, pyarrow and the checks catalogue, loaded once and alive for the worker's life. Measured in the job
(``stream_bench.py``, 200k frames, local[2]): the collector took 16 % of each stateful worker's CPU
(1.55 of 9.6 s). Freezing what is alive after the first init and collecting the young generation every
50,000 allocations cut that to 0.24 s and the worker's CPU by 13 % (docs/benchmarks.md).

The routing stage allocates as much per frame (the decoded messages, routes and packed entries of a
source batch), all alive until the batch's bundles are out: ``stages_bench.py --default-gc`` routed at
83 µs per frame against 56 µs with the tuned settings, and collections were still a tenth of the
routing's samples under py-spy, which pausing the collector while a batch is routed
(``collector_paused``) removes.

The pure stage functions (``streaming.stages``) never touch the collector: this is the Spark adapter's
decision about a process it owns, switched by ``stream.worker_gc``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Net container allocations between young-generation collections (CPython's default is 700).
GEN0_THRESHOLD = 50_000
#: Young collections between middle-generation collections, and those between full ones (10 and 10 by
#: default): full collections stay rare, and frozen objects are not walked by them.
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 100

_tuned = False


def tune_worker_gc() -> bool:
    """Once per process: move what is alive now out of the collector's reach, then collect less often.

    Returns whether this call changed the settings (False: an earlier call did)."""
    global _tuned
    if _tuned:
        return False
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
    _tuned = True
    return True


@contextmanager
def collector_paused(paused: bool) -> Iterator[None]:
    """No collections while one source batch is routed (``paused``: ``stream.worker_gc``).

    A batch's frames, routes and packed entries are alive until its bundles are out, so every
    collection meanwhile walks them all and frees nothing; what they leave in cycles is collected
    after, bounded by one batch."""
    if not paused or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
