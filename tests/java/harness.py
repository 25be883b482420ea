"""Build and run the Java side of the tests: ``KpmonDiff`` (decodes frames with Kafka's own generated
message classes), ``KpmonClient`` (a real Java client that connects to a socket) and ``KpmonMatrix``
(the Java producers and consumers of the real-client matrix, tests/checks/test_client_matrix.py), and
``KpmonStreams`` (a Kafka Streams app, ``tests/java/streams/``: compiled on its own against the pinned
kafka-streams jar and the kafka-clients it is built with, ``deploy.versions.KAFKA_STREAMS``).

The harness is compiled with ``javac`` against one pinned kafka-clients jar at a time, into
``tests/java/build/<kafka version>/`` (gitignored). Its runtime dependencies (Jackson for the generated
``*JsonConverter`` classes, slf4j) come from ``tests/java/pom.xml`` via Maven, cached under
``$KPMON_HOME/cache/java-deps``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from deploy.fetch import fetch_clients_jar, fetch_streams_jars
from deploy.versions import KAFKA_STREAMS
from kpconfig.paths import cache_dir

HERE = Path(__file__).resolve().parent
SOURCES = sorted((HERE / "src" / "main" / "java").rglob("*.java"))
STREAMS_SOURCES = sorted((HERE / "streams").rglob("*.java"))
BUILD = HERE / "build"


class JavaUnavailable(RuntimeError):
    """No JDK or Maven on this machine, or the pinned jars could not be fetched."""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise JavaUnavailable(f"{name} is not on PATH")
    return path


def dependency_jars() -> list[Path]:
    """Jackson and slf4j jars, copied once from Maven Central into the cache."""
    target = cache_dir() / "java-deps"
    stamp = target / ".complete"
    if not stamp.is_file():
        target.mkdir(parents=True, exist_ok=True)
        cmd = [
            _tool("mvn"),
            "-q",
            "-B",
            "-f",
            str(HERE / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={target}",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise JavaUnavailable(
                f"mvn could not fetch the harness dependencies:\n{done.stdout}{done.stderr}"
            )
        stamp.touch()
    return sorted(target.glob("*.jar"))


def classpath(kafka_version: str) -> str:
    """Class path with the compiled harness for ``kafka_version`` (compiling it when out of date)."""
    _tool("java")
    try:
        clients = fetch_clients_jar(kafka_version)
    except Exception as exc:  # FetchError, or Maven missing
        raise JavaUnavailable(str(exc)) from exc
    return _compiled(BUILD / kafka_version, SOURCES, [clients, *dependency_jars()])


def _compiled(out: Path, sources: list[Path], libs: list[Path]) -> str:
    """``sources`` compiled into ``out`` against ``libs`` when out of date; the class path to run them."""
    javac = _tool("javac")
    newest_source = max(p.stat().st_mtime for p in sources)
    stamp = out / ".built"
    if not stamp.is_file() or stamp.stat().st_mtime < newest_source:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        cmd = [javac, "-nowarn", "-d", str(out), "-cp", os.pathsep.join(map(str, libs)), *map(str, sources)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"javac failed for {out.name}:\n{done.stderr}")
        stamp.touch()
    return os.pathsep.join([str(out), *map(str, libs)])


def streams_command(*args: str) -> list[str]:
    """The command that runs KpmonStreams (kafka-streams ``KAFKA_STREAMS``) with ``args``."""
    java = _tool("java")
    try:
        jars = fetch_streams_jars()
    except Exception as exc:  # FetchError, or Maven missing
        raise JavaUnavailable(str(exc)) from exc
    cp = _compiled(BUILD / f"streams-{KAFKA_STREAMS}", STREAMS_SOURCES, [*jars, *dependency_jars()])
    return [java, "-cp", cp, "kpmon.KpmonStreams", *args]


def run_diff(kafka_version: str, lines: Iterable[str], timeout: float = 120) -> list[str]:
    """Feed ``kind api_key api_version hex`` lines to one KpmonDiff JVM; its output lines, in order."""
    java = _tool("java")
    cmd = [java, "-Xss4m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classpath(kafka_version)]
    data = "".join(line + "\n" for line in lines)
    done = subprocess.run(
        [*cmd, "kpmon.KpmonDiff"], input=data, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"KpmonDiff exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout.splitlines()


def main_command(kafka_version: str, main_class: str, *args: str) -> list[str]:
    """The command that runs ``main_class`` of the harness (compiled against ``kafka_version``)."""
    return [_tool("java"), "-cp", classpath(kafka_version), main_class, *args]


def client_command(kafka_version: str, *args: str) -> list[str]:
    """The command that runs KpmonClient (a Java admin client) with ``args``."""
    return main_command(kafka_version, "kpmon.KpmonClient", *args)
