"""The faust app every worker runs: its broker options (the credentials built from the
same settings as every other Kafka client) and the web and consumer settings the worker
depends on. The agents, topics and pages are the worker's (``pipeline.stream.app``)."""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer

from pipeline.kafka_client import PRODUCER_GUARANTEES, REQUEST_TIMEOUT_S, security_kwargs
from pipeline.settings import KafkaSettings, Settings

# Every topic the worker declares carries bytes: the stages encode their own envelopes.
RAW: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}


def broker_credentials(kafka: KafkaSettings) -> Any:
    """faust's form of ``security_kwargs``: None for PLAINTEXT, else SSL or SASL credentials
    (faust passes them to its consumer, producer and admin client)."""
    security = security_kwargs(kafka)
    if not security:
        return None
    if kafka.security_protocol == "SSL":
        return faust.SSLCredentials(security["ssl_context"])
    return faust.SASLCredentials(
        username=security["sasl_plain_username"],
        password=security["sasl_plain_password"],
        mechanism=security["sasl_mechanism"],
        ssl_context=security.get("ssl_context"),
    )


class _ConsumerThread(AIOKafkaConsumerThread):
    """faust's consumer thread whose aiokafka consumer asks for fetch answers within
    ``worker.stage_fetch_wait_ms`` instead of faust's fixed 1,500 ms.

    aiokafka sends one fetch at a time per broker, for the partitions with nothing still
    to consume; a partition whose records are consumed while that fetch waits is fetched
    only once it returns. With every other partition quiet, that was up to 1.5 s for an
    envelope already on the broker, and ingest's backpressure, waiting for the stage,
    kept the others quiet (bench B7)."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Read by AIOKafkaConsumer.start() when it builds its fetcher (not started yet).
        app: Any = self.app  # an _App (it builds this thread)
        consumer._fetch_max_wait_ms = app.stage_fetch_wait_ms
        return consumer


class _Consumer(AIOKafkaConsumer):
    def _new_consumer_thread(self) -> Any:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _App(faust.App):
    """faust's App whose producer writes with ``PRODUCER_GUARANTEES`` (acks=all and
    idempotence; faust itself asks for idempotence only inside transactions) and whose
    consumer waits ``stage_fetch_wait_ms`` for fetch answers (``_ConsumerThread``)."""

    def __init__(self, *args: Any, stage_fetch_wait_ms: int, **kwargs: Any) -> None:
        self.stage_fetch_wait_ms = stage_fetch_wait_ms
        super().__init__(*args, **kwargs)

    def _new_consumer(self) -> Any:
        return _Consumer(
            self.transport,
            callback=self.topics.on_message,
            on_partitions_revoked=self._on_partitions_revoked,
            on_partitions_assigned=self._on_partitions_assigned,
            beacon=self.beacon,
            loop=self.transport.loop,
        )

    def _new_producer(self) -> Any:
        producer: Any = super()._new_producer()
        extra = producer._settings_extra
        producer._settings_extra = lambda: {**extra(), **PRODUCER_GUARANTEES}
        return producer


def new_app(s: Settings) -> faust.App:
    """The faust app for ``s`` (no agents yet)."""
    app = _App(
        s.kafka.app_id,
        broker=[f"kafka://{host}" for host in s.kafka.bootstrap_servers.split(",")],
        broker_credentials=broker_credentials(s.kafka),
        topic_partitions=s.kafka.partitions,
        topic_replication_factor=s.kafka.replication_factor,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        # A crashed worker's partitions move after the session timeout: keep it short
        # so a restart or a peer takes over in seconds, not faust's default minute.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_request_timeout=REQUEST_TIMEOUT_S,
        producer_request_timeout=REQUEST_TIMEOUT_S,
        web_enabled=True,
        # Only /healthz, /readyz and /metrics (_add_views), plus faust's plain index at
        # / ({"status": "OK"}): none of its pages that show or reroute internal state
        # (/router, /table, /stats, /graph, /performance), which have no auth.
        web_router_enabled=False,
        web_tables_enabled=False,
        web_stats_enabled=False,
        web_graph_enabled=False,
        web_metrics_enabled=False,
        web_port=s.worker.web_port,
        web_bind=s.worker.web_host,
        web_host=s.worker.web_host,
        datadir=str(s.state_dir / "faust"),
        loghandlers=[],
        producer_acks=-1,
        stream_buffer_maxsize=64,
        broker_max_poll_records=64,
        stage_fetch_wait_ms=s.worker.stage_fetch_wait_ms,
    )
    return app
