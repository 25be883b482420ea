"""Run the tap from the shared config: build listeners, the mirror sink and metrics, serve until a signal."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import ssl
import sys
import time
import uuid
from collections.abc import Callable

from kpconfig.model import KpmonConfig, TapConfig
from tap.flush import FlushLimits
from tap.framing import HoldLimits
from tap.metrics import TapMetrics
from tap.mirror import KafkaMirror, MirrorSink, NullMirror
from tap.native_core import log_core
from tap.proxy import ListenerSpec, Tap, TapSettings, install_uvloop, parse_hostport

log = logging.getLogger("kpmon.tap")


class JsonFormatter(logging.Formatter):
    """One JSON object per line; messages that already are JSON objects are merged in."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        message = record.getMessage()
        try:
            parsed = json.loads(message)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            entry.update(parsed)
        else:
            entry["msg"] = message
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("kpmon")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def listener_specs(tap: TapConfig) -> list[ListenerSpec]:
    specs = []
    for entry in tap.listeners:
        lhost, lport = parse_hostport(entry.listen)
        bhost, bport = parse_hostport(entry.broker)
        server_ssl = None
        if entry.tls_certfile:
            server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            server_ssl.load_cert_chain(entry.tls_certfile, entry.tls_keyfile)
            if entry.tls_client_cafile:
                server_ssl.verify_mode = ssl.CERT_REQUIRED
                server_ssl.load_verify_locations(entry.tls_client_cafile)
        broker_ssl = ssl.create_default_context(cafile=entry.broker_cafile) if entry.broker_tls else None
        identities = []
        for cn, identity in entry.broker_identities.items():
            context = ssl.create_default_context(cafile=entry.broker_cafile)
            context.load_cert_chain(identity.certfile, identity.keyfile)
            identities.append((cn, context))
        advertise = parse_hostport(entry.advertise) if entry.advertise else None
        specs.append(
            ListenerSpec(
                lhost,
                lport,
                bhost,
                bport,
                entry.broker_id,
                entry.listener_name,
                server_ssl,
                broker_ssl,
                advertise,
                tuple(identities),
            )
        )
    return specs


def mirror_sink(config: KpmonConfig, on_error: Callable[[str], None]) -> MirrorSink:
    """The mirror producer to the tap topic, as the config sets it."""
    tap_cfg = config.tap
    cluster = config.tap_cluster
    return KafkaMirror(
        cluster.bootstrap_servers,
        tap_cfg.topic,
        tap_cfg.queue_max_frames,
        tap_cfg.queue_max_bytes,
        dict(cluster.properties),
        on_error=on_error,
    )


def build_tap(config: KpmonConfig, mirror: bool = True, connection_prefix: str | None = None) -> Tap:
    tap_cfg = config.tap
    metrics = TapMetrics()
    log_core(log)
    instance = tap_cfg.instance_id or f"tap-{uuid.uuid4().hex[:8]}"
    sink: MirrorSink = NullMirror()
    if mirror:
        sink = mirror_sink(config, lambda err: metrics.delivery_errors.inc())
    settings = TapSettings(
        capture=tap_cfg.capture,
        mirror=mirror,
        max_mirrored_frame_bytes=tap_cfg.max_mirrored_frame_bytes,
        instance_id=instance,
        connection_prefix=connection_prefix,
        rewrite_broker_addresses=tap_cfg.rewrite_broker_addresses,
        clamp_api_versions=tap_cfg.clamp_api_versions,
        dynamic_listeners=tap_cfg.dynamic_listeners,
        dynamic_listener_ports=tap_cfg.dynamic_listener_ports,
        hold_limits=HoldLimits(
            tap_cfg.max_in_flight,
            tap_cfg.max_held_bytes_per_connection,
            int(tap_cfg.max_held_seconds * 1e9),
            int(tap_cfg.max_held_join_group_seconds * 1e9),
        ),
        max_held_bytes=tap_cfg.max_held_bytes,
        flush=FlushLimits(
            tap_cfg.flush_max_bytes, tap_cfg.flush_max_entries, int(tap_cfg.flush_max_age_ms * 1e6)
        ),
    )
    return Tap(listener_specs(tap_cfg), sink, settings, metrics)


async def serve(tap: Tap, metrics_port: int | None, metrics_host: str = "127.0.0.1") -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    bound = await tap.start()
    tap.announce()
    if metrics_port is not None:
        tap.metrics.serve(metrics_port, metrics_host)
    tap.log_event("ready", listeners=[f"{h}:{p}" for h, p in bound], metrics_port=metrics_port)
    await stop.wait()
    tap.log_event("stopping")
    await tap.stop()


def no_listeners(config: KpmonConfig) -> bool:
    """True (and logged) when the config gives the tap nothing to listen on."""
    if config.tap.listeners:
        return False
    log.error(json.dumps({"event": "no_listeners", "hint": "give --listen or tap.listeners in the config"}))
    return True


def run(config: KpmonConfig, mirror: bool = True) -> int:
    """The tap in this process (``tap.workers: 1``); tap/workers.py runs more."""
    if no_listeners(config):
        return 2
    install_uvloop()
    tap = build_tap(config, mirror)
    try:
        asyncio.run(serve(tap, config.tap.metrics_port, config.tap.metrics_host))
    finally:
        tap.sink.close()
    return 0
