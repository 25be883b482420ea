"""The one configuration model, shared by the tap, the streaming job, the CLI and the Airflow DAGs.

A config is a YAML file plus environment overrides. ``KPMON__TAP__TOPIC=frames`` sets ``tap.topic``;
nested keys are separated by double underscores. Values from the environment are parsed as YAML
scalars, so ``KPMON__TAP__QUEUE_MAX_FRAMES=5000`` is an int.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENV_PREFIX = "KPMON__"

CapturePolicy = Literal["full", "headers", "meta"]


class ConfigError(ValueError):
    """A config that cannot be loaded or does not validate; the message names the bad keys."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaClusterConfig(_Section):
    """A Kafka cluster kpmon talks to (the monitored one, or the one holding the tap topic)."""

    bootstrap_servers: str = "127.0.0.1:9092"
    #: Extra librdkafka properties (security.protocol, sasl.*, ssl.*).
    properties: dict[str, str] = Field(default_factory=dict)


class StackConfig(_Section):
    """The local KRaft stack started by ``kpmon stack``."""

    kafka_version: str = "4.4.0"
    brokers: int = 1
    sasl: bool = False
    #: Client listeners on base_port.., then inter-broker listeners, then the controller (docs/stack.md).
    base_port: int = 19092
    #: Stack directory (state, logs, pid files); default ``$KPMON_HOME/stack``.
    home: str | None = None
    startup_timeout: float = 90.0

    @field_validator("brokers")
    @classmethod
    def _one_or_three(cls, value: int) -> int:
        if value not in (1, 3):
            raise ValueError("brokers must be 1 (combined node) or 3 (separate controller quorum)")
        return value


class TapListenerConfig(_Section):
    """One tap listening port in front of one broker."""

    listen: str
    broker: str
    broker_id: int | None = None
    listener_name: str = "PLAINTEXT"
    #: TLS towards clients: the tap terminates it with this certificate and key (PEM files).
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    #: TLS towards the broker, verified against ``broker_cafile`` (system CAs when unset).
    broker_tls: bool = False
    broker_cafile: str | None = None
    #: host:port clients should use for this broker when the tap rewrites addresses (default: ``listen``).
    advertise: str | None = None


class TapConfig(_Section):
    listeners: list[TapListenerConfig] = Field(default_factory=list)
    topic: str = "kpmon.tap"
    capture: CapturePolicy = "headers"
    #: Where the tap topic lives; defaults to the monitored cluster.
    cluster: KafkaClusterConfig | None = None
    queue_max_frames: int = 100_000
    queue_max_bytes: int = 256 * 1024 * 1024
    #: Frames larger than this are mirrored truncated to their header and flagged.
    max_mirrored_frame_bytes: int = 900_000
    rewrite_broker_addresses: bool = False
    clamp_api_versions: bool = False
    metrics_port: int | None = 9464
    instance_id: str | None = None


class StreamConfig(_Section):
    master: str = "local[*]"
    checkpoint_dir: str | None = None
    trigger_seconds: float = 1.0
    max_offsets_per_trigger: int = 200_000
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    fail_on_data_loss: bool = False
    metrics_port: int | None = 9465


class ChecksConfig(_Section):
    watermark_seconds: float = 10.0
    connection_ttl_seconds: float = 3600.0
    group_ttl_seconds: float = 24 * 3600.0
    producer_ttl_seconds: float = 7 * 24 * 3600.0
    max_entries_per_key: int = 10_000
    #: Client addresses (host or host:port) whose connections count as inter-broker (KIP-590).
    broker_client_addresses: list[str] = Field(default_factory=list)
    broker_listeners: list[str] = Field(default_factory=lambda: ["CONTROLLER", "BROKER", "REPLICATION"])


class QualityConfig(_Section):
    """Great Expectations suites over each micro-batch's aggregates and findings (streaming/quality.py)."""

    #: Batch fails ``quality.decode_error_rate`` above this share of undecodable frames.
    max_decode_error_rate: float = Field(default=0.01, ge=0.0, le=1.0)
    #: Batch fails ``quality.error_response_rate`` above this share of responses with a top-level error.
    max_error_response_rate: float = Field(default=0.5, ge=0.0, le=1.0)
    #: The two rates are only judged on batches with at least this many frames: tiny batches are noise.
    min_frames_for_rates: int = Field(default=100, ge=1)
    #: Keep validation results and render Data Docs (static HTML) under the state directory.
    data_docs: bool = True
    #: Data Docs are rebuilt at most once per this many validated batches (and on demand).
    docs_every_batches: int = Field(default=100, ge=1)
    #: A passing batch's results are kept for the docs once per this many batches; failing ones always.
    docs_sample_every_batches: int = Field(default=10, ge=1)
    #: Validation results kept on disk per suite (oldest pruned), which bounds the docs' build time.
    docs_keep_results: int = Field(default=200, ge=1)


class HookConfig(_Section):
    kind: Literal["kafka", "webhook", "slack", "pagerduty", "alertmanager", "log"]
    url: str | None = None
    topic: str | None = None
    routing_key: str | None = None
    min_severity: Literal["info", "warning", "critical"] = "warning"
    max_per_second: float = 1.0
    timeout_seconds: float = 5.0
    max_retries: int = 5


class AlertsConfig(_Section):
    hooks: list[HookConfig] = Field(default_factory=lambda: [HookConfig(kind="log")])


class KpmonConfig(_Section):
    """The whole configuration. Every field has a default that runs the embedded local stack."""

    state_dir: str = ".kpmon"
    kafka: KafkaClusterConfig = Field(default_factory=KafkaClusterConfig)
    stack: StackConfig = Field(default_factory=StackConfig)
    tap: TapConfig = Field(default_factory=TapConfig)
    stream: StreamConfig = Field(default_factory=StreamConfig)
    checks: ChecksConfig = Field(default_factory=ChecksConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)

    @property
    def tap_cluster(self) -> KafkaClusterConfig:
        return self.tap.cluster or self.kafka


def _apply_env(raw: dict[str, Any], environ: dict[str, str]) -> dict[str, Any]:
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split("__") if part]
        if not path:
            continue
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{name}: {'.'.join(path[:-1])} is not a section")
            node = child
        node[path[-1]] = yaml.safe_load(value) if value else value
    return raw


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> KpmonConfig:
    """Load ``path`` (YAML; optional) and apply ``KPMON__*`` environment overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config {path} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping at the top level")
        raw = loaded or {}
    raw = _apply_env(raw, dict(os.environ) if environ is None else environ)
    try:
        return KpmonConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        raise ConfigError(f"invalid config: {problems}") from exc
