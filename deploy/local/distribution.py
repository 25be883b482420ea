"""Apache Kafka broker jars from Maven Central, resolved once with Maven into the kpmon cache.

Release archives are not on Maven Central, so a "distribution" here is just ``libs/`` (the broker, its
runtime dependencies, ``kafka-tools`` and a logging binding) resolved by ``deploy/maven/pom.xml``. It is
launched with ``java -cp 'libs/*' kafka.Kafka``; there are no shell scripts.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from kpconfig.mvn import copy_dependencies, mvn
from kpconfig.paths import cache_dir

POM = Path(__file__).resolve().parent.parent / "maven" / "pom.xml"
LOGGING_DIR = Path(__file__).resolve().parent / "logging"


@dataclass(frozen=True)
class _Binding:
    group: str
    artifact: str
    version: str


#: 3.x brokers log through reload4j; 4.x through log4j2. Both bind slf4j-api 1.7, which the broker pom
#: pins, so the binding has to be a 1.7-style one (log4j-slf4j2-impl would be silently ignored).
_RELOAD4J = _Binding("org.slf4j", "slf4j-reload4j", "1.7.36")
_LOG4J2 = _Binding("org.apache.logging.log4j", "log4j-slf4j-impl", "2.24.3")

#: kafka-tools is not published on Maven Central for every broker release (4.4.0 is missing as of
#: 2026-11). Its 4.3.1 jar does not run against 4.4.0's clients (classes moved), so such a release's
#: tools run from the whole fallback distribution; the tools speak the wire protocol to any broker.
_TOOLS_VERSION = {"4.4.0": "4.3.1"}


def tools_version(version: str) -> str:
    """The release whose ``libs/`` runs the command-line tools for a ``version`` broker."""
    return _TOOLS_VERSION.get(version, version)


def major(version: str) -> int:
    return int(version.split(".", 1)[0])


def distribution_dir(version: str) -> Path:
    return cache_dir() / f"kafka-{version}"


def libs_dir(version: str) -> Path:
    return distribution_dir(version) / "libs"


def is_fetched(version: str) -> bool:
    return (distribution_dir(version) / ".complete").exists()


def logging_jvm_args(version: str, level: str) -> list[str]:
    """System properties that point the release's logging backend at our config (stderr, ``level``)."""
    if major(version) >= 4:
        config = f"-Dlog4j2.configurationFile={LOGGING_DIR / 'log4j2.properties'}"
    else:
        config = f"-Dlog4j.configuration={(LOGGING_DIR / 'log4j.properties').as_uri()}"
    return [config, f"-Dkpmon.log.level={level}"]


def fetch_distribution(version: str) -> Path:
    """Resolve Kafka ``version``'s broker jars into the cache (once) and return its directory.

    The directory holds ``libs/*.jar``. A partial download is staged elsewhere and only renamed into
    place when Maven succeeded, so an interrupted fetch is retried rather than half-used.
    """
    target = distribution_dir(version)
    if is_fetched(version) and is_fetched(tools_version(version)):
        return target
    if is_fetched(version):
        fetch_distribution(tools_version(version))
        return target
    mvn()  # no Maven: say so before touching the cache
    binding = _LOG4J2 if major(version) >= 4 else _RELOAD4J
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    print(f"kpmon: fetching Kafka {version} broker jars from Maven Central (once)", file=sys.stderr)
    copy_dependencies(
        POM,
        [
            f"-Dkafka.version={version}",
            f"-Dkafka.tools.version={tools_version(version)}",
            # A fallback kafka-tools jar would shadow nothing but crash with the newer clients: leave it out.
            *(["-DexcludeArtifactIds=kafka-tools"] if tools_version(version) != version else []),
            f"-Dlogging.groupId={binding.group}",
            f"-Dlogging.artifactId={binding.artifact}",
            f"-Dlogging.version={binding.version}",
        ],
        staging / "libs",
        f"mvn could not resolve Kafka {version} (org.apache.kafka:kafka_2.13) from Maven Central",
        wanted=staging / "libs" / f"kafka_2.13-{version}.jar",
        discard=staging,
    )
    (staging / ".complete").write_text(version + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    print(f"kpmon: Kafka {version} cached in {target}", file=sys.stderr)
    if tools_version(version) != version:
        fetch_distribution(tools_version(version))
    return target
