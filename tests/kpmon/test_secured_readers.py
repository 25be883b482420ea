"""``kpmon decode --topic`` and ``kpmon report --topic`` on a SASL listener, credentials from a secrets dir.

A real broker with a SASL_PLAINTEXT listener (the ``sasl_kafka_stack`` fixture) holds a tap topic.
The readers find the cluster and its librdkafka properties in the config; the password comes from
``KPMON_SECRETS_DIR`` (a file per key), never from the YAML or an environment value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

import codec
from codec.protocol import ApiKey

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _kpmon(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kpmon.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        cwd=cwd,
        check=False,
    )


def test_readers_use_the_tap_clusters_properties(sasl_kafka_stack: Any, tmp_path: Path) -> None:
    client = sasl_kafka_stack.client_config("SCRAM-SHA-256")
    topic = f"kpmon.tap.secured.{uuid.uuid4().hex[:6]}"
    frame = codec.encode_request(
        ApiKey.API_VERSIONS, 3, 7, "secured", {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"}
    )
    producer = Producer(client)
    headers: list[tuple[str, str | bytes | None]] = [
        ("dir", b"req"),
        ("api_key", str(int(ApiKey.API_VERSIONS)).encode()),
        ("api_version", b"3"),
    ]
    producer.produce(topic, frame, key=b"conn-1", headers=headers)
    assert producer.flush(30) == 0

    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "tap__cluster__properties__sasl.password").write_text(client["sasl.password"] + "\n")
    config = tmp_path / "kpmon.yaml"
    properties = {
        k: v for k, v in client.items() if k.startswith(("security.", "sasl.")) and k != "sasl.password"
    }
    config.write_text(
        yaml.safe_dump(
            {
                "tap": {
                    "topic": topic,
                    "cluster": {"bootstrap_servers": client["bootstrap.servers"], "properties": properties},
                }
            }
        )
    )
    env = {"KPMON_SECRETS_DIR": str(secrets), "KPMON_HOME": str(tmp_path / "home")}

    decoded = _kpmon(["--config", str(config), "decode", "--topic", topic, "--max", "1"], env, tmp_path)
    assert decoded.returncode == 0, decoded.stderr[-2000:]
    line = json.loads(decoded.stdout.splitlines()[0])
    assert "secured" in json.dumps(line)

    report = _kpmon(
        [
            "--config",
            str(config),
            "report",
            "--topic",
            topic,
            "--max",
            "1",
            "--out",
            str(tmp_path / "r.html"),
        ],
        env,
        tmp_path,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert (tmp_path / "r.html").is_file()

    # Without the password the SASL listener refuses the reader: a clear error, not a hang.
    refused = _kpmon(
        ["--config", str(config), "decode", "--topic", topic, "--max", "1"],
        {"KPMON_HOME": str(tmp_path / "home")},
        tmp_path,
    )
    assert refused.returncode != 0
    assert "error: cannot read" in refused.stderr and "Traceback" not in refused.stderr
    assert client["sasl.password"] not in refused.stdout + refused.stderr
