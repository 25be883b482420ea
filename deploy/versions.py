"""Pinned upstream versions. One place, so the codec, the stack and the Spark connector agree."""

from __future__ import annotations

#: Newest Kafka 4.x on Maven Central: the default broker and the primary source of message definitions.
KAFKA_LATEST = "4.4.0"
#: Newest 3.9.x: the second broker kind, and the definitions of versions that 4.0 removed (KIP-896).
KAFKA_LEGACY = "3.9.2"
#: Newest first: for every API version the codec takes the definition from the first release that has it.
KAFKA_RELEASES = (KAFKA_LATEST, KAFKA_LEGACY)

#: Newest kafka-streams on Maven Central (4.4.0's was never published there, like its kafka-tools): the
#: real Kafka Streams app of the client matrix (KIP-1071's streams protocol), with its own kafka-clients.
KAFKA_STREAMS = "4.3.1"

SCALA_BINARY = "2.13"

#: Hadoop release of the local YARN cluster (deploy/yarn.py): a ResourceManager and a NodeManager that
#: pyspark's Hadoop client (3.5) submits to.
HADOOP_YARN = "3.4.1"
