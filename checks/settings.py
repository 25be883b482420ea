"""What the checks engine can be told: one frozen value, owned here.

The engine, the rules and the shards read only this. ``kpconfig.model.ChecksConfig`` (the ``checks:``
section of the YAML config) takes its defaults from ``DEFAULTS`` and turns itself into these settings
with ``settings()``, so the checks never import the application's config model (as ``tap.proxy``'s
``TapSettings`` keeps the tap free of it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChecksSettings:
    #: Lateness the engine waits for before releasing frames in event-time order.
    watermark_seconds: float = 10.0
    #: How long idle state lives, by key kind (``checks.rule.KEY_TTL_FIELDS``).
    connection_ttl_seconds: float = 3600.0
    group_ttl_seconds: float = 24 * 3600.0
    producer_ttl_seconds: float = 7 * 24 * 3600.0
    #: Bound on each state container of one key; the oldest entries go first, counted.
    max_entries_per_key: int = 10_000
    #: Client addresses (host or host:port) whose connections count as inter-broker (KIP-590).
    broker_client_addresses: tuple[str, ...] = ()
    #: Listener names whose connections count as inter-broker (KIP-590).
    broker_listeners: tuple[str, ...] = field(default=("CONTROLLER", "BROKER", "REPLICATION"))

    def __post_init__(self) -> None:
        # Callers may pass lists (YAML gives lists); a frozen value keeps tuples.
        for name in ("broker_client_addresses", "broker_listeners"):
            value: Iterable[str] = getattr(self, name)
            object.__setattr__(self, name, tuple(value))
        if self.watermark_seconds < 0:
            raise ValueError(f"watermark_seconds must be >= 0, got {self.watermark_seconds}")
        if self.max_entries_per_key < 1:
            raise ValueError(f"max_entries_per_key must be >= 1, got {self.max_entries_per_key}")


DEFAULTS = ChecksSettings()
