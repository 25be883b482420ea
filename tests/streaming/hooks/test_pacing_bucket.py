"""The token bucket keeps the promise ``ready_at`` makes, whatever rounding the refill does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streaming.hooks.pacing import TokenBucket


@given(
    st.floats(min_value=0.1, max_value=50.0), st.lists(st.floats(min_value=0.0, max_value=1e-3), max_size=5)
)
def test_a_token_is_there_when_ready_at_says(rate: float, ticks: list[float]) -> None:
    bucket = TokenBucket(rate)
    now = 0.0
    assert bucket.take(now)
    for tick in ticks:
        now += tick
        bucket.take(now)
    ready = bucket.ready_at(now)
    assert bucket.take(ready)


def test_the_failing_case_hypothesis_found() -> None:
    # An alert escalated while in flight never went out: take() refused at the time ready_at() gave.
    bucket = TokenBucket(2.0)
    now = 0.0005866151340195012
    assert bucket.take(now)
    now += 0.0005866151340195012
    assert bucket.take(bucket.ready_at(now))
