from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.hooks.pacing import TokenBucket, backoff_delay


def test_token_bucket_paces_and_bursts() -> None:
    bucket = TokenBucket(2.0, burst=2)
    assert bucket.take(0.0) and bucket.take(0.0) and not bucket.take(0.0)
    assert bucket.ready_at(0.0) == pytest.approx(0.5)
    assert not bucket.take(0.4) and bucket.take(0.5)
    # Idle time refills only up to the burst.
    assert bucket.take(100.0) and bucket.take(100.0) and not bucket.take(100.0)


def test_unlimited_bucket() -> None:
    bucket = TokenBucket(None)
    assert all(bucket.take(0.0) for _ in range(1000)) and bucket.ready_at(5.0) == 5.0


def test_clock_going_backwards_does_not_mint_tokens() -> None:
    bucket = TokenBucket(1.0)
    assert bucket.take(10.0)
    assert not bucket.take(5.0) and not bucket.take(10.5)
    assert bucket.take(11.0)


@settings(deadline=None)
@given(
    st.integers(min_value=1, max_value=10_000),
    st.floats(min_value=0.001, max_value=10.0),
    st.floats(min_value=10.0, max_value=3600.0),
    st.floats(min_value=1.0, max_value=10.0),
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=0, max_value=2**32),
)
def test_backoff_bounds(
    failures: int, initial: float, maximum: float, multiplier: float, jitter: float, seed: int
) -> None:
    delay = backoff_delay(
        failures,
        initial=initial,
        maximum=maximum,
        multiplier=multiplier,
        jitter=jitter,
        rng=random.Random(seed),
    )
    full = min(maximum, initial * multiplier ** min(failures - 1, 64))
    assert full * (1 - jitter) - 1e-9 <= delay <= full + 1e-9


def test_backoff_sequence_without_jitter() -> None:
    delays = [backoff_delay(n, initial=0.5, maximum=4.0, jitter=0.0) for n in range(0, 7)]
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_jitter_spreads_retries() -> None:
    rng = random.Random(3)
    draws = {round(backoff_delay(5, initial=1.0, maximum=60.0, jitter=0.5, rng=rng), 6) for _ in range(50)}
    assert len(draws) > 40 and min(draws) >= 8.0 and max(draws) <= 16.0
