"""Reading the tap topic: the cluster options of ``kpmon report --topic`` and ``kpmon decode --topic``,
the consumer every reader opens, and the one poll loop they share (the live report's reader too).

The cluster is the config's tap-topic cluster (``tap.cluster``, else ``kafka``): its bootstrap servers
unless ``--bootstrap-servers`` is given, and always its librdkafka ``properties`` (SASL, TLS), so a
secured cluster is read with the same credentials as the rest of kpmon. ``-X name=value`` adds or
overrides one librdkafka property for this run (like kcat's ``-X``).
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kpconfig.model import KpmonConfig


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-servers", help="tap topic cluster (default: tap.cluster, else kafka, from the config)"
    )
    parser.add_argument(
        "-X",
        "--property",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="librdkafka property for the tap topic cluster, over the config's properties (repeatable)",
    )


def add_source_options(parser: argparse.ArgumentParser) -> Any:
    """Where tap records come from (``kpmon report``, ``kpmon export``): a capture file or the tap
    topic, and how much of the topic to read. Returns the group of sources, for a command's own."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--capture", help="capture file of tap records, JSON lines ('-' for stdin)")
    source.add_argument("--topic", help="tap topic to read (default: tap.topic from the config)")
    add_cluster_options(parser)
    parser.add_argument("--max", type=int, default=None, help="stop after this many records from the topic")
    parser.add_argument(
        "--idle-timeout", type=float, default=5.0, help="stop reading the topic after this many idle seconds"
    )
    return source


def add_pcap_options(source: Any, parser: argparse.ArgumentParser) -> None:
    """``--pcap`` as a source (``kpmon report``, ``kpmon decode``) and the broker ports it needs."""
    source.add_argument(
        "--pcap",
        help="pcap or pcapng of client-broker traffic (TCP reassembled by tshark; docs/quickstart.md)",
    )
    parser.add_argument(
        "--broker-port",
        type=int,
        action="append",
        default=[],
        help="with --pcap: read this port as a broker's (repeatable); without it, Kafka is found on any port "
        "by its streams' first bytes, and the ports Metadata announces are added",
    )


def resolve_cluster(args: argparse.Namespace, config: KpmonConfig) -> None:
    """Set ``args.bootstrap_servers`` and ``args.properties`` from the options and the config.

    Raises ValueError for a ``-X`` without ``=`` (its text is not echoed: it may be a password).
    """
    cluster = config.tap_cluster
    args.bootstrap_servers = args.bootstrap_servers or cluster.bootstrap_servers
    properties = dict(cluster.properties)
    for item in args.property:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError("-X/--property takes NAME=VALUE")
        properties[name.strip()] = value
    args.properties = properties


class InputError(ValueError):
    """A source of frames that cannot be read: a capture file, a pcap, bad hex, the tap topic."""


class TopicReadError(InputError):
    """The tap topic cannot be read: bad client properties, the cluster refused us, no such topic."""


def reader_config(bootstrap_servers: str, properties: dict[str, Any], group_prefix: str) -> dict[str, Any]:
    """A reader's consumer config: the cluster's properties, then what a throwaway reader needs."""
    return {
        **properties,
        "bootstrap.servers": bootstrap_servers,
        # A throwaway group: readers never commit, and must not disturb the streaming job.
        "group.id": f"{group_prefix}-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }


def consumer_config(args: argparse.Namespace, group_prefix: str) -> dict[str, Any]:
    """``reader_config`` for a command's resolved cluster options."""
    return reader_config(args.bootstrap_servers, getattr(args, "properties", {}), group_prefix)


def open_topic(
    bootstrap_servers: str, properties: dict[str, Any], topic: str, group_prefix: str
) -> tuple[Any, list[int]]:
    """A consumer assigned to every partition of ``topic`` from the beginning, and those partitions.

    Raises TopicReadError with librdkafka's reason (a missing ``sasl.password``, an authentication or
    TLS failure, an unknown topic) instead of a traceback.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    where = f"tap topic {topic!r} on {bootstrap_servers}"
    try:
        consumer = Consumer(reader_config(bootstrap_servers, properties, group_prefix))
    except KafkaException as exc:
        raise TopicReadError(f"cannot read {where}: {exc.args[0].str()}") from None
    try:
        metadata = consumer.list_topics(topic, timeout=10)
    except KafkaException as exc:
        consumer.close()
        raise TopicReadError(
            f"cannot read {where}: {exc.args[0].str()} (check tap.cluster.properties: security.protocol, sasl.*, ssl.*)"
        ) from None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        consumer.close()
        raise TopicReadError(f"{where} not found")
    partitions = sorted(found.partitions)
    consumer.assign([TopicPartition(topic, p, -2) for p in partitions])
    return consumer, partitions


def open_tap_topic(args: argparse.Namespace, group_prefix: str) -> Any:
    """``open_topic`` for a command's resolved cluster options and ``--topic``: the consumer."""
    return open_topic(args.bootstrap_servers, getattr(args, "properties", {}), args.topic, group_prefix)[0]


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """One record of the tap topic as a reader gets it: headers decoded, its place in the topic."""

    headers: dict[str, str]
    value: bytes | None
    topic: str
    partition: int
    offset: int


def poll_records(
    consumer: Any,
    *,
    idle_timeout: float,
    max_records: int | None = None,
    done: Callable[[], bool] | None = None,
    idle_error: str | None = None,
) -> Iterator[TopicRecord]:
    """Records from ``consumer`` until ``max_records`` were read, ``done()`` holds, or ``idle_timeout``
    seconds pass without a record: then the reading ends, or raises TopicReadError(``idle_error``) when
    one is given (a reader that knows more records must come). A consumer error raises TopicReadError."""
    from confluent_kafka import KafkaError

    from codec.taprecord import headers_dict

    seen = 0
    idle = 0.0
    while (max_records is None or seen < max_records) and not (done is not None and done()):
        msg = consumer.poll(0.5)
        if msg is None:
            idle += 0.5
            if idle >= idle_timeout:
                if idle_error is not None:
                    raise TopicReadError(idle_error)
                return
            continue
        idle = 0.0
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                continue
            raise TopicReadError(f"consumer error: {error}")
        seen += 1
        yield TopicRecord(
            headers_dict(msg.headers() or []),
            msg.value(),
            str(msg.topic()),
            int(msg.partition() or 0),
            int(msg.offset() or 0),
        )
