"""Java discovery, port checks and process-group lifecycle for the local stack's JVMs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from kpconfig.proc import proc_stat

#: Small heaps and C1-only JIT: the stack starts in seconds and leaves the second core to Spark.
BROKER_JVM_OPTS = [
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
]
TOOL_JVM_OPTS = ["-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]


class StackError(RuntimeError):
    """The local stack cannot do what was asked; the message says why and what to do."""


class JavaNotFoundError(StackError):
    pass


class PortInUseError(StackError):
    pass


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise JavaNotFoundError(
            "Java (17 or newer) was not found: neither $JAVA_HOME/bin/java nor `java` on PATH. "
            "Install a JDK (apt-get install openjdk-17-jre-headless) or set JAVA_HOME."
        )
    return found


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Same option the broker sets, so a port in TIME_WAIT counts as free, as it is for the broker.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports the kernel reports free now (racy by nature, but fine on loopback)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def is_alive(pid: int, marker: str | None = None) -> bool:
    """True if ``pid`` runs and is not a zombie; with ``marker``, its command line must contain it.

    The marker guards against a stale pid file whose pid the kernel reused for something else.
    """
    fields = proc_stat(pid)
    if fields is None:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    if fields[0] in ("Z", "X"):
        return False
    return marker is None or marker in cmdline


def spawn(cmd: list[str], log_file: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session (a process group we can signal as a whole), output to a file."""
    with log_file.open("ab") as log:
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect our own child's exit status so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def terminate(targets: list[tuple[int, str]], grace: float = 20.0) -> None:
    """SIGTERM every (pid, marker) process group at once, wait up to ``grace`` s, then SIGKILL the rest."""
    live = [(pid, marker) for pid, marker in targets if is_alive(pid, marker)]
    for pid, _ in live:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        for pid, _ in live:
            _reap(pid)
        live = [(pid, marker) for pid, marker in live if is_alive(pid, marker)]
        if live:
            time.sleep(0.1)
    for pid, _ in live:
        _signal_group(pid, signal.SIGKILL)
    for pid, _ in live:
        _wait_gone(pid)


def _wait_gone(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_alive(pid):
            return
        time.sleep(0.05)


def kill(pid: int, marker: str) -> None:
    """SIGKILL at once: a broker that dies without a controlled shutdown."""
    if is_alive(pid, marker):
        _signal_group(pid, signal.SIGKILL)
        _wait_gone(pid)
