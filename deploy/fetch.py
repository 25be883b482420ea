"""Fetch pinned Kafka jars from Maven Central once, with Maven, into the kpmon cache.

``python -m deploy.fetch`` is idempotent: a jar already in the cache is not fetched again.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from deploy.versions import KAFKA_RELEASES
from kpmon.paths import cache_dir


class FetchError(RuntimeError):
    """A download that Maven could not complete."""


def clients_jar(version: str) -> Path:
    """Path of the cached ``kafka-clients`` jar for ``version`` (not necessarily present)."""
    return cache_dir() / "jars" / f"kafka-clients-{version}.jar"


def _mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchError("Maven (mvn) is not on PATH; install it (apt-get install maven) and retry")
    return mvn


def fetch_clients_jar(version: str) -> Path:
    """Copy ``org.apache.kafka:kafka-clients:<version>`` from Maven Central into the cache."""
    target = clients_jar(version)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        _mvn(),
        "-q",
        "-B",
        "dependency:copy",
        f"-Dartifact=org.apache.kafka:kafka-clients:{version}",
        f"-DoutputDirectory={target.parent}",
    ]
    print(f"kpmon: fetching kafka-clients {version} from Maven Central", file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not target.is_file():
        raise FetchError(f"mvn failed to fetch kafka-clients {version}:\n{done.stdout}{done.stderr}")
    return target


def fetch_all() -> None:
    for version in KAFKA_RELEASES:
        fetch_clients_jar(version)
    from streaming.connector import fetch_connector

    fetch_connector()
    # The broker distributions for the local stack are fetched by deploy.local (see its module).
    try:
        from deploy.local import distribution  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return
    for version in KAFKA_RELEASES:
        distribution.fetch_distribution(version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args(argv)
    try:
        fetch_all()
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
