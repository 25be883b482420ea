"""``checks.summaries.split_held``: which of a key's held routes go now, over plain values.

A route's order is its release key, ``(ts_ns, conn, seq)``; a summary's order is its run's first route's,
and its run ends at its release time at the latest. The whole-pipeline proofs (test_summaries.py,
test_staged.py) drive it through the stage; these pin its rule down where traffic rarely reaches.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from checks.summaries import split_held

Order = tuple[int, str, int]


def _split(routes: list[tuple[str, Order, bool, bool, int]]) -> tuple[list[str], list[str]]:
    """``routes``: (name, order, due, summary, release time)."""
    return split_held(
        [name for name, *_ in routes],
        [order for _, order, *_ in routes],
        [due for _, _, due, _, _ in routes],
        [summary for *_, summary, _ in routes],
        [at for *_, at in routes],
    )


def test_a_due_summary_waits_for_a_route_not_due_that_sorts_inside_its_run() -> None:
    # A request sent again sorts where it was sent and is released with its answer, after the run.
    summary = ("summary", (100, "a", 1), True, True, 200)
    resent = ("resent", (150, "b", 7), False, False, 300)
    assert _split([summary, resent]) == ([], ["summary", "resent"])
    # Once the answer is due too, both go, in release order: the shard sees the route inside the run.
    assert _split([summary, ("resent", (150, "b", 7), True, False, 300)]) == (["summary", "resent"], [])


def test_a_route_not_due_outside_the_run_holds_no_summary() -> None:
    summary = ("summary", (100, "a", 1), True, True, 200)
    before = ("before", (90, "b", 7), False, False, 300)
    after = ("after", (250, "b", 8), False, False, 300)
    assert _split([summary, before, after]) == (["summary"], ["before", "after"])


def test_a_summary_held_by_a_waiting_one_holds_what_sorts_after_its_own_start() -> None:
    waiting = ("waiting", (300, "a", 1), False, True, 400)
    overlapping = ("overlapping", (250, "b", 1), True, True, 350)
    inside = ("inside", (260, "c", 1), True, False, 260)
    earlier = ("earlier", (240, "c", 0), True, False, 240)
    # ``overlapping`` runs past ``waiting``'s start, so it waits; ``inside`` sorts inside its run and
    # must not reach the shard before it.
    assert _split([waiting, overlapping, inside, earlier]) == (
        ["earlier"],
        ["waiting", "overlapping", "inside"],
    )


ORDERS = st.tuples(st.integers(0, 40), st.sampled_from("ab"), st.integers(0, 3))


@st.composite
def held_routes(draw: Any) -> list[tuple[str, Order, bool, bool, int]]:
    routes = []
    for index in range(draw(st.integers(0, 8))):
        order = draw(ORDERS)
        summary = draw(st.booleans())
        at = order[0] + draw(st.integers(0, 15)) if summary else order[0] + draw(st.integers(0, 3))
        routes.append((f"r{index}", order, draw(st.booleans()), summary, at))
    return routes


def _end(route: tuple[str, Order, bool, bool, int]) -> Order:
    _, order, _, summary, at = route
    return (at + 1, "", 0) if summary else order


@given(held_routes())
def test_what_goes_never_passes_what_waits_inside_a_run(
    routes: list[tuple[str, Order, bool, bool, int]],
) -> None:
    going, waiting = _split(routes)
    by_name = {route[0]: route for route in routes}
    assert sorted(going + waiting) == sorted(by_name)
    assert waiting == [name for name in by_name if name not in going]  # held's order
    gone = [by_name[name] for name in going]
    assert [r[1] for r in gone] == sorted(r[1] for r in gone)  # release order
    assert all(r[2] for r in gone)  # only due routes go
    for g in gone:
        for w in (by_name[name] for name in waiting):
            if w[3]:
                # A waiting summary's run starts after everything that went has ended.
                assert _end(g) < w[1]
            if g[3]:
                # Nothing that waits sorts inside a run that went.
                assert not g[1] < w[1] < _end(g)


@given(held_routes())
def test_everything_goes_once_everything_is_due(routes: list[tuple[str, Order, bool, bool, int]]) -> None:
    due = [(name, order, True, summary, at) for name, order, _, summary, at in routes]
    going, waiting = _split(due)
    assert waiting == [] and sorted(going) == sorted(r[0] for r in routes)
