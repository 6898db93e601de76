"""The one place Kafka client options are built from settings: bootstrap and security.

Every client authpipe opens (the faust app, the worker's ingest and restore readers, the
admin client, the audit sink, the edge feed, the simulator, the scorecard and backtest
readers) takes ``client_kwargs(settings.kafka)``, or ``security_kwargs`` beside a
bootstrap it already has, so TLS and SASL apply everywhere or nowhere.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pipeline.settings import KafkaSettings


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """A client TLS context: verifies the broker (against ``ssl_cafile`` if given, else the
    system's CAs) and checks its host name; presents a client certificate if configured."""
    context = ssl.create_default_context(
        cafile=str(kafka.ssl_cafile) if kafka.ssl_cafile is not None else None
    )
    if kafka.ssl_certfile is not None and kafka.ssl_keyfile is not None:
        context.load_cert_chain(str(kafka.ssl_certfile), str(kafka.ssl_keyfile))
    return context


def security_kwargs(kafka: KafkaSettings) -> dict[str, Any]:
    """aiokafka keyword arguments for the connection security of ``kafka`` (empty for
    PLAINTEXT, so a plain setup passes nothing new)."""
    protocol = kafka.security_protocol
    if protocol == "PLAINTEXT":
        return {}
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol.endswith("SSL"):
        options["ssl_context"] = ssl_context(kafka)
    if protocol.startswith("SASL_"):
        assert kafka.sasl_password is not None  # KafkaSettings checks it
        options.update(
            sasl_mechanism=kafka.sasl_mechanism,
            sasl_plain_username=kafka.sasl_username,
            sasl_plain_password=kafka.sasl_password.get_secret_value(),
        )
    return options


def client_kwargs(kafka: KafkaSettings) -> dict[str, Any]:
    """``bootstrap_servers`` plus ``security_kwargs``: what every aiokafka client takes."""
    return {"bootstrap_servers": kafka.bootstrap_servers, **security_kwargs(kafka)}


# Every producer of ours: a write is acknowledged only once ``min.insync.replicas`` replicas
# have it (a leader lost after its ack loses nothing), and a send retried after a lost
# acknowledgement is not written twice (idempotence: the broker drops the repeat).
PRODUCER_GUARANTEES: Mapping[str, Any] = MappingProxyType(
    {"acks": "all", "enable_idempotence": True}
)

# How long a client waits for one broker's answer before it closes the connection and
# retries elsewhere (Kafka's own request.timeout.ms). A broker cut off by a network
# partition answers nothing, and a request already sent to it is retried only after this:
# faust's 1,200 s for the producer (90 s for its consumer) held an idempotent producer's
# partition (muted while its batch is in flight) for 20 minutes, and the stage behind it.
# Idempotent batches never expire, so a shorter wait retries and loses nothing.
REQUEST_TIMEOUT_S = 30.0


def producer_kwargs(kafka: KafkaSettings) -> dict[str, Any]:
    """``client_kwargs`` plus ``PRODUCER_GUARANTEES``: what every aiokafka producer takes."""
    return {**client_kwargs(kafka), **PRODUCER_GUARANTEES}
