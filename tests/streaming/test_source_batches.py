"""The routing stage is handed Arrow batches of at most ``stream.source_batch_records`` records, by a
real Spark session with the properties the job sets (``streaming.session.spark_conf``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from kpconfig.model import KpmonConfig
from streaming.session import spark_conf

ARROW = "spark.sql.execution.arrow."


def _sizes(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"size": [batch.num_rows]})


def test_map_in_arrow_gets_batches_of_the_configured_records(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import SparkSession

    # Spark's launcher picks a local worker's interpreter from the environment (as the job's does).
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    config = KpmonConfig.model_validate({"stream": {"source_batch_records": 7}})
    builder: Any = SparkSession.builder.master("local[1]").appName("kpmon-source-batches")
    for key, value in spark_conf(config, []).items():
        builder = builder.config(key, value)
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    try:
        sizes = spark.range(0, 20, numPartitions=1).mapInArrow(_sizes, "size long").collect()
    finally:
        spark.stop()
    assert sorted(row.size for row in sizes) == [6, 7, 7]


def test_the_bytes_bound_goes_with_the_records_bound() -> None:
    conf = spark_conf(KpmonConfig(), [])
    assert conf[ARROW + "maxRecordsPerBatch"] == "50000"
    assert int(conf[ARROW + "maxBytesPerBatch"]) == KpmonConfig().stream.source_batch_bytes
