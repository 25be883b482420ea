"""Request pacing: a token bucket for the receiver's rate limit, exponential backoff with jitter for retries.

Both take the time as an argument, so tests drive them with a fake clock.
"""

from __future__ import annotations

import random

#: A refill computed for the time ``ready_at`` gave can fall short of a whole token by a rounding error;
#: without this slack ``take`` would refuse at the very time ``ready_at`` promised, forever.
_EPSILON = 1e-9


class TokenBucket:
    """``rate`` requests per second on average, at most ``burst`` at once. ``rate=None`` never limits."""

    def __init__(self, rate: float | None, burst: int = 1) -> None:
        self.rate = rate
        self.burst = float(max(1, burst))
        self.tokens = self.burst
        self.updated: float | None = None

    def _refill(self, now: float) -> None:
        if self.rate is None:
            return
        if self.updated is not None and now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        if self.updated is None or now > self.updated:
            self.updated = now

    def ready_at(self, now: float) -> float:
        """When one token will be available (``now`` if it already is)."""
        if self.rate is None:
            return now
        self._refill(now)
        return now if self.tokens >= 1 - _EPSILON else now + (1 - self.tokens) / self.rate

    def take(self, now: float) -> bool:
        if self.rate is None:
            return True
        self._refill(now)
        if self.tokens < 1 - _EPSILON:
            return False
        self.tokens = max(0.0, self.tokens - 1)
        return True


def backoff_delay(
    failures: int,
    *,
    initial: float,
    maximum: float,
    multiplier: float = 2.0,
    jitter: float = 0.5,
    rng: random.Random | None = None,
) -> float:
    """Delay before the next attempt after ``failures`` consecutive failures (``failures >= 1``).

    ``initial * multiplier**(failures-1)``, capped at ``maximum``, then reduced by a random fraction of up
    to ``jitter`` so that hooks failing together (one receiver behind them all) do not retry in lockstep.
    """
    if failures < 1:
        return 0.0
    # Cap the exponent first: multiplier**failures overflows a float after ~1000 failures at 2.0.
    exponent = min(failures - 1, 64)
    delay = min(maximum, initial * multiplier**exponent)
    draw = (rng or random).random()
    return delay * (1.0 - jitter * draw)
