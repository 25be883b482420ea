"""Spark's Kafka connector (``spark-sql-kafka-0-10``), pinned to the installed pyspark, cached once.

Maven resolves it from Maven Central into ``$KPMON_HOME/cache/spark-kafka-<version>/``; jars that pyspark
already ships (Scala, Hadoop client, compression codecs) are left out so the classpath has one copy of
each. The job then passes the directory's jars as ``spark.jars``: a second start needs no network.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from kpconfig.mvn import copy_dependencies, mvn
from kpconfig.paths import cache_dir

POM = Path(__file__).resolve().parent.parent / "deploy" / "spark" / "connector-pom.xml"


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def _artifact(jar: Path) -> str:
    """``kafka-clients-3.9.2.jar`` → ``kafka-clients`` (the name without its version)."""
    name, _, version = jar.stem.rpartition("-")
    return name if name and version[:1].isdigit() else jar.stem


def connector_dir(version: str | None = None) -> Path:
    return cache_dir() / f"spark-kafka-{version or spark_version()}"


def connector_jars(version: str | None = None) -> list[Path]:
    """The cached connector jars, fetching them first if needed."""
    target = connector_dir(version)
    marker = target / ".complete"
    if not marker.exists():
        fetch_connector(version)
    return sorted(target.glob("*.jar"))


def fetch_connector(version: str | None = None) -> Path:
    version = version or spark_version()
    target = connector_dir(version)
    if (target / ".complete").exists():
        return target
    mvn()  # no Maven: say so before touching the cache
    staging = target.with_suffix(".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    print(f"kpmon: fetching spark-sql-kafka-0-10 {version} from Maven Central", file=sys.stderr)
    copy_dependencies(
        POM,
        [f"-Dspark.version={version}"],
        staging,
        f"mvn could not resolve spark-sql-kafka-0-10_2.13:{version} (is it on Maven Central?)",
    )
    import pyspark

    shipped = {_artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    target.mkdir(parents=True, exist_ok=True)
    for jar in staging.glob("*.jar"):
        if _artifact(jar) not in shipped:
            shutil.copy2(jar, target / jar.name)
    shutil.rmtree(staging, ignore_errors=True)
    (target / ".complete").write_text(version + "\n")
    return target
