"""A real YARN cluster on loopback: one ResourceManager and one NodeManager, from Maven Central's jars.

``fetch_yarn`` resolves the pinned Hadoop release's ResourceManager and NodeManager (with
``deploy/maven/yarn-pom.xml``) into the kpmon cache once, as the Kafka jars are; ``make setup`` runs it.
``LocalYarn`` writes a Hadoop configuration directory (the ``HADOOP_CONF_DIR`` that spark-submit and
the job control read), starts the two daemons as JVMs of their own and stops them. Containers run
as local processes of this machine's user (the default container executor), on this machine's disk,
which stands in for the mount shared by the NodeManagers and the Airflow workers.

``python -m deploy.yarn --home DIR`` runs one in the foreground until interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from deploy.local.process import find_java, free_ports, is_alive, terminate
from deploy.versions import HADOOP_YARN
from kpconfig.mvn import FetchError, copy_dependencies
from kpconfig.paths import cache_dir

POM = Path(__file__).resolve().parent / "maven" / "yarn-pom.xml"
RESOURCE_MANAGER = "org.apache.hadoop.yarn.server.resourcemanager.ResourceManager"
NODE_MANAGER = "org.apache.hadoop.yarn.server.nodemanager.NodeManager"
#: Hadoop 3.4's daemons reflect into the JDK (Guice, Jersey 1, the shell helpers); Java 17 needs them
#: opened, as Hadoop's own scripts do.
JVM_OPTS = [
    "-Xms64m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    *(
        f"--add-opens=java.base/{package}=ALL-UNNAMED"
        for package in (
            "java.lang",
            "java.lang.reflect",
            "java.io",
            "java.net",
            "java.nio",
            "java.util",
            "java.util.concurrent",
            "sun.nio.ch",
        )
    ),
]
LOG4J = """\
log4j.rootLogger=INFO,console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.target=System.err
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n
log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR
"""


class YarnError(RuntimeError):
    """The local YARN cluster could not start; the message says what its logs said."""


def yarn_dir(version: str = HADOOP_YARN) -> Path:
    return cache_dir() / f"hadoop-yarn-{version}"


def fetch_yarn(version: str = HADOOP_YARN) -> Path:
    """Resolve Hadoop ``version``'s ResourceManager and NodeManager jars into the cache (once).

    A partial download is staged elsewhere and renamed into place only when Maven succeeded.
    """
    target = yarn_dir(version)
    if (target / ".complete").exists():
        return target
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    print(f"kpmon: fetching Hadoop {version} ResourceManager and NodeManager from Maven Central (once)",
          file=sys.stderr)  # fmt: skip
    copy_dependencies(
        POM,
        [f"-Dhadoop.version={version}"],
        staging / "libs",
        f"mvn could not resolve Hadoop {version}'s ResourceManager and NodeManager from Maven Central",
        wanted=staging / "libs" / f"hadoop-yarn-server-resourcemanager-{version}.jar",
        discard=staging,
    )
    (staging / ".complete").write_text(version + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def site_xml(properties: dict[str, str]) -> str:
    body = "".join(
        f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
        for k, v in properties.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'


def java_home(java: str) -> str:
    """The JDK home of a ``java`` executable: NodeManagers start containers with ``$JAVA_HOME/bin/java``."""
    return str(Path(os.path.realpath(java)).parent.parent)


@dataclass
class LocalYarn:
    """A ResourceManager and a NodeManager under ``home``: ``conf/`` is the ``HADOOP_CONF_DIR``."""

    home: Path
    memory_mb: int = 6144
    vcores: int = 4
    version: str = HADOOP_YARN

    def __post_init__(self) -> None:
        self.home = self.home.resolve()
        self.conf_dir = self.home / "conf"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.web_port = 0

    @property
    def rest_url(self) -> str:
        """The ResourceManager's web address (``deploy.rest_url``)."""
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def container_logs(self) -> Path:
        """``<application>/<container>/{stdout,stderr}`` of every container, kept after it ends."""
        return self.home / "nm-logs"

    def configure(self) -> Path:
        rm, scheduler, tracker, admin, web, localizer = free_ports(6)
        self.web_port = web
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "core-site.xml").write_text(
            site_xml({"fs.defaultFS": "file:///", "hadoop.tmp.dir": str(self.home / "tmp")})
        )
        yarn = {
            "yarn.resourcemanager.hostname": "127.0.0.1",
            "yarn.resourcemanager.address": f"127.0.0.1:{rm}",
            "yarn.resourcemanager.scheduler.address": f"127.0.0.1:{scheduler}",
            "yarn.resourcemanager.resource-tracker.address": f"127.0.0.1:{tracker}",
            "yarn.resourcemanager.admin.address": f"127.0.0.1:{admin}",
            "yarn.resourcemanager.webapp.address": f"127.0.0.1:{web}",
            # First come, first served: no queues to configure, and no share of the cluster reserved
            # for application masters (the capacity scheduler's 10% would fit no Spark driver here).
            "yarn.resourcemanager.scheduler.class": (
                "org.apache.hadoop.yarn.server.resourcemanager.scheduler.fifo.FifoScheduler"
            ),
            "yarn.scheduler.minimum-allocation-mb": "128",
            "yarn.scheduler.maximum-allocation-mb": str(self.memory_mb),
            "yarn.nodemanager.hostname": "127.0.0.1",
            "yarn.nodemanager.address": "127.0.0.1:0",
            "yarn.nodemanager.localizer.address": f"127.0.0.1:{localizer}",
            "yarn.nodemanager.webapp.address": "127.0.0.1:0",
            "yarn.nodemanager.local-dirs": str(self.home / "nm-local"),
            "yarn.nodemanager.log-dirs": str(self.container_logs),
            "yarn.nodemanager.resource.memory-mb": str(self.memory_mb),
            "yarn.nodemanager.resource.cpu-vcores": str(self.vcores),
            # A Python driver beside its JVM exceeds what YARN counts for the container; the machine,
            # not the container's allocation, is the limit here.
            "yarn.nodemanager.pmem-check-enabled": "false",
            "yarn.nodemanager.vmem-check-enabled": "false",
            # A nearly full shared disk must not take the only node out of service.
            "yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage": "100.0",
            "yarn.nodemanager.disk-health-checker.min-free-space-per-disk-mb": "0",
            # Container logs stay on the node after an application ends (for error messages).
            "yarn.nodemanager.log.retain-seconds": "86400",
            "yarn.nodemanager.recovery.enabled": "false",
            "yarn.resourcemanager.recovery.enabled": "false",
        }
        (self.conf_dir / "yarn-site.xml").write_text(site_xml(yarn))
        (self.conf_dir / "log4j.properties").write_text(LOG4J)
        return self.conf_dir

    def _daemon(self, name: str, main: str, java: str, libs: Path) -> None:
        env = {**os.environ, "JAVA_HOME": java_home(java), "HADOOP_CONF_DIR": str(self.conf_dir)}
        cmd = [java, *JVM_OPTS, f"-Dkpmon.yarn={self.home}", "-cp", f"{self.conf_dir}:{libs}/*", main]
        with (self.home / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                cmd,
                cwd=self.home,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def cluster_info(self, path: str = "info") -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.rest_url}/ws/v1/cluster/{path}", timeout=5) as response:
                return dict(json.load(response))
        except (OSError, ValueError):
            return None

    def active_nodes(self) -> int:
        metrics = (self.cluster_info("metrics") or {}).get("clusterMetrics") or {}
        return int(metrics.get("activeNodes") or 0)

    def start(self, timeout: float = 300.0) -> LocalYarn:
        """Start both daemons; returns once the NodeManager has registered with the ResourceManager."""
        libs = fetch_yarn(self.version) / "libs"
        java = find_java()
        self.configure()
        self._daemon("resourcemanager", RESOURCE_MANAGER, java, libs)
        self._daemon("nodemanager", NODE_MANAGER, java, libs)
        deadline = time.monotonic() + timeout
        try:
            while self.active_nodes() < 1:
                for name, proc in self.procs.items():
                    if proc.poll() is not None:
                        raise YarnError(f"the {name} exited {proc.returncode}:\n{self.log_tail(name)}")
                if time.monotonic() > deadline:
                    raise YarnError(
                        f"no NodeManager registered within {timeout:.0f} s:\n{self.log_tail('nodemanager')}"
                    )
                time.sleep(1.0)
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.home / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def container_processes(self) -> list[int]:
        """Live processes whose working directory is one of this cluster's containers."""
        local = str(self.home / "nm-local")
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.startswith(local) and is_alive(int(entry.name)):
                found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """The NodeManager first (it stops its containers), then the ResourceManager; a container the
        NodeManager left behind is killed by its pid."""
        for name in ("nodemanager", "resourcemanager"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                terminate([(proc.pid, f"-Dkpmon.yarn={self.home}")], grace=30.0)
                proc.poll()
        for pid in self.container_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--home", type=Path, required=True, help="directory for its configuration, logs and containers"
    )
    parser.add_argument("--memory-mb", type=int, default=6144, help="memory the NodeManager offers")
    parser.add_argument("--vcores", type=int, default=4, help="cores the NodeManager offers")
    args = parser.parse_args(argv)
    try:
        cluster = LocalYarn(args.home, args.memory_mb, args.vcores).start()
    except (FetchError, YarnError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"HADOOP_CONF_DIR={cluster.conf_dir}\ndeploy.rest_url: {cluster.rest_url}", flush=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
