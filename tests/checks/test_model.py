"""checks.model: the shared-values pool rules keep equal state values in."""

from __future__ import annotations

from checks.model import SharedValues


def test_equal_values_are_held_once_and_made_once() -> None:
    pool: SharedValues[tuple[int, str], list[str]] = SharedValues()
    made: list[tuple[int, str]] = []

    def make(key: tuple[int, str]) -> list[str]:
        made.append(key)
        return [key[1]]

    first = pool.get((1, "orders"), lambda: make((1, "orders")))
    again = pool.get((1, "orders"), lambda: make((1, "orders")))
    other = pool.get((2, "orders"), lambda: make((2, "orders")))
    assert first is again and first == other == ["orders"] and first is not other
    assert made == [(1, "orders"), (2, "orders")]


def test_share_returns_the_equal_value_held_first() -> None:
    pool: SharedValues[str, str] = SharedValues()
    a = "".join(["librdkafka/", "2.6.0"])
    b = "".join(["librdkafka/", "2.6.0"])
    assert a is not b
    assert pool.share(a) is a and pool.share(b) is a


def test_the_pool_is_bounded_and_starts_afresh_when_full() -> None:
    pool: SharedValues[str, str] = SharedValues(limit=2)
    first = pool.share("".join(["a", "1"]))
    pool.share("b1")
    assert len(pool) == 2
    pool.share("c1")
    assert len(pool) == 1
    # "a1" was forgotten: an equal string is held anew, while ``first`` stays valid where it is held.
    fresh = "".join(["a", "1"])
    assert pool.share(fresh) is fresh and first == "a1" and len(pool) == 2
