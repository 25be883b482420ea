"""The SparkSession the job runs in: RocksDB state, Avro state encoding, the pinned Kafka connector."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from kpconfig.model import KpmonConfig
from streaming.paths import StreamPaths

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Spark's checkpoint files through Hadoop's FileSystem API, for a checkpoint on a local disk (see spark_conf).
FILE_SYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def is_local_path(path: str) -> bool:
    """A plain path or a ``file:`` URI (not ``hdfs://``, ``s3a://``, ...)."""
    return urlparse(path).scheme in ("", "file")


def spark_conf(config: KpmonConfig, connector_jars: list[str], submitted: bool = False) -> dict[str, str]:
    """Every Spark property the job sets; ``stream.spark_conf`` overrides any of them."""
    conf = {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        # transformWithState requires RocksDB; changelog checkpointing uploads only the changes per batch.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Avro state rows can gain columns between releases; the default UnsafeRow encoding cannot.
        "spark.sql.streaming.stateStore.encodingFormat": "avro",
        "spark.sql.shuffle.partitions": str(config.stream.shuffle_partitions),
        "spark.sql.streaming.stopTimeout": str(int(config.stream.stop_timeout_seconds * 1000)),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
    }
    if is_local_path(StreamPaths.of(config).checkpoint(config)):
        # Spark's default writes checkpoint files through Hadoop's FileContext, whose rename asks for the
        # file's link status, and on a local disk that forks `readlink` from the JVM: for every offsets and
        # commits entry and every state store's changelog, each batch. Measured here: 0.2-0.8 s of each
        # stateful operator's commit (2.5 s under load) fell to 15-180 ms, and the offsets log's writes with
        # it. The FileSystem API renames with rename(2), which is atomic on a local file system.
        conf["spark.sql.streaming.checkpointFileManagerClass"] = FILE_SYSTEM_CHECKPOINTS
    if not submitted:
        # Python workers must import the project and its dependencies: the job's own interpreter.
        python = os.environ.get("PYSPARK_PYTHON", sys.executable)
        conf["spark.pyspark.python"] = python
        conf["spark.pyspark.driver.python"] = sys.executable
        conf["spark.executorEnv.PYSPARK_PYTHON"] = python
    if connector_jars:
        conf["spark.jars"] = ",".join(connector_jars)
    conf.update(config.stream.spark_conf)
    return conf


def build_session(config: KpmonConfig, app_name: str = "kpmon-stream") -> SparkSession:
    from pyspark.sql import SparkSession

    from streaming.connector import connector_jars

    # Under spark-submit (deploy/spark) the gateway already exists: the launcher chose the master and
    # shipped the connector and the Python environment; setting them again here would override it.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if not submitted:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    shipped = (
        submitted
        or "spark.jars" in config.stream.spark_conf
        or "spark.jars.packages" in config.stream.spark_conf
    )
    jars = [] if shipped else [str(j) for j in connector_jars()]
    builder = SparkSession.builder.appName(app_name)
    if config.stream.master and not submitted:
        builder = builder.master(config.stream.master)
    for key, value in spark_conf(config, jars, submitted).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    quiet_state_server(spark)
    return spark


#: Logs a WARN line for every map-state lookup of a key that is not there yet. The stateful stage looks
#: up each connection and entity key it meets, so every new connection would cost a log line.
STATE_SERVER_LOGGER = "org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkStateServer"


def quiet_state_server(spark: SparkSession) -> None:
    """Raise the state server's log level to ERROR in this JVM (local mode runs the executors here; on a
    cluster, the executors' log4j2 configuration does it: docs/cluster-mode.md)."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        log4j = jvm.org.apache.logging.log4j
        log4j.core.config.Configurator.setLevel(STATE_SERVER_LOGGER, log4j.Level.ERROR)
    except Exception:  # logging only: never fail a start for it
        pass
