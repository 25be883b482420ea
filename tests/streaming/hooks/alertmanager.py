"""A real Prometheus Alertmanager on loopback, for the alertmanager hook's integration test.

The binary is Debian's ``prometheus-alertmanager`` (0.25, with the v2 API the hook posts to), which
``make setup`` installs; an ``alertmanager`` on the PATH serves too. Without either the test is skipped,
saying why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.streaming.hooks.receiver import free_port

_CONFIG = """
route:
  receiver: discard
  group_wait: 0s
receivers:
  - name: discard
"""


def alertmanager_binary() -> Path | None:
    """Debian's build (its own name for the binary), else an ``alertmanager`` on the PATH; None if neither."""
    found = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    return Path(found) if found else None


@contextmanager
def running_alertmanager(binary: Path, home: Path, timeout: float = 30.0) -> Iterator[str]:
    """Start Alertmanager (no clustering) on a free loopback port; yields its base URL."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "alertmanager.yml").write_text(_CONFIG)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(home / "alertmanager.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            str(binary),
            f"--config.file={home / 'alertmanager.yml'}",
            f"--storage.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1.0) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"Alertmanager did not start: {(home / 'alertmanager.log').read_text()[-2000:]}"
                )
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def current_alerts(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=5.0) as response:
        return list(json.loads(response.read()))
