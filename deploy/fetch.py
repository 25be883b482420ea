"""Fetch pinned jars from Maven Central once, with Maven, into the kpmon cache: Kafka's, Spark's Kafka
connector, and the Hadoop ResourceManager and NodeManager of the local YARN cluster (deploy/yarn.py).

``python -m deploy.fetch`` is idempotent: a jar already in the cache is not fetched again.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from deploy.local.distribution import fetch_distribution
from deploy.versions import KAFKA_RELEASES, KAFKA_STREAMS
from deploy.yarn import fetch_yarn
from kpconfig.mvn import FetchError, mvn
from kpconfig.paths import cache_dir
from streaming.connector import fetch_connector


def jar_path(artifact: str, version: str) -> Path:
    """Path of the cached ``org.apache.kafka:<artifact>`` jar for ``version`` (not necessarily present)."""
    return cache_dir() / "jars" / f"{artifact}-{version}.jar"


def clients_jar(version: str) -> Path:
    """Path of the cached ``kafka-clients`` jar for ``version`` (not necessarily present)."""
    return jar_path("kafka-clients", version)


def fetch_jar(artifact: str, version: str) -> Path:
    """Copy ``org.apache.kafka:<artifact>:<version>`` (the jar alone) from Maven Central into the cache."""
    target = jar_path(artifact, version)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        mvn(),
        "-q",
        "-B",
        "dependency:copy",
        f"-Dartifact=org.apache.kafka:{artifact}:{version}",
        f"-DoutputDirectory={target.parent}",
    ]
    print(f"kpmon: fetching {artifact} {version} from Maven Central", file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not target.is_file():
        raise FetchError(f"mvn failed to fetch {artifact} {version}:\n{done.stdout}{done.stderr}")
    return target


def fetch_clients_jar(version: str) -> Path:
    """Copy ``org.apache.kafka:kafka-clients:<version>`` from Maven Central into the cache."""
    return fetch_jar("kafka-clients", version)


def clients_jars() -> list[Path]:
    """The kafka-clients jar of every pinned release (``KAFKA_RELEASES``), fetched when missing: the
    input of ``python -m codec.generator``."""
    return [fetch_clients_jar(version) for version in KAFKA_RELEASES]


def fetch_streams_jars() -> list[Path]:
    """kafka-streams (``KAFKA_STREAMS``) and the kafka-clients it is built with."""
    return [fetch_jar("kafka-streams", KAFKA_STREAMS), fetch_clients_jar(KAFKA_STREAMS)]


def fetch_all() -> None:
    clients_jars()
    fetch_streams_jars()
    fetch_connector()
    for version in KAFKA_RELEASES:
        fetch_distribution(version)
    fetch_yarn()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--clients-jars",
        action="store_true",
        help="fetch only the pinned releases' kafka-clients jars and print their paths, one a line "
        "(the input of python -m codec.generator)",
    )
    args = parser.parse_args(argv)
    try:
        if args.clients_jars:
            print("\n".join(str(jar) for jar in clients_jars()))
            return 0
        fetch_all()
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
