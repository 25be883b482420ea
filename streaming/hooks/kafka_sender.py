"""The alerts-topic hook: JSON values keyed by alert id, with a confluent-kafka producer.

The producer is created lazily in the hook's thread, so a broker that is down at start delays nothing.
Each batch is produced and flushed with a deadline: librdkafka reports every message (delivered, or
failed after ``message.timeout.ms`` = the hook timeout), and anything unreported by the deadline counts
as a transient failure, to be re-sent (receivers deduplicate on the key).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kpconfig.model import KafkaClusterConfig
from streaming.hooks.core import Result
from streaming.hooks.formatters import AlertDict, kafka_record
from streaming.hooks.sender import SendResult

log = logging.getLogger("kpmon.alerts.hooks")

#: Errors that re-sending the same record cannot fix: retried a few times (max_retries), then dropped.
_PERMANENT = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError._INVALID_ARG,
}


def classify(error: KafkaError | None) -> Result:
    if error is None:
        return Result.OK
    return Result.PERMANENT if error.code() in _PERMANENT else Result.TRANSIENT


class KafkaSender:
    def __init__(
        self,
        cluster: KafkaClusterConfig,
        topic: str,
        *,
        timeout: float,
        create_topic: bool = True,
        client_id: str = "kpmon-alerts",
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.timeout = timeout
        self.create_topic = create_topic
        self.client_id = client_id
        self._producer: Producer | None = None
        self._topic_ready = not create_topic

    def _config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.cluster.bootstrap_servers,
            **self.cluster.properties,
            "client.id": self.client_id,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": max(1000, int(self.timeout * 1000)),
            "socket.timeout.ms": max(1000, int(self.timeout * 1000)),
            "logger": logging.getLogger("kpmon.alerts.kafka"),
        }

    def _ensure_topic(self) -> None:
        """Create the topic once if it is missing; a failure is logged and producing goes ahead (the
        broker may auto-create it, or the produce fails and is retried)."""
        if self._topic_ready:
            return
        conf = {
            k: v for k, v in self._config().items() if k not in ("acks", "linger.ms", "message.timeout.ms")
        }
        admin = AdminClient(conf)
        try:
            metadata = admin.list_topics(timeout=self.timeout)
            if self.topic not in metadata.topics:
                future = admin.create_topics([NewTopic(self.topic)], operation_timeout=self.timeout)[
                    self.topic
                ]
                try:
                    future.result(timeout=self.timeout)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise
                log.info("alerts topic %s created", self.topic)
            self._topic_ready = True
        except Exception as exc:
            log.warning("alerts topic %s: could not check or create it: %s", self.topic, exc)

    def send(self, alerts: Sequence[AlertDict]) -> SendResult:
        self._ensure_topic()
        if self._producer is None:
            self._producer = Producer(self._config())
        producer = self._producer
        results: list[Result | None] = [None] * len(alerts)
        errors: list[str] = []

        def reporter(index: int) -> Any:
            def on_delivery(error: KafkaError | None, _message: Message) -> None:
                results[index] = classify(error)
                if error is not None:
                    errors.append(error.str())

            return on_delivery

        for index, alert in enumerate(alerts):
            record = kafka_record(alert)
            try:
                producer.produce(
                    self.topic, record.value, record.key, headers=record.headers, on_delivery=reporter(index)
                )
            except BufferError as exc:
                results[index] = Result.TRANSIENT
                errors.append(f"producer queue full: {exc}")
            except (KafkaException, TypeError, ValueError) as exc:
                results[index] = Result.PERMANENT
                errors.append(str(exc))
        producer.flush(self.timeout + 1.0)
        final = [Result.TRANSIENT if result is None else result for result in results]
        if any(result is None for result in results):
            errors.append("no delivery report before the deadline")
        error = f"{self.topic} on {self.cluster.bootstrap_servers}: {errors[0]}" if errors else ""
        return SendResult(final, error)

    def close(self) -> None:
        if self._producer is not None:
            # Whatever is still queued stays pending in the spool; do not wait for a dead broker here.
            self._producer.purge()
            self._producer.flush(0)
            self._producer = None
