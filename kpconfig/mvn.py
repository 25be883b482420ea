"""Maven, which fetches every pinned jar into the kpmon cache: finding it, and the one error a fetch raises.

The fetches themselves live beside what they fetch (``deploy.fetch``: the client jars and everything at
once; ``deploy.local.distribution``: the broker jars; ``streaming.connector``: Spark's Kafka
connector), and all of them import this module, so none of them imports another to share it.
"""

from __future__ import annotations

import shutil


class FetchError(RuntimeError):
    """A download that Maven could not complete."""


def mvn() -> str:
    """The ``mvn`` executable on PATH."""
    path = shutil.which("mvn")
    if path is None:
        raise FetchError("Maven (mvn) is not on PATH; install it (apt-get install maven) and retry")
    return path
