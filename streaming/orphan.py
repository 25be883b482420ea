"""A driver that spark-submit's JVM started exits when that JVM is gone.

spark-submit runs a Python application as a child of its JVM (``PythonRunner``, in client and in
cluster mode), and sets ``PYSPARK_GATEWAY_PORT`` for it. When that JVM dies (a cluster's kill of the
driver, an OOM kill), the Python process is orphaned: every Spark call now fails or blocks on a
socket no one answers, and the process can stay alive for minutes holding what only one driver may
hold (the alert spool's lock), so the driver started in its place cannot start. Nothing can be
stopped gracefully without the JVM, so an orphaned driver exits at once (the kernel releases its
locks); the checkpoint is the JVM's and is as consistent as a killed driver leaves it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

log = logging.getLogger("kpmon.stream")

#: Set by spark-submit's ``PythonRunner`` for the Python application it starts as its child.
GATEWAY_ENV = "PYSPARK_GATEWAY_PORT"
#: The exit status of a driver whose JVM went away (EX_SOFTWARE: not a config or usage error).
ORPHANED_EXIT = 70
#: How long the exit waits for its log line to be written.
LOG_GRACE_SECONDS = 2.0


def spark_submit_parent(environ: Mapping[str, str] | None = None) -> int | None:
    """The pid of the spark-submit JVM this process runs under, None when spark-submit did not start it."""
    return os.getppid() if GATEWAY_ENV in (os.environ if environ is None else environ) else None


def exit_with_the_jvm(
    environ: Mapping[str, str] | None = None,
    poll_seconds: float = 1.0,
    exit: Callable[[int], None] = os._exit,
) -> threading.Thread | None:
    """When spark-submit's JVM is this process's parent, watch it from a daemon thread and ``exit``
    as soon as it is gone (the parent changes: the process was reparented). None when this process
    was not started by spark-submit (``python -m streaming``: its JVM is its own child)."""
    parent = spark_submit_parent(environ)
    if parent is None:
        return None

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        # The exit must not wait for the log line: the JVM read this process's stdout and stderr, and
        # a thread still writing to them (holding the logging handler's lock) would hold this one too.
        deadline = threading.Timer(LOG_GRACE_SECONDS, exit, (ORPHANED_EXIT,))
        deadline.daemon = True
        deadline.start()
        log.error("kpmon: spark-submit's JVM (pid %d) is gone: exiting, nothing to stop without it", parent)
        exit(ORPHANED_EXIT)

    thread = threading.Thread(target=watch, name="kpmon-jvm-watch", daemon=True)
    thread.start()
    return thread
