"""What ``kpmon run`` starts, as one config: the file the tap and the streaming subprocesses read.

Pure: configs and addresses in, a config out. Embedded defaults point everything at the local stack
(clients reach the broker only through the tap, the mirror and the job use the brokers' inter-broker
listener so their traffic never loops through the tap); ``--config`` mode checks that an existing
cluster's config has what the run needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from kpconfig.model import ConfigError, KafkaClusterConfig, KpmonConfig, TapListenerConfig

HOST = "127.0.0.1"
DEFAULT_TAP_PORT = 29092

#: Demo tuning, applied only where the user's config (or a KPMON__* variable) did not set the field:
#: a short watermark so alerts fire seconds after the violation, and the stateful stage sized for 2 cores.
DEMO_TUNING: dict[str, dict[str, Any]] = {
    "checks": {"watermark_seconds": 2.0},
    "stream": {"shuffle_partitions": 2},
    "quality": {"docs_every_batches": 30},
}


@dataclass(frozen=True)
class RunLayout:
    """Files of one run, all under ``<state_dir>/run`` (the job keeps its own under ``<state_dir>/stream``)."""

    state_dir: Path

    @property
    def root(self) -> Path:
        return self.state_dir / "run"

    @property
    def config_file(self) -> Path:
        return self.root / "kpmon.yaml"

    @property
    def stack_home(self) -> Path:
        return self.root / "stack"

    @property
    def report(self) -> Path:
        return self.root / "report" / "index.html"

    @property
    def tap_log(self) -> Path:
        return self.root / "tap.log"

    @property
    def clients_log(self) -> Path:
        """The demo clients' own (librdkafka) log lines."""
        return self.root / "clients.log"

    @property
    def run_log(self) -> Path:
        """Everything ``kpmon run`` says, also when its terminal or output pipe is gone."""
        return self.root / "run.log"

    @property
    def processes(self) -> Path:
        """What the run started (``kpmon.runner.watchdog.RunRegistry``)."""
        return self.root / "processes.json"

    @property
    def watchdog_log(self) -> Path:
        return self.root / "watchdog.log"

    @property
    def stream_log(self) -> Path:
        """The job's stderr before it moves Spark's output to ``stream/spark.log``, and its last words."""
        return self.root / "stream.log"


@dataclass(frozen=True)
class Broker:
    """A broker's real client listener, which a tap forwards to."""

    node_id: int
    host: str
    port: int


def tap_ports(first: int, brokers: int) -> list[int]:
    """One tap port per broker, consecutive from ``first``."""
    return list(range(first, first + brokers))


def _unset_defaults(model: BaseModel, values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k not in model.model_fields_set}


def embedded_config(
    base: KpmonConfig, state_dir: Path, brokers: list[Broker], internal_bootstrap: str, first_tap_port: int
) -> KpmonConfig:
    """The config for the local stack: a tap port per broker, the tap topic on the internal listener."""
    ports = tap_ports(first_tap_port, len(brokers))
    listeners = [
        TapListenerConfig(listen=f"{HOST}:{port}", broker=f"{b.host}:{b.port}", broker_id=b.node_id)
        for b, port in zip(brokers, ports, strict=True)
    ]
    tap = base.tap.model_copy(
        update={
            "listeners": listeners,
            "cluster": KafkaClusterConfig(bootstrap_servers=internal_bootstrap),
            "instance_id": base.tap.instance_id or "kpmon-run",
        }
    )
    updates: dict[str, Any] = {
        "state_dir": str(state_dir.resolve()),
        "kafka": KafkaClusterConfig(bootstrap_servers=",".join(t.listen for t in listeners)),
        "tap": tap,
    }
    for section, values in DEMO_TUNING.items():
        current: BaseModel = getattr(base, section)
        wanted = _unset_defaults(current, values)
        if wanted:
            updates[section] = current.model_copy(update=wanted)
    return _revalidate(base.model_copy(update=updates))


def external_config(config: KpmonConfig, state_dir: Path, source: str = "the config") -> KpmonConfig:
    """``--config`` mode: the user's config, checked for what a run needs, with the state directory set.

    Raises ``ConfigError`` naming what is missing or would loop.
    """
    if not config.tap.listeners:
        raise ConfigError(
            f"{source}: tap.listeners is empty: kpmon run needs one tap listener per broker "
            "(listen: HOST:PORT, broker: HOST:PORT, broker_id: N), with the brokers advertising the "
            "tap's addresses (or tap.rewrite_broker_addresses: true)"
        )
    if "kafka" not in config.model_fields_set and config.tap.cluster is None:
        raise ConfigError(
            f"{source}: no cluster for the tap topic: set tap.cluster.bootstrap_servers (or "
            "kafka.bootstrap_servers) to brokers reached directly, not through the tap"
        )
    listens = [listener.listen for listener in config.tap.listeners]
    repeated = sorted({addr for addr in listens if listens.count(addr) > 1})
    if repeated:
        raise ConfigError(f"{source}: tap.listeners listen more than once on {', '.join(repeated)}")
    looped = sorted(set(config.tap_cluster.bootstrap_servers.split(",")) & set(listens))
    if looped:
        raise ConfigError(
            f"{source}: the tap topic's cluster ({config.tap_cluster.bootstrap_servers}) is reached through "
            f"the tap ({', '.join(looped)}): the tap would mirror its own mirroring. Point "
            "tap.cluster.bootstrap_servers at the brokers directly"
        )
    return _revalidate(config.model_copy(update={"state_dir": str(state_dir.resolve())}))


def _revalidate(config: KpmonConfig) -> KpmonConfig:
    """``model_copy`` skips validation: round-trip through the dump the subprocesses will load."""
    return KpmonConfig.model_validate(config_dict(config))


def config_dict(config: KpmonConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")


def config_yaml(config: KpmonConfig) -> str:
    header = "# Written by `kpmon run`: the effective config of this run (rewritten at each start).\n"
    return header + yaml.safe_dump(config_dict(config), sort_keys=False)


def default_state_dir(config: KpmonConfig, home: Path) -> Path:
    """``state_dir`` when the config (or KPMON__STATE_DIR) sets it, else ``$KPMON_HOME``."""
    return Path(config.state_dir) if "state_dir" in config.model_fields_set else home
