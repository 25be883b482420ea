"""Where kpmon keeps state, logs and cached downloads."""

from __future__ import annotations

import os
from pathlib import Path


def kpmon_home() -> Path:
    """The state directory: ``$KPMON_HOME`` or ``.kpmon`` under the current directory."""
    return Path(os.environ.get("KPMON_HOME", ".kpmon")).resolve()


def cache_dir() -> Path:
    """Downloads that never change for a pinned version (jars, connector packages)."""
    return kpmon_home() / "cache"
