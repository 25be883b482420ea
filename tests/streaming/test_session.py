"""The Spark properties the job sets (streaming.session.spark_conf), without starting Spark."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from kpconfig.model import KpmonConfig
from streaming.session import FILE_SYSTEM_CHECKPOINTS, is_local_path, spark_conf

MANAGER = "spark.sql.streaming.checkpointFileManagerClass"


def _with_checkpoint(checkpoint_dir: str | None, **spark: str) -> KpmonConfig:
    config = KpmonConfig()
    stream = config.stream.model_copy(update={"checkpoint_dir": checkpoint_dir, "spark_conf": spark})
    return config.model_copy(update={"stream": stream})


@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("/var/lib/kpmon/checkpoint", True),
        ("relative/checkpoint", True),
        ("file:///var/lib/kpmon/checkpoint", True),
        ("hdfs:///kpmon/checkpoint", False),
        ("s3a://bucket/kpmon", False),
        ("abfss://c@account.dfs.core.windows.net/kpmon", False),
    ],
)
def test_is_local_path(path: str, local: bool) -> None:
    assert is_local_path(path) is local


def test_a_local_checkpoint_is_written_through_the_file_system_api() -> None:
    assert spark_conf(_with_checkpoint(None), [])[MANAGER] == FILE_SYSTEM_CHECKPOINTS
    assert spark_conf(_with_checkpoint("file:///tmp/cp"), [])[MANAGER] == FILE_SYSTEM_CHECKPOINTS


def test_a_distributed_checkpoint_keeps_sparks_default_manager() -> None:
    # FileContext gives HDFS an atomic rename-with-overwrite; object stores have their own managers.
    assert MANAGER not in spark_conf(_with_checkpoint("hdfs:///kpmon/cp"), [])


def test_stream_spark_conf_overrides_the_manager() -> None:
    conf = spark_conf(_with_checkpoint(None, **{MANAGER: "com.example.Manager"}), [])
    assert conf[MANAGER] == "com.example.Manager"


def test_the_manager_class_is_in_the_pinned_spark() -> None:
    # Spark moved its checkpoint managers between packages before; a renamed class would fail every start.
    pyspark = pytest.importorskip("pyspark")
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-sql_*.jar"))
    assert jars, "pyspark ships its jars"
    entry = FILE_SYSTEM_CHECKPOINTS.replace(".", "/") + ".class"
    with zipfile.ZipFile(jars[0]) as jar:
        assert entry in jar.namelist()
