"""The one configuration model, shared by the tap, the streaming job, the CLI and the Airflow DAGs.

A config is a YAML file plus environment overrides. ``KPMON__TAP__TOPIC=frames`` sets ``tap.topic``;
nested keys are separated by double underscores. Values from the environment are parsed as YAML
scalars, so ``KPMON__TAP__QUEUE_MAX_FRAMES=5000`` is an int.

Secrets can come from files instead (docs/security.md, "Secrets in configs"): ``KPMON__<PATH>_FILE``
names a file whose content is the value of ``<PATH>``, and every file of a secrets directory
(``KPMON_SECRETS_DIR``, e.g. a mounted Kubernetes Secret) named ``<PATH>`` (``kafka__properties__sasl.password``)
sets that key. File contents are taken as they are (one trailing newline dropped), never parsed as YAML.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from checks.alerts import DEFAULT_RUNBOOK, AlertContext
from checks.settings import DEFAULTS as CHECKS_DEFAULTS
from checks.settings import ChecksSettings

ENV_PREFIX = "KPMON__"
#: ``KPMON__<PATH>_FILE``: the value of ``<PATH>`` is the content of this file.
FILE_SUFFIX = "_FILE"
#: A directory whose files are named after key paths (``tap__cluster__properties__sasl.password``).
SECRETS_DIR_ENV = "KPMON_SECRETS_DIR"

CapturePolicy = Literal["full", "headers", "meta"]


class ConfigError(ValueError):
    """A config that cannot be loaded or does not validate; the message names the bad keys."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaClusterConfig(_Section):
    """A Kafka cluster kpmon talks to (the monitored one, or the one holding the tap topic).

    Two client libraries reach it: librdkafka (the tap's mirror, the hooks, the CLI and DAG readers)
    takes ``properties``; the Java client (Spark's Kafka source) takes ``java_client_properties()``:
    ``properties`` translated (``java_properties_from_librdkafka``), then ``java_properties`` on top.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    #: librdkafka properties (security.protocol, sasl.mechanism, sasl.username, ssl.ca.location, ...).
    properties: dict[str, str] = Field(default_factory=dict)
    #: Java client properties (sasl.jaas.config, ssl.truststore.*, ...), over the translated ones.
    java_properties: dict[str, str] = Field(default_factory=dict)

    def java_client_properties(self) -> dict[str, str]:
        """Properties for the Java client: the translation of ``properties``, then ``java_properties``."""
        return {**java_properties_from_librdkafka(self.properties), **self.java_properties}


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


class BrokerIdentity(_Section):
    """A client certificate and key (PEM) the tap presents to the broker on behalf of one client."""

    certfile: str
    keyfile: str


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
    #: mTLS to the tap: clients must present a certificate signed by a CA in this PEM bundle.
    tls_client_cafile: str | None = None
    #: mTLS to the broker (docs/decisions.md, "mTLS through the tap"): per client certificate CN, the
    #: identity the tap presents to the broker for that client. A client with no entry is refused.
    broker_identities: dict[str, BrokerIdentity] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _identities_need_tls(self) -> TapListenerConfig:
        if self.broker_identities and not (self.tls_client_cafile and self.tls_certfile and self.broker_tls):
            raise ValueError(
                "broker_identities need verified client certificates (tls_certfile, tls_keyfile, "
                "tls_client_cafile) and TLS to the broker (broker_tls)"
            )
        if self.tls_client_cafile and not self.tls_certfile:
            raise ValueError("tls_client_cafile needs tls_certfile and tls_keyfile")
        return self


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
    #: A request is held (as it will be mirrored) until its response completes the exchange record.
    #: Past any of these bounds the oldest held request is written as a record of its own, counted in
    #: ``kpmon_tap_lone_frames_total{reason}`` (docs/tap.md): requests in flight per connection...
    max_in_flight: int = Field(default=1_000, gt=0)
    #: ...bytes held per connection...
    max_held_bytes_per_connection: int = Field(default=8 * 1024 * 1024, ge=0)
    #: ...bytes held over the whole tap...
    max_held_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    #: ...and seconds a request is held.
    max_held_seconds: float = Field(default=30.0, gt=0)
    #: ...but a JoinGroup up to this (the coordinator answers it when the rebalance completes).
    max_held_join_group_seconds: float = Field(default=330.0, gt=0)
    #: A connection's entries (exchanges, lone frames, lifecycle events) are gathered into one tap
    #: record (schema 3) until they reach this many payload bytes...
    flush_max_bytes: int = Field(default=256 * 1024, gt=0, le=900_000)
    #: ...or this many entries...
    flush_max_entries: int = Field(default=64, gt=0)
    #: ...or the oldest is this old (what the tap adds to alert latency, never to client latency),
    #: and at once when the connection closes or the tap stops.
    flush_max_age_ms: float = Field(default=50.0, gt=0)
    rewrite_broker_addresses: bool = False
    #: With rewriting: a broker id that has no listener gets one on the fly (docs/tap.md)...
    dynamic_listeners: bool = True
    #: ...on a free port of this inclusive range, e.g. [29100, 29199]; unset: an ephemeral port.
    dynamic_listener_ports: tuple[int, int] | None = None
    clamp_api_versions: bool = False
    metrics_port: int | None = 9464
    #: Address the metrics endpoint binds; loopback unless set (``0.0.0.0`` for a scraper elsewhere).
    metrics_host: str = "127.0.0.1"
    instance_id: str | None = None
    #: Forwarding processes sharing every listener (tap/workers.py): a number, or ``auto`` for the
    #: cores this process may run on (``os.sched_getaffinity``). 1 forwards in the process itself.
    workers: int | Literal["auto"] = 1

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: int | str) -> int | str:
        if value != "auto" and (not isinstance(value, int) or value < 1):
            raise ValueError("must be a positive number of processes or 'auto'")
        return value

    @property
    def worker_count(self) -> int:
        """``workers`` as a number: ``auto`` is the cores this process may be scheduled on."""
        if self.workers == "auto":
            return max(1, len(os.sched_getaffinity(0)))
        return self.workers

    @field_validator("dynamic_listener_ports")
    @classmethod
    def _port_range(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 1 <= value[0] <= value[1] <= 65535:
            raise ValueError("must be [low, high] with 1 <= low <= high <= 65535")
        return value


class StreamConfig(_Section):
    """The Structured Streaming monitor (``kpmon stream``); see docs/streaming.md."""

    master: str = "local[*]"
    #: Default ``<state_dir>/stream/checkpoint``. Cluster deploys need a shared filesystem URI here.
    checkpoint_dir: str | None = None
    trigger_seconds: float = Field(default=1.0, gt=0)
    max_offsets_per_trigger: int = Field(default=200_000, gt=0)
    #: The source's Kafka consumer ``fetch.max.wait.ms``. A task that reads up to the topic's end finds
    #: the consumer's next fetch already waiting at the broker for new records, and waits with it: at
    #: Kafka's default (500 ms) that was most of a small batch's time (docs/decisions.md).
    fetch_max_wait_ms: int = Field(default=20, ge=0)
    #: Tap records the router takes at once, at least: Spark's Arrow batches (10,000 records) are
    #: joined until they hold as many. A connection's exchanges in one routing share its row and their
    #: runs' summaries, so a backlog's long-lived connections reach the stateful stage less often.
    route_batch_records: int = Field(default=50_000, gt=0)
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    #: false: a tap-topic offset that retention deleted is skipped with a warning (the checks see a
    #: ``tap.gap``); true: the query fails instead.
    fail_on_data_loss: bool = False
    metrics_port: int | None = 9465
    #: Address the metrics endpoint binds; loopback unless set (``0.0.0.0`` for a scraper elsewhere).
    metrics_host: str = "127.0.0.1"
    #: Partitions of the stateful stage (Spark's spark.sql.shuffle.partitions); fixed by the first start
    #: of a checkpoint.
    shuffle_partitions: int = Field(default=4, gt=0)
    #: Buckets the stateful stage groups its stage keys into (a connection's ``conn|<id>``, an entity's
    #: ``<kind>|<key>``; ``streaming.rows.bucket_index``): Spark calls the Python stage once per bucket
    #: and batch. Default (None): 4 x ``shuffle_partitions``, so every partition
    #: gets buckets despite hash collisions while a batch still makes only tens of calls. Raise it to at
    #: least the tap topic's partition count on a wide topic. Fixed by the first start of a checkpoint.
    state_buckets: int | None = Field(default=None, gt=0)
    #: Freeze the job's Python workers' long-lived objects (routing and stateful stages) and collect their
    #: young generation every 50,000 allocations instead of 700 (streaming/workergc.py): the collector
    #: took 16 % of the stateful workers' CPU and a third of the routing ones'.
    worker_gc: bool = True
    #: A starting job waits this long for the alert spool's lock (``<state_dir>/stream/hooks-spool``):
    #: a driver replacing one its cluster killed waits for the old process, which exits once its JVM is
    #: gone but can take tens of seconds on a loaded host. Its holder is logged every 10 s meanwhile.
    spool_lock_wait_seconds: float = Field(default=180.0, ge=0)
    #: A graceful stop waits for the running batch, then this long for the query to end.
    stop_timeout_seconds: float = Field(default=60.0, gt=0)
    #: ``kpmon stream status``: no progress for this long is "stalled"...
    stall_seconds: float = Field(default=120.0, gt=0)
    #: ...and more tap records than this behind the topic's end is "lagging".
    max_lag_records: int = Field(default=500_000, gt=0)
    #: Alert-book snapshots and per-batch result files kept in the state directory.
    keep_batches: int = Field(default=1000, gt=1)
    #: Extra Spark properties (``spark.*``), applied last.
    spark_conf: dict[str, str] = Field(default_factory=dict)

    @property
    def buckets(self) -> int:
        """``state_buckets``, or its default."""
        return self.state_buckets or 4 * self.shuffle_partitions


class ChecksConfig(_Section):
    """The ``checks:`` section; the checks engine itself reads ``settings()`` (checks/settings.py)."""

    watermark_seconds: float = Field(default=CHECKS_DEFAULTS.watermark_seconds, ge=0)
    connection_ttl_seconds: float = CHECKS_DEFAULTS.connection_ttl_seconds
    group_ttl_seconds: float = CHECKS_DEFAULTS.group_ttl_seconds
    producer_ttl_seconds: float = CHECKS_DEFAULTS.producer_ttl_seconds
    max_entries_per_key: int = Field(default=CHECKS_DEFAULTS.max_entries_per_key, ge=1)
    #: Client addresses (host or host:port) whose connections count as inter-broker (KIP-590).
    broker_client_addresses: list[str] = Field(
        default_factory=lambda: list(CHECKS_DEFAULTS.broker_client_addresses)
    )
    broker_listeners: list[str] = Field(default_factory=lambda: list(CHECKS_DEFAULTS.broker_listeners))

    def settings(self) -> ChecksSettings:
        return ChecksSettings(**self.model_dump())


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
    #: Validation results kept on disk per suite (oldest pruned). A Data Docs render reads every kept
    #: result back: about 15-30 ms each on 2 cores, so this bounds each render's CPU time.
    docs_keep_results: int = Field(default=50, ge=1)


HookKind = Literal["kafka", "webhook", "slack", "pagerduty", "alertmanager", "log"]


class HookConfig(_Section):
    """One alert destination. Unset tuning knobs (``None``) take the kind's default (docs/alerting.md)."""

    kind: HookKind
    #: Unique among the hooks; names the spool file, the metrics label and the log lines. Default: the kind.
    name: str | None = None
    #: Receiver URL: webhook and slack (required); alertmanager (base URL, ``/api/v2/alerts`` is appended
    #: unless present); pagerduty (default ``https://events.pagerduty.com/v2/enqueue``).
    url: str | None = None
    #: Extra HTTP headers (e.g. ``Authorization``); their values are never logged.
    headers: dict[str, str] = Field(default_factory=dict)
    #: kafka: the alerts topic, on ``cluster`` (default: the tap topic's cluster).
    topic: str = "kpmon.alerts"
    cluster: KafkaClusterConfig | None = None
    #: kafka: create the topic (broker defaults for partitions and replication) if it does not exist.
    create_topic: bool = True
    #: pagerduty: the Events API v2 integration key.
    routing_key: str | None = None
    #: pagerduty ``payload.source``; Alertmanager gets it as the ``instance`` label.
    source: str = "kpmon"
    #: alertmanager: optional ``generatorURL`` (e.g. the job's dashboard) and static labels for every alert.
    generator_url: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    min_severity: Literal["info", "warning", "critical"] = "warning"
    #: Requests per second to the receiver (token bucket of ``burst``); None: the kind's default.
    max_per_second: float | None = Field(default=None, gt=0)
    burst: int = Field(default=1, ge=1)
    #: Alerts per request (Slack messages list several alerts); None: the kind's default.
    max_batch: int | None = Field(default=None, ge=1)
    #: Wait this long after the first pending alert before sending, so a burst goes out as one request.
    group_wait_seconds: float = Field(default=0.0, ge=0)
    #: Minimum time between two notifications for the same (rule, subject); later ones wait and coalesce.
    group_interval_seconds: float = Field(default=0.0, ge=0)
    #: Re-send firing alerts this often until resolved; None: the kind's default (alertmanager 60 s, others never).
    resend_seconds: float | None = Field(default=None, gt=0)
    timeout_seconds: float = Field(default=5.0, gt=0)
    backoff_initial_seconds: float = Field(default=0.5, gt=0)
    backoff_max_seconds: float = Field(default=60.0, gt=0)
    backoff_multiplier: float = Field(default=2.0, ge=1, le=10)
    #: Each backoff delay is reduced by a random fraction up to this, so many hooks do not retry in step.
    jitter: float = Field(default=0.5, ge=0, le=1)
    #: Attempts for a request the receiver rejects (HTTP 4xx other than 408/429) before it is dropped;
    #: unreachable receivers, timeouts and 5xx are retried until ``max_age_seconds``.
    max_retries: int = Field(default=5, ge=1)
    #: Bound on pending deliveries (spooled); beyond it the oldest lowest-severity one is dropped, counted.
    max_pending: int = Field(default=10_000, ge=1)
    #: A delivery still pending after this long is dropped, counted.
    max_age_seconds: float = Field(default=24 * 3600.0, gt=0)
    #: How many delivered (id, status) pairs are remembered (and spooled) to suppress re-sends.
    dedup_memory: int = Field(default=10_000, ge=0)

    @property
    def hook_name(self) -> str:
        return self.name or self.kind

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
            raise ValueError("name must be 1-64 characters of letters, digits, '_', '.', '-'")
        return value

    @field_validator("url", "generator_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"https?://[^/\s]+", value):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _kind_needs(self) -> HookConfig:
        if self.kind in ("webhook", "slack", "alertmanager") and not self.url:
            raise ValueError(f"a {self.kind} hook needs url")
        if self.kind == "pagerduty" and not self.routing_key:
            raise ValueError("a pagerduty hook needs routing_key")
        if self.kind in ("webhook", "pagerduty") and (self.max_batch or 1) > 1:
            raise ValueError(f"a {self.kind} hook sends one alert per request: max_batch must be 1")
        bad_labels = [name for name in self.labels if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
        if bad_labels:
            raise ValueError(f"invalid label names: {', '.join(bad_labels)}")
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError("backoff_max_seconds must be >= backoff_initial_seconds")
        return self


class AlertsConfig(_Section):
    """Where alerts go. Every hook delivers independently: a dead one never holds up the others."""

    hooks: list[HookConfig] = Field(default_factory=lambda: [HookConfig(kind="log")])
    #: Every alert links to its rule's section of the runbook: this base plus ``#<anchor>``. Set it to
    #: where your operators read docs/runbook.md (an http(s) URL: Slack buttons and PagerDuty links
    #: need one); the default is the repository path, which receivers show as text only.
    runbook_base_url: str = DEFAULT_RUNBOOK
    #: An open alert with no new finding for this long (event time) is resolved: most rules have no
    #: "cleared" event of their own, and receivers such as Alertmanager keep firing alerts forever.
    resolve_after_seconds: float = Field(default=3600.0, gt=0)

    @field_validator("runbook_base_url")
    @classmethod
    def _runbook_base(cls, value: str) -> str:
        if not value or re.search(r"[\s<>|]", value) or "#" in value.rstrip("#"):
            raise ValueError("must be a URL or path without spaces or an anchor (#...): the rule's is added")
        return value

    @field_validator("hooks")
    @classmethod
    def _unique_names(cls, hooks: list[HookConfig]) -> list[HookConfig]:
        names = [hook.hook_name for hook in hooks]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"hook names must be unique (set name:); repeated: {', '.join(duplicates)}")
        return hooks


class KubernetesDeployConfig(_Section):
    """``deploy.target: kubernetes``: the SparkApplication the DAGs create, and how they reach the API
    server (deploy/spark/sparkapplication.py, docs/operations.md)."""

    #: ``in_cluster``: the service account of the pod the Airflow task runs in (its mounted token and
    #: CA). ``kubeconfig``: the file ``kubeconfig`` (default ``$KUBECONFIG``, else ``~/.kube/config``)
    #: at its ``context`` (default: its current context).
    auth: Literal["in_cluster", "kubeconfig"] = "in_cluster"
    kubeconfig: str | None = None
    context: str | None = None
    #: Where the SparkApplication is created (the spark-operator must watch it).
    namespace: str = Field(default="kpmon", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    #: Each start creates ``<application>-<UTC time>``, so a run's application is never mistaken for
    #: the one before it; short, as the driver pod and its services are named after it.
    application: str = Field(default="kpmon-stream", pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=30)
    #: The build's image (the job runs the kpmon installed in it). Default:
    #: deploy/k8s/spark/sparkapplication.yaml's.
    image: str | None = None
    #: Where the driver and the executors mount the application's claim (checkpoints-pvc.yaml). The
    #: Airflow worker mounts the same claim at the same path, with ``state_dir`` under it. Default:
    #: deploy/k8s/spark/sparkapplication.yaml's (``/var/lib/kpmon``).
    mount_path: str | None = Field(default=None, pattern=r"^/")


class DeployConfig(_Section):
    """Where the Airflow DAGs run the streaming job, and how they reach it (airflow_dags/jobctl.py,
    docs/operations.md)."""

    #: ``local``: a detached process on the Airflow worker's host. ``standalone``: a driver on a Spark
    #: standalone cluster (``stream.master`` ``spark://``), submitted in cluster mode through the
    #: master's REST submission server. ``yarn``: an application (``stream.master`` ``yarn``) submitted
    #: by spark-submit in cluster mode, watched and killed through the ResourceManager's REST API.
    #: ``kubernetes``: a spark-operator SparkApplication (``stream.master`` ``k8s://``), created,
    #: watched and deleted through the Kubernetes API (``kubernetes`` below).
    target: Literal["local", "standalone", "yarn", "kubernetes"] = "local"
    #: standalone: the master's REST submission server (``spark.master.rest.enabled``). Default: the
    #: master's host at Spark's REST port, 6066. yarn (required): the ResourceManager's web address.
    rest_url: str | None = None
    #: standalone: how the driver gets the Kafka connector (as ``kpmon deploy submit --connector``):
    #: ``packages`` resolves it from Maven Central on the driver; ``jars`` ships ``jars_dir`` (the same
    #: path on every worker); ``provided``: the cluster's classpath has it.
    connector: Literal["packages", "jars", "provided"] = "packages"
    #: standalone, ``connector: jars``: the pre-resolved jars (default: the local cache).
    jars_dir: str | None = None
    driver_cores: int = Field(default=1, gt=0)
    driver_memory: str = "2g"
    #: Spark properties of the submission, over deploy/spark/common.conf and the target's .conf
    #: (kubernetes: over the SparkApplication's ``sparkConf``).
    spark_conf: dict[str, str] = Field(default_factory=dict)
    #: Timeout of one request to the cluster's API.
    request_timeout_seconds: float = Field(default=30.0, gt=0)
    kubernetes: KubernetesDeployConfig = Field(default_factory=KubernetesDeployConfig)

    @model_validator(mode="after")
    def _rest_url(self) -> DeployConfig:
        if self.rest_url is not None and not re.fullmatch(r"https?://[^\s/]+/?", self.rest_url):
            raise ValueError(f"rest_url must be http(s)://HOST:PORT, not {self.rest_url!r}")
        return self


class KpmonConfig(_Section):
    """The whole configuration. Every field has a default that runs the embedded local stack."""

    #: The monitored cluster's name (or id), in every alert, every receiver's payload and the alert id's
    #: input, so a fleet's alerts say where they come from. Default: ``kafka.bootstrap_servers``.
    cluster: str | None = Field(default=None, min_length=1, max_length=200)
    state_dir: str = ".kpmon"
    kafka: KafkaClusterConfig = Field(default_factory=KafkaClusterConfig)
    stack: StackConfig = Field(default_factory=StackConfig)
    tap: TapConfig = Field(default_factory=TapConfig)
    stream: StreamConfig = Field(default_factory=StreamConfig)
    checks: ChecksConfig = Field(default_factory=ChecksConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    deploy: DeployConfig = Field(default_factory=DeployConfig)

    @model_validator(mode="after")
    def _deploy_matches_master(self) -> KpmonConfig:
        target = self.deploy.target
        if target != "local":
            masters = {"standalone": "spark://HOST:PORT", "yarn": "yarn", "kubernetes": "k8s://HOST"}
            if not self.stream.master.startswith(masters[target].split("HOST")[0]):
                raise ValueError(
                    f"deploy.target {target} needs stream.master {masters[target]}, not {self.stream.master!r}"
                )
            if not Path(self.state_dir).is_absolute():
                # The driver runs on a worker: it and the DAGs meet in the state directory (progress,
                # stop marker, shipped config), which must be the same shared mount on both sides.
                raise ValueError(f"deploy.target {target} needs an absolute state_dir on a shared mount")
            if target == "kubernetes" and self.deploy.connector == "jars":
                raise ValueError(
                    "deploy.target kubernetes gets the Kafka connector from the operator (connector: "
                    "packages) or the image (provided), not from jars on the Airflow worker"
                )
            if target == "yarn" and not self.deploy.rest_url:
                raise ValueError(
                    "deploy.target yarn needs deploy.rest_url, the ResourceManager's web address"
                )
        return self

    @property
    def tap_cluster(self) -> KafkaClusterConfig:
        return self.tap.cluster or self.kafka

    @property
    def cluster_name(self) -> str:
        return self.cluster or self.kafka.bootstrap_servers

    def alert_context(self) -> AlertContext:
        """What every alert carries: the cluster and the runbook's base (checks/alerts.py)."""
        return AlertContext(cluster=self.cluster_name, runbook_base=self.alerts.runbook_base_url.rstrip("#"))


# ----- properties per client library -------------------------------------------------------------------

#: librdkafka-only names the translation consumes or that have no Java equivalent.
_LIBRDKAFKA_ONLY = frozenset(
    {
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
        "enable.ssl.certificate.verification",
        "enable.sasl.oauthbearer.unsecure.jwt",
    }
)
_OAUTHBEARER_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _unsecured_oauthbearer_jaas(config: str) -> str:
    """librdkafka's unsecured-token ``sasl.oauthbearer.config`` (``principal=alice scope=a,b
    lifeSeconds=600 extension_k=v``) as the options of Kafka's ``OAuthBearerLoginModule``."""
    options: dict[str, str] = {}
    fields = dict(item.split("=", 1) for item in config.split() if "=" in item)
    if len(fields) != len(config.split()):
        raise ConfigError("properties: sasl.oauthbearer.config is not a list of name=value")
    principal_claim, scope_claim = (
        fields.pop("principalClaimName", "sub"),
        fields.pop("scopeClaimName", "scope"),
    )
    if principal_claim != "sub":
        options["unsecuredLoginPrincipalClaimName"] = principal_claim
    if scope_claim != "scope":
        options["unsecuredLoginScopeClaimName"] = scope_claim
    if "principal" not in fields:
        raise ConfigError("properties: sasl.oauthbearer.config has no principal=")
    options[f"unsecuredLoginStringClaim_{principal_claim}"] = fields.pop("principal")
    if "scope" in fields:
        options[f"unsecuredLoginListClaim_{scope_claim}"] = "," + fields.pop("scope")
    if "lifeSeconds" in fields:
        options["unsecuredLoginLifetimeSeconds"] = fields.pop("lifeSeconds")
    for name in [n for n in fields if n.startswith("extension_")]:
        options[f"unsecuredLoginExtension_{name.removeprefix('extension_')}"] = fields.pop(name)
    if fields:
        raise ConfigError(f"properties: sasl.oauthbearer.config: no Java translation for {sorted(fields)}")
    rendered = " ".join(f"{k}={_jaas_quote(v)}" for k, v in options.items())
    return f"{_OAUTHBEARER_MODULE} required {rendered};"


def java_properties_from_librdkafka(props: dict[str, str]) -> dict[str, str]:
    """The Java client's properties for a librdkafka property map (pure; docs/security.md has the table).

    - ``security.protocol``, ``sasl.mechanism`` and every other shared name pass through unchanged.
    - ``sasl.username``/``sasl.password`` become ``sasl.jaas.config`` with PLAIN's or SCRAM's login module.
    - ``ssl.ca.location`` (a PEM file) becomes a PEM truststore (``ssl.truststore.type=PEM``).
    - ``ssl.certificate.location`` + ``ssl.key.location`` (PEM files) become a PEM keystore with the
      certificate chain and the key inline (``ssl.keystore.certificate.chain``, ``ssl.keystore.key``),
      ``ssl.key.password`` carried over; the Java client wants the key in PKCS#8.
    - ``ssl.endpoint.identification.algorithm=none`` becomes the Java client's empty algorithm.
    - OAUTHBEARER with librdkafka's unsecured tokens (``enable.sasl.oauthbearer.unsecure.jwt=true``)
      becomes ``OAuthBearerLoginModule`` with the ``unsecuredLogin*`` options of ``sasl.oauthbearer.config``.
    - Other librdkafka-only names (``enable.ssl.certificate.verification``, ``sasl.oauthbearer.*``) are
      dropped: the Java client always verifies certificates. Anything else passes through unchanged.

    Raises ConfigError (naming keys, never values) for what has no translation.
    """
    out: dict[str, str] = {}
    for name, value in props.items():
        if name not in _LIBRDKAFKA_ONLY and not name.startswith("sasl.oauthbearer."):
            out[name] = value
    username, password = props.get("sasl.username"), props.get("sasl.password")
    if username is not None or password is not None:
        mechanism = props.get("sasl.mechanism", "GSSAPI").upper()
        module = _LOGIN_MODULES.get(mechanism)
        if module is None:
            raise ConfigError(
                f"properties: sasl.username/sasl.password have no Java translation for sasl.mechanism "
                f"{mechanism}; set java_properties.sasl.jaas.config"
            )
        out["sasl.jaas.config"] = (
            f"{module} required username={_jaas_quote(username or '')} password={_jaas_quote(password or '')};"
        )
    unsecured_jwt = props.get("enable.sasl.oauthbearer.unsecure.jwt", "false").lower() == "true"
    if props.get("sasl.mechanism", "").upper() == "OAUTHBEARER" and unsecured_jwt:
        out["sasl.jaas.config"] = _unsecured_oauthbearer_jaas(props.get("sasl.oauthbearer.config", ""))
    if "ssl.ca.location" in props:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = props["ssl.ca.location"]
    cert, key = props.get("ssl.certificate.location"), props.get("ssl.key.location")
    if (cert is None) != (key is None):
        raise ConfigError("properties: ssl.certificate.location and ssl.key.location go together")
    if cert is not None and key is not None:
        try:
            out["ssl.keystore.certificate.chain"] = Path(cert).read_text()
            out["ssl.keystore.key"] = Path(key).read_text()
        except OSError as exc:
            raise ConfigError(
                f"properties: cannot read a client certificate or key file: {exc.strerror}"
            ) from exc
        out["ssl.keystore.type"] = "PEM"
        if "ssl.key.password" in props:
            out["ssl.key.password"] = props["ssl.key.password"]
    algorithm = props.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        out["ssl.endpoint.identification.algorithm"] = "" if algorithm.lower() == "none" else algorithm
    return out


# ----- loading -----------------------------------------------------------------------------------------


def _set(raw: dict[str, Any], origin: str, path: list[str], value: Any) -> None:
    node = raw
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {'.'.join(path[:-1])} is not a section")
        node = child
    node[path[-1]] = value


def _key_path(spec: str) -> list[str]:
    return [part.lower() for part in spec.split("__") if part]


def _read_secret(origin: str, path: Path) -> str:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{origin}: cannot read secret file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{origin}: secret file {path} is not UTF-8 text") from exc
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def _apply_secrets_dir(raw: dict[str, Any], directory: str) -> dict[str, Any]:
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"{SECRETS_DIR_ENV}: {directory} is not a directory")
    for entry in sorted(root.iterdir()):
        # Kubernetes mounts a Secret's keys as symlinks next to ``..data``; hidden entries are its own.
        if entry.name.startswith(".") or not entry.is_file():
            continue
        path = _key_path(entry.name)
        if path:
            _set(raw, f"{SECRETS_DIR_ENV} file {entry.name}", path, _read_secret(entry.name, entry))
    return raw


def _apply_env(raw: dict[str, Any], environ: dict[str, str]) -> dict[str, Any]:
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        from_file = name.endswith(FILE_SUFFIX)
        spec = name[len(ENV_PREFIX) : -len(FILE_SUFFIX) if from_file else None]
        path = _key_path(spec)
        if not path:
            continue
        if from_file:
            if ENV_PREFIX + spec in environ:
                raise ConfigError(f"{name} and {ENV_PREFIX + spec} both set {'.'.join(path)}: keep one")
            _set(raw, name, path, _read_secret(name, Path(value)))
            continue
        try:
            parsed = yaml.safe_load(value) if value else value
        except yaml.YAMLError as exc:
            raise ConfigError(f"{name}: not a valid YAML scalar (quote it): {exc}") from exc
        _set(raw, name, path, parsed)
    return raw


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by the owner only (0600): for config copies that may hold secrets.

    The file is created 0600 and an existing file is narrowed to 0600 before it is rewritten, so the
    secret is never readable by others, whatever the umask.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)
    return path


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> KpmonConfig:
    """Load ``path`` (YAML; optional), then the secrets directory, then ``KPMON__*`` environment overrides."""
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
    env = dict(os.environ) if environ is None else environ
    if env.get(SECRETS_DIR_ENV):
        raw = _apply_secrets_dir(raw, env[SECRETS_DIR_ENV])
    raw = _apply_env(raw, env)
    try:
        return KpmonConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        raise ConfigError(f"invalid config: {problems}") from exc
