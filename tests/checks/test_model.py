"""checks.model: findings as dicts; and the shared-values pool rules keep equal state values in
(``checks.rule.SharedValues``)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from checks.model import Finding, Severity
from checks.rule import SharedValues


def test_equal_values_are_held_once_per_key() -> None:
    pool: SharedValues[tuple[int, str], list[str]] = SharedValues()
    first = pool.get((1, "orders"), ["orders"])
    again = pool.get((1, "orders"), ["orders"])
    other = pool.get((2, "orders"), ["orders"])
    assert first is again and first == other == ["orders"] and first is not other


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


@given(
    st.builds(
        Finding,
        rule=st.sampled_from(["producer.sequence_gap", "tap.gap", "envelope.inner_flex.header_version"]),
        severity=st.sampled_from(list(Severity)),
        subject=st.text(max_size=20),
        summary=st.text(max_size=40),
        ts_ns=st.integers(min_value=0, max_value=2**63 - 1),
        evidence=st.fixed_dictionaries(
            {},
            optional={
                "offsets": st.lists(
                    st.lists(st.integers(0, 2**40), min_size=2, max_size=2), min_size=1, max_size=2
                ),
                "conn": st.text(max_size=8),
                "seq": st.integers(0, 2**40),
                "fields": st.dictionaries(
                    st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3
                ),
            },
        ),
        incomplete=st.booleans(),
    )
)
def test_a_finding_reads_back_from_its_dict(finding: Finding) -> None:
    """The job's stage rows carry findings as ``to_dict`` JSON; ``from_dict`` is their one reader."""
    back = Finding.from_dict(json.loads(json.dumps(finding.to_dict())))
    assert back == finding and back.id == finding.id
