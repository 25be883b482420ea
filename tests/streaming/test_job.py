"""The query's pure parts: which shuffle partition a bucket's grouping value lands in."""

from __future__ import annotations

from collections import Counter

import pytest

from streaming.job import bucket_labels, spark_int_partition

VALUES = [0, 1, 2, 3, 7, 8, 15, 16, 42, 99, 1000, 12345, -1, -7, 2**31 - 1]
#: ``pmod(hash(v), n)`` for VALUES as Spark 4.2.0 computed it (``F.pmod(F.hash("v"), F.lit(n))`` on an
#: int column; ``repartition(n, "v")`` placed rows the same way).
SPARK = {
    2: [1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1],
    3: [0, 1, 0, 0, 0, 0, 2, 2, 1, 1, 1, 2, 2, 1, 1],
    4: [3, 3, 2, 3, 3, 3, 1, 1, 1, 1, 1, 0, 1, 3, 3],
    7: [1, 2, 5, 4, 2, 1, 4, 2, 0, 4, 2, 6, 3, 1, 4],
}


@pytest.mark.parametrize("partitions", sorted(SPARK))
def test_the_partition_of_an_int_is_sparks(partitions: int) -> None:
    assert [spark_int_partition(v, partitions) for v in VALUES] == SPARK[partitions]


def test_grouping_by_the_bucket_number_left_partitions_unequal() -> None:
    """Why the labels exist: the job's defaults and the benchmark's settings, grouped by number."""
    assert sorted(Counter(spark_int_partition(b, 2) for b in range(8)).values()) == [3, 5]
    assert sorted(Counter(spark_int_partition(b, 4) for b in range(16)).values()) == [3, 3, 4, 6]


@pytest.mark.parametrize(("buckets", "partitions"), [(8, 2), (16, 4), (7, 3), (1, 1), (64, 16), (3, 5)])
def test_every_partition_gets_the_same_number_of_buckets(buckets: int, partitions: int) -> None:
    labels = bucket_labels(buckets, partitions)
    assert len(set(labels)) == buckets and min(labels) >= 0  # -1 is stage two's pass-through bucket
    assert [spark_int_partition(label, partitions) for label in labels] == [
        b % partitions for b in range(buckets)
    ]
    per_partition = Counter(spark_int_partition(label, partitions) for label in labels)
    assert max(per_partition.values()) - min(per_partition.values()) <= 1
    assert bucket_labels(buckets, partitions) == labels  # a restart finds the same labels
