"""Maven, which fetches every pinned jar into the kpmon cache: finding it, copying a POM's dependencies,
and the one error a fetch raises.

The fetches themselves live beside what they fetch (``deploy.fetch``: the client jars and everything at
once; ``deploy.local.distribution``: the broker jars; ``streaming.connector``: Spark's Kafka
connector; ``deploy.yarn``: YARN's daemons), and all of them import this module, so none of them
imports another to share it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path


class FetchError(RuntimeError):
    """A download that Maven could not complete."""


def mvn() -> str:
    """The ``mvn`` executable on PATH."""
    path = shutil.which("mvn")
    if path is None:
        raise FetchError("Maven (mvn) is not on PATH; install it (apt-get install maven) and retry")
    return path


def copy_dependencies(
    pom: Path,
    defines: Sequence[str],
    into: Path,
    failed: str,
    wanted: Path | None = None,
    discard: Path | None = None,
) -> None:
    """Copy the runtime dependencies of ``pom`` (its properties set by ``defines``, ``-Dname=value``) into
    ``into``. When Maven fails, or ``wanted`` is not there after it, remove ``discard`` and raise a
    FetchError that starts with ``failed`` and ends with Maven's output."""
    done = subprocess.run(
        [
            mvn(),
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            *defines,
            "-DincludeScope=runtime",
            f"-DoutputDirectory={into}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or (wanted is not None and not wanted.is_file()):
        if discard is not None:
            shutil.rmtree(discard, ignore_errors=True)
        raise FetchError(f"{failed}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
