"""A gateway's two Kafka jobs with librdkafka (the ``confluent-kafka`` wheel), no authpipe code.

1. report login attempts to ``auth.login-attempts`` (``AttemptReporter``): one UTF-8 JSON
   ``login_attempt`` v1 object per attempt, key = the claimed account, ``acks=all`` with
   idempotence (an attempt acknowledged is on ``min.insync.replicas`` brokers, a retry is
   never counted twice);
2. hold ``auth.throttle-decisions`` as a table (``DecisionTable``): read every partition
   from the beginning to its end at start, then follow it; a value sets its key, a null
   value (tombstone: the decision was lifted or expired) deletes it. No consumer group
   offsets are committed: a gateway rebuilds its table at every start, as compaction
   keeps the topic small.

Connection settings come from the same ``AUTHPIPE_KAFKA_*`` variables as every authpipe
client (``client_config``): bootstrap servers, ``SECURITY_PROTOCOL`` (SASL_SSL in
production), the SASL mechanism, user and password, the CA bundle and, for mutual TLS,
a client certificate and key (PEM).

Run: ``python gateway.py report ACCOUNT SOURCE_IP COUNT`` (COUNT failed attempts; prints
each event as a JSON line) or ``python gateway.py table`` (prints the table loaded to the
end as one JSON object: ``{"records": n, "tombstones": n, "table": {key: decision}}``).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

INPUT_TOPIC = os.environ.get("AUTHPIPE_KAFKA_INPUT_TOPIC", "auth.login-attempts")
DECISIONS_TOPIC = os.environ.get("AUTHPIPE_KAFKA_DECISIONS_TOPIC", "auth.throttle-decisions")
SERVICE = "librdkafka-gateway"
TIMEOUT_S = 30.0

# AUTHPIPE_KAFKA_<name> -> librdkafka property.
_ENV_TO_LIBRDKAFKA = {
    "BOOTSTRAP_SERVERS": "bootstrap.servers",
    "SECURITY_PROTOCOL": "security.protocol",
    "SASL_MECHANISM": "sasl.mechanism",
    "SASL_USERNAME": "sasl.username",
    "SASL_PASSWORD": "sasl.password",
    "SSL_CAFILE": "ssl.ca.location",
    "SSL_CERTFILE": "ssl.certificate.location",
    "SSL_KEYFILE": "ssl.key.location",
}


def client_config(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """librdkafka properties from the ``AUTHPIPE_KAFKA_*`` variables that are set. The
    broker's certificate is verified against the CA and its host name (librdkafka's
    default ``ssl.endpoint.identification.algorithm=https``)."""
    config: dict[str, Any] = {"bootstrap.servers": "127.0.0.1:9092", "client.id": SERVICE}
    for name, prop in _ENV_TO_LIBRDKAFKA.items():
        value = env.get(f"AUTHPIPE_KAFKA_{name}")
        if value:
            config[prop] = value
    if str(config.get("security.protocol", "")).startswith("SASL_"):
        config.setdefault("sasl.mechanism", "SCRAM-SHA-512")
    return config


def attempt_event(
    account: str, peer_ip: str, ok: bool, failure_reason: str | None, tenant: str = "default"
) -> dict[str, Any]:
    """One ``login_attempt`` v1 event (docs/contract.md); never the password."""
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {
        "event_id": str(uuid.uuid4()),
        "occurred_at": now,
        "tenant": tenant,
        "service": SERVICE,
        "flow": "password",
        "account": account,
        "peer_ip": peer_ip,
        "forwarded_for": [],
        "device_id": None,
        "device_trusted": False,
        "outcome": "success" if ok else "failure",
        "failure_reason": failure_reason,
    }


class AttemptReporter:
    """Sends attempts with acks=all and idempotence; ``flush`` raises if any failed."""

    def __init__(self, config: Mapping[str, Any], topic: str = INPUT_TOPIC) -> None:
        self.topic = topic
        self.failed: list[str] = []
        self.producer = Producer(
            {**config, "acks": "all", "enable.idempotence": True, "linger.ms": 5}
        )

    def report(self, event: Mapping[str, Any]) -> None:
        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                self.failed.append(str(err))

        self.producer.produce(
            self.topic,
            value=json.dumps(event).encode(),
            key=str(event["account"]).encode(),
            on_delivery=delivered,
        )
        self.producer.poll(0)

    def flush(self, timeout_s: float = TIMEOUT_S) -> None:
        left = self.producer.flush(timeout_s)
        if left or self.failed:
            raise KafkaException(f"{left} attempts unsent, failures: {self.failed}")


class DecisionTable:
    """The decisions topic as a table: key -> the decision's JSON (tombstones delete)."""

    def __init__(self, config: Mapping[str, Any], topic: str = DECISIONS_TOPIC) -> None:
        self.topic = topic
        self.table: dict[str, dict[str, Any]] = {}
        self.records = 0
        self.tombstones = 0
        # group.id is required by librdkafka's consumer; nothing is ever committed.
        self.consumer = Consumer(
            {
                **config,
                "group.id": f"{SERVICE}-table",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return  # every decision has a key; skip anything else
        self.records += 1
        if value is None:
            self.tombstones += 1
            self.table.pop(key.decode(), None)
        else:
            self.table[key.decode()] = json.loads(value)

    def load(self, timeout_s: float = TIMEOUT_S) -> None:
        """Read every partition from the beginning to its end offset as of now."""
        metadata = self.consumer.list_topics(self.topic, timeout=timeout_s)
        partitions = sorted(metadata.topics[self.topic].partitions)
        ends = {}
        for p in partitions:
            _low, high = self.consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), timeout=timeout_s
            )
            ends[p] = high
        self.consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
        behind = {p for p, end in ends.items() if end > 0}
        while behind:
            msg = self.consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            if msg.offset() < ends[msg.partition()]:
                self.apply(msg.key(), msg.value())
            if msg.offset() + 1 >= ends[msg.partition()]:
                behind.discard(msg.partition())

    def follow_once(self, timeout_s: float = 1.0) -> None:
        """Apply what arrived since (call in the gateway's loop after ``load``)."""
        msg = self.consumer.poll(timeout_s)
        if msg is not None and not msg.error():
            self.apply(msg.key(), msg.value())

    def close(self) -> None:
        self.consumer.close()


def main(argv: list[str]) -> int:
    config = client_config()
    if argv[:1] == ["report"] and len(argv) == 4:
        account, peer_ip, count = argv[1], argv[2], int(argv[3])
        reporter = AttemptReporter(config)
        for _ in range(count):
            event = attempt_event(account, peer_ip, ok=False, failure_reason="bad_password")
            reporter.report(event)
            print(json.dumps(event))
        reporter.flush()
        return 0
    if argv == ["table"]:
        table = DecisionTable(config)
        try:
            table.load()
        finally:
            table.close()
        out = {"records": table.records, "tombstones": table.tombstones, "table": table.table}
        print(json.dumps(out, sort_keys=True))
        return 0
    print(__doc__.split("Run: ")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
