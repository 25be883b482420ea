"""The tap-topic cluster options that ``kpmon report --topic`` and ``kpmon decode --topic`` share.

The cluster is the config's tap-topic cluster (``tap.cluster``, else ``kafka``): its bootstrap servers
unless ``--bootstrap-servers`` is given, and always its librdkafka ``properties`` (SASL, TLS), so a
secured cluster is read with the same credentials as the rest of kpmon. ``-X name=value`` adds or
overrides one librdkafka property for this run (like kcat's ``-X``).
"""

from __future__ import annotations

import argparse
from typing import Any

from kpmon.config import KpmonConfig


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
        help="with --pcap: a port brokers listen on (repeatable; 9092 and the ports Metadata announces are added)",
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


class TopicReadError(ValueError):
    """The tap topic cannot be read: bad client properties, the cluster refused us, no such topic."""


def consumer_config(args: argparse.Namespace, group_prefix: str) -> dict[str, Any]:
    """A reader's consumer config: the cluster's properties, then what a throwaway reader needs."""
    return {
        **getattr(args, "properties", {}),
        "bootstrap.servers": args.bootstrap_servers,
        # A throwaway group: readers never commit, and must not disturb the streaming job.
        "group.id": f"{group_prefix}-{id(args)}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }


def open_tap_topic(args: argparse.Namespace, group_prefix: str) -> Any:
    """A consumer assigned to every partition of ``args.topic`` from the beginning.

    Raises TopicReadError with librdkafka's reason (a missing ``sasl.password``, an authentication or
    TLS failure, an unknown topic) instead of a traceback.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    where = f"tap topic {args.topic!r} on {args.bootstrap_servers}"
    try:
        consumer = Consumer(consumer_config(args, group_prefix))
    except KafkaException as exc:
        raise TopicReadError(f"cannot read {where}: {exc.args[0].str()}") from None
    try:
        metadata = consumer.list_topics(args.topic, timeout=10)
    except KafkaException as exc:
        consumer.close()
        raise TopicReadError(
            f"cannot read {where}: {exc.args[0].str()} (check tap.cluster.properties: security.protocol, sasl.*, ssl.*)"
        ) from None
    topic = metadata.topics.get(args.topic)
    if topic is None or topic.error is not None:
        consumer.close()
        raise TopicReadError(f"{where} not found")
    consumer.assign([TopicPartition(args.topic, p, -2) for p in topic.partitions])
    return consumer
