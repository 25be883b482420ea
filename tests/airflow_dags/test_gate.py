"""The health gate's verdicts over sequences of observations (progress files as the job writes them)."""

from __future__ import annotations

from typing import Any

from airflow_dags.gate import FAIL, PASS, WAIT, HealthGate
from kpconfig.model import StreamConfig
from streaming.status import judge

STREAM = StreamConfig(stall_seconds=30, max_lag_records=100)
SPAWNED = 1000.0


def progress(written_at: float, batch: int | None, lag: int = 0, state: str = "running") -> dict[str, Any]:
    end = {"tap": {"0": 500}}
    return {
        "batchId": batch,
        "sources": [{"endOffset": end, "latestOffset": {"tap": {"0": 500 + lag}}}],
        "kpmon": {"written_at": written_at, "state": state},
    }


def gate(batches: int = 3, baseline: int | None = 10) -> HealthGate:
    return HealthGate(batches, since=SPAWNED, baseline_batch=baseline, start_timeout=120, timeout=300)


def see(g: HealthGate, now: float, p: dict[str, Any] | None, alive: bool = True) -> tuple[str, str]:
    verdict = g.observe(now, alive, p, judge(p, now, STREAM))
    return verdict.outcome, verdict.reason


def test_the_old_jobs_progress_is_not_the_new_ones() -> None:
    g = gate()
    old = progress(SPAWNED - 5, 10, state="stopped")
    assert see(g, SPAWNED + 10, old) == (WAIT, "starting")
    assert see(g, SPAWNED + 10, None) == (WAIT, "starting")
    outcome, reason = see(g, SPAWNED + 121, old)
    assert outcome == FAIL and "within 120 s" in reason


def test_k_batches_after_the_baseline_pass() -> None:
    g = gate(batches=3, baseline=10)
    assert see(g, SPAWNED + 50, progress(SPAWNED + 50, None, state="starting"))[0] == WAIT
    # The first batch after a restart may re-run the last one: it does not count.
    assert see(g, SPAWNED + 60, progress(SPAWNED + 60, 10))[0] == WAIT
    assert see(g, SPAWNED + 61, progress(SPAWNED + 61, 11)) == (WAIT, "1/3 batches, healthy")
    # Polls can miss batches: ids are consecutive, so batch 13 means three have completed.
    outcome, reason = see(g, SPAWNED + 70, progress(SPAWNED + 70, 13))
    assert outcome == PASS and reason.startswith("3 batches")


def test_fresh_checkpoint_counts_from_batch_zero() -> None:
    g = gate(batches=1, baseline=None)
    assert see(g, SPAWNED + 5, progress(SPAWNED + 5, 0))[0] == PASS


def test_zero_batches_needs_only_a_started_healthy_query() -> None:
    g = gate(batches=0)
    assert see(g, SPAWNED + 5, progress(SPAWNED + 5, None, state="starting"))[0] == PASS


def test_failed_stalled_stopped_and_exited_fail_at_once() -> None:
    assert see(gate(), SPAWNED + 5, progress(SPAWNED + 5, 11), alive=False)[0] == FAIL
    failed = progress(SPAWNED + 5, 11, state="failed")
    failed["kpmon"]["error"] = "boom"
    assert see(gate(), SPAWNED + 6, failed) == (FAIL, "failed: boom")
    outcome, reason = see(gate(), SPAWNED + 100, progress(SPAWNED + 60, 11))
    assert outcome == FAIL and reason.startswith("stalled")
    assert see(gate(), SPAWNED + 6, progress(SPAWNED + 5, 11, state="stopped"))[0] == FAIL


def test_lag_must_come_down_before_the_timeout() -> None:
    g = gate(batches=1)
    assert see(g, SPAWNED + 10, progress(SPAWNED + 10, 11, lag=1000)) == (WAIT, "1/1 batches, lagging")
    assert see(g, SPAWNED + 20, progress(SPAWNED + 20, 12, lag=50))[0] == PASS
    stuck = gate(batches=1)
    see(stuck, SPAWNED + 10, progress(SPAWNED + 10, 11, lag=1000))
    outcome, reason = see(stuck, SPAWNED + 301, progress(SPAWNED + 300, 40, lag=900))
    assert outcome == FAIL and reason.startswith("still lagging after 300 s")


def test_too_few_batches_by_the_timeout() -> None:
    g = gate(batches=5)
    see(g, SPAWNED + 10, progress(SPAWNED + 10, 11))
    outcome, reason = see(g, SPAWNED + 301, progress(SPAWNED + 300, 12))
    assert outcome == FAIL and reason.startswith("only 2 of 5 batches within 300 s")
