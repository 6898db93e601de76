"""The edge's cold load read as record batches (``pipeline.edge.bulkload``) on the real
broker: a feed that reads the topic's batches in the engine holds, once ready, exactly
the view of a feed whose consumer reads every record; the batches it does not read (a
gzip producer's) are left to the consumer; and the feed follows live decisions after."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.clock import wall_ms
from pipeline.core.decisions import FAMILIAR_RULE
from pipeline.core.keys import parse_key
from pipeline.edge.feed import DecisionFeed, FeedConfig
from pipeline.edge.view import DecisionView
from pipeline.kafka_admin import TopicSpec, ensure_topics
from pipeline.kafka_client import security_kwargs
from pipeline.settings import KafkaSettings
from pipeline.topics import DECISIONS_CONFIG
from tests.plugins.kafka import SCRAM_USERS, TLS_CLIENT, TlsBroker
from tests.plugins.waiting import wait_until_async
from tests.unit.test_edge_support import (
    MIN,
    account_key,
    message,
    normaliser,
)
from tests.unit.test_engine_decode import _value

pytestmark = pytest.mark.integration

PARTITIONS = 3
READY_TIMEOUT_S = 60.0
DAY = 86_400_000
EXEMPTS = 3_000
GZIPPED = 200


def exempt(i: int, now: int) -> tuple[bytes, bytes]:
    """A familiar exempt as the worker writes it, for user ``i``."""
    wire = f"familiar|default|{i:032x}|10.1.{i >> 8 & 255}.{i & 255}|-"
    return wire.encode(), _value(wire, f"id{i:030x}", "exempt", FAMILIAR_RULE, now - DAY, now + DAY)


@pytest.fixture
async def topic(kafka_bootstrap: str, topic_name: str) -> AsyncIterator[str]:
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic_name, PARTITIONS, DECISIONS_CONFIG)])
    yield topic_name


async def produce(bootstrap: str, topic: str, records: list[Any], **options: Any) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **options)
    await producer.start()
    try:
        for key, value in records:
            await producer.send(topic, key=key, value=value)
        await producer.flush()
    finally:
        await producer.stop()


def state(view: DecisionView, now: int) -> dict[str, Any]:
    """What a check can see: every exempt's and block's decision, counts, bad reasons."""
    keys = [parse_key(exempt(i, now)[0].decode()) for i in range(EXEMPTS + GZIPPED)]
    keys += [account_key(f"user{i}") for i in range(40)]
    return {
        "decisions": {k: view.index.get(k) for k in keys},
        "len": len(view.index),
        "outcomes": dict(view.stats.outcomes),
        "bad": dict(view.stats.bad_reasons),
    }


async def test_a_bulk_loaded_view_equals_the_consumers_and_follows_live(
    kafka_bootstrap: str, topic: str
) -> None:
    """3,000 exempts, 40 blocks, 300 tombstones and a bad message, then 200 exempts from a
    gzip producer: the bulk-loaded view equals the consumer-loaded one; the engine read
    the plain batches and left each partition's gzip batches to the consumer; a block
    published after ready is enforced."""
    now = wall_ms()
    plain = [exempt(i, now) for i in range(EXEMPTS)]
    plain += [message(account_key(f"user{i}"), now + 30 * MIN) for i in range(40)]
    plain += [(exempt(i, now)[0], None) for i in range(0, 900, 3)]
    plain.append((b"garbage", b"{}"))
    await produce(kafka_bootstrap, topic, plain, linger_ms=20)
    gzipped = [exempt(i, now) for i in range(EXEMPTS, EXEMPTS + GZIPPED)]
    await produce(kafka_bootstrap, topic, gzipped, compression_type="gzip", linger_ms=20)

    feeds = [
        DecisionFeed(
            DecisionView(normaliser()),
            FeedConfig(kafka_bootstrap, topic, poll_interval_ms=100, bulk_load=bulk),
        )
        for bulk in (True, False)
    ]
    bulk, consumer = feeds
    assert bulk.view.reads_batches
    async with bulk, consumer:
        for feed in feeds:
            await feed.wait_ready(READY_TIMEOUT_S)
        assert state(bulk.view, now) == state(consumer.view, now)
        assert len(bulk.view.index) == EXEMPTS - 300 + 40 + GZIPPED
        assert bulk.bulk is not None and consumer.bulk is None
        assert bulk.bulk.records == len(plain)
        assert bulk.bulk.left == {"unread": PARTITIONS}
        assert bulk.lag_messages() == 0

        key, value = message(account_key("late"), wall_ms() + 30 * MIN)
        await produce(kafka_bootstrap, topic, [(key, value)])
        await wait_until_async(
            lambda: bulk.view.index.get(account_key("late")) is not None,
            30.0,
            description="a decision published after the bulk load",
        )


@pytest.mark.parametrize("listener", ["ssl", "mtls", "sasl_ssl"])
async def test_the_bulk_load_reads_over_tls_mutual_tls_and_sasl(
    kafka_tls: TlsBroker, topic_name: str, listener: str
) -> None:
    """500 exempts loaded as record batches through the TLS listener and the mutual-TLS
    one (the bulk load's own connections, with the feed's ssl_context) and through
    SASL_SSL (aiokafka's client and its SCRAM handshake): every record read in bulk, none
    left to the consumer, all 500 in the view."""
    await ensure_topics(kafka_tls.plaintext, [TopicSpec(topic_name, PARTITIONS, DECISIONS_CONFIG)])
    now = wall_ms()
    await produce(kafka_tls.plaintext, topic_name, [exempt(i, now) for i in range(500)])
    files = kafka_tls.files
    options: dict[str, Any] = {"ssl_cafile": str(files.ca_pem)}
    if listener == "sasl_ssl":
        user = "authpipe-gateway"
        options |= {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": user,
            "sasl_password": SCRAM_USERS[user],
        }
    else:
        options["security_protocol"] = "SSL"
    if listener == "mtls":
        options |= {
            "ssl_certfile": str(files.client_cert(TLS_CLIENT)),
            "ssl_keyfile": str(files.client_key(TLS_CLIENT)),
        }
    bootstrap = getattr(kafka_tls, listener)
    kafka = KafkaSettings.model_validate({"bootstrap_servers": bootstrap, **options})
    feed = DecisionFeed(
        DecisionView(normaliser()),
        FeedConfig(bootstrap, topic_name, poll_interval_ms=100, security=security_kwargs(kafka)),
    )
    async with feed:
        await feed.wait_ready(READY_TIMEOUT_S)
    assert feed.bulk is not None
    assert (feed.bulk.records, feed.bulk.left) == (500, {})
    assert len(feed.view.index) == 500
