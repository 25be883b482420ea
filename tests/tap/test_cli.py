"""``kpmon tap``: argument parsing into the shared config, and a real process forwarding traffic."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from kpconfig.model import ConfigError, TapConfig
from kpmon.cli import build_parser
from kpmon.commands.tap import configure
from tests.tap.helpers import FakeBroker, api_versions_request, frame

ROOT = Path(__file__).resolve().parents[2]


def test_listen_args_override_config(tmp_path: Path) -> None:
    cfg = tmp_path / "kpmon.yaml"
    cfg.write_text(
        "tap:\n  topic: from-file\n  capture: meta\n"
        "  cluster: {bootstrap_servers: 'x:1', properties: {security.protocol: SASL_SSL}}\n"
    )
    args = build_parser().parse_args(
        [
            "tap",
            "--config",
            str(cfg),
            "--listen",
            "127.0.0.1:29092=127.0.0.1:19092@3",
            "--capture",
            "full",
            "--tap-bootstrap-servers",
            "mon:9092",
            "--rewrite-broker-addresses",
            "--clamp-api-versions",
        ]
    )
    config = configure(args)
    assert config.tap.topic == "from-file"
    assert config.tap.capture == "full"
    assert config.tap.listeners[0].broker_id == 3
    assert config.tap_cluster.bootstrap_servers == "mon:9092"
    assert config.tap_cluster.properties == {"security.protocol": "SASL_SSL"}  # kept, not dropped
    assert config.tap.rewrite_broker_addresses and config.tap.clamp_api_versions


def _tls_listeners_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "kpmon.yaml"
    cfg.write_text(
        "tap:\n  listeners:\n"
        "    - {listen: '0.0.0.0:29092', broker: 'b0:9093', broker_id: 0, listener_name: CLIENT,\n"
        "       tls_certfile: /t/0.crt, tls_keyfile: /t/0.key, broker_tls: true, broker_cafile: /t/ca.crt,\n"
        "       advertise: 'tap-0:9092'}\n"
        "    - {listen: '0.0.0.0:29093', broker: 'b1:9093', broker_id: 1, tls_certfile: /t/1.crt,\n"
        "       tls_keyfile: /t/1.key, broker_tls: true}\n"
    )
    return cfg


@pytest.mark.parametrize(
    ("listen", "expected_id", "listen_addr", "broker"),
    [
        ("0.0.0.0:29093", 1, "0.0.0.0:29093", "b1:9093"),  # by listen address
        ("0.0.0.0:29093=b1:9093@1", 1, "0.0.0.0:29093", "b1:9093"),  # the whole entry, as manifests write it
        ("0.0.0.0:29092=127.0.0.1:9093@1", 1, "0.0.0.0:29092", "127.0.0.1:9093"),  # by id: a sidecar
    ],
)
def test_listen_selects_a_configured_listener_and_keeps_its_settings(
    tmp_path: Path, listen: str, expected_id: int, listen_addr: str, broker: str
) -> None:
    cfg = _tls_listeners_config(tmp_path)
    configured = {
        c.broker_id: c
        for c in configure(build_parser().parse_args(["tap", "--config", str(cfg)])).tap.listeners
    }
    args = build_parser().parse_args(["tap", "--config", str(cfg), "--listen", listen])
    (listener,) = configure(args).tap.listeners
    assert (listener.broker_id, listener.listen, listener.broker) == (expected_id, listen_addr, broker)
    assert listener == configured[expected_id].model_copy(update={"listen": listen_addr, "broker": broker})
    assert listener.broker_tls and listener.tls_certfile == f"/t/{expected_id}.crt"


@pytest.mark.parametrize("listen", ["0.0.0.0:29999", "0.0.0.0:29092=b0:9093@7"])
def test_listen_naming_no_configured_listener_is_an_error(tmp_path: Path, listen: str) -> None:
    cfg = _tls_listeners_config(tmp_path)
    args = build_parser().parse_args(["tap", "--config", str(cfg), "--listen", listen])
    with pytest.raises(ConfigError, match=r"no configured tap listener.*0\.0\.0\.0:29092 \(broker id 0\)"):
        configure(args)


def test_listen_without_a_broker_needs_configured_listeners() -> None:
    with pytest.raises(ConfigError, match="names no broker"):
        configure(build_parser().parse_args(["tap", "--listen", "127.0.0.1:29092"]))


def test_tap_command_reports_a_listen_that_selects_nothing(tmp_path: Path) -> None:
    cfg = _tls_listeners_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "kpmon.cli", "tap", "--config", str(cfg), "--listen", "0.0.0.0:1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr
    assert "no configured tap listener has listen address 0.0.0.0:1" in done.stdout


def test_dynamic_listener_options(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["tap", "--listen", "127.0.0.1:29092=127.0.0.1:19092@1", "--rewrite-broker-addresses"]
    config = configure(build_parser().parse_args([*base, "--dynamic-listener-ports", "29100-29199"]))
    assert config.tap.dynamic_listeners and config.tap.dynamic_listener_ports == (29100, 29199)
    assert not configure(build_parser().parse_args([*base, "--no-dynamic-listeners"])).tap.dynamic_listeners
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--dynamic-listener-ports", "29199-29100"])
    assert "LOW <= HIGH" in capsys.readouterr().err
    with pytest.raises(ValidationError, match="dynamic_listener_ports"):
        TapConfig(dynamic_listener_ports=(0, 10))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tap_process_forwards_and_stops_on_sigterm() -> None:
    async def run() -> None:
        broker = FakeBroker()
        bport = await broker.start()
        port = _free_port()
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "kpmon.cli", "tap"),
                *("--listen", f"127.0.0.1:{port}=127.0.0.1:{bport}@1", "--no-mirror", "--no-metrics"),
            ],
            cwd=ROOT,
            env={**os.environ, "KPMON__TAP__INSTANCE_ID": "cli-test"},
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    break
                except OSError:
                    assert time.monotonic() < deadline, "tap did not start"
                    await asyncio.sleep(0.1)
            writer.write(frame(api_versions_request(7)))
            await writer.drain()
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            assert struct.unpack_from(">i", await reader.readexactly(size))[0] == 7
            writer.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
            await broker.stop()
        assert proc.returncode == 0, err
        assert b'"event": "ready"' in err

    asyncio.run(run())


def test_workers_option_and_auto() -> None:
    base = ["tap", "--listen", "127.0.0.1:29092=127.0.0.1:19092@1"]
    assert configure(build_parser().parse_args(base)).tap.worker_count == 1
    assert configure(build_parser().parse_args([*base, "--workers", "3"])).tap.worker_count == 3
    auto = configure(build_parser().parse_args([*base, "--workers", "auto"])).tap
    assert auto.workers == "auto" and auto.worker_count == len(os.sched_getaffinity(0))
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--workers", "0"])
    with pytest.raises(ValidationError, match="workers"):
        TapConfig(workers=0)
    with pytest.raises(ValidationError, match="workers"):
        TapConfig(workers="all")  # type: ignore[arg-type]
    run = build_parser().parse_args(["run", "--tap-workers", "2"])
    assert run.tap_workers == 2
