"""The edge's decision feed on the real broker (issue 6): decisions produced upstream reach
check and the block-list, tombstones lift, expiry needs no tombstone, a restarted edge
rebuilds the same view, and a view started during writes converges."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiokafka import AIOKafkaProducer

from pipeline.clock import wall_ms
from pipeline.core.keys import Key, format_key
from pipeline.edge.feed import DecisionFeed, FeedConfig
from pipeline.edge.handlers import create_app
from pipeline.edge.view import DecisionView
from pipeline.kafka_admin import TopicSpec, ensure_topics
from pipeline.topics import DECISIONS_CONFIG
from tests.plugins.waiting import wait_until_async
from tests.unit.test_edge_support import (
    ACCOUNT,
    MIN,
    PEER,
    SEC,
    TENANT,
    account_key,
    account_source_key,
    message,
    normaliser,
    source_key,
    tombstone,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3
READY_TIMEOUT_S = 60.0
VISIBLE_TIMEOUT_S = 30.0


@dataclass
class Upstream:
    """The decisions topic and a producer standing in for the worker."""

    bootstrap: str
    topic: str
    producer: AIOKafkaProducer

    async def send(self, key_value: tuple[bytes, bytes | None]) -> None:
        key, value = key_value
        await self.producer.send_and_wait(self.topic, key=key, value=value)

    def feed(self, view: DecisionView | None = None) -> DecisionFeed:
        config = FeedConfig(self.bootstrap, self.topic, poll_interval_ms=100)
        return DecisionFeed(view or DecisionView(normaliser()), config)


@pytest.fixture
async def upstream(kafka_bootstrap: str, topic_name: str) -> AsyncIterator[Upstream]:
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic_name, PARTITIONS, DECISIONS_CONFIG)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        yield Upstream(kafka_bootstrap, topic_name, producer)
    finally:
        await producer.stop()


def refused(view: DecisionView, account: str = ACCOUNT, ip: str = PEER) -> bool:
    return not view.check(TENANT, account, ip).allowed


def snapshot(view: DecisionView) -> dict[Key, tuple[str, str, int]]:
    now = view.now_ms()
    return {
        key: (active.decision_id, active.action, active.expires_ms)
        for key, active in view.index.items()
        if active.expires_ms > now
    }


async def test_produced_decision_reaches_check_and_feed_and_tombstone_lifts(
    upstream: Upstream,
) -> None:
    """An account block and a source block produced upstream refuse at check and appear in
    the HTTP block-list; their tombstones lift both."""
    async with upstream.feed() as feed:
        await feed.wait_ready(READY_TIMEOUT_S)
        view = feed.view
        client = TestClient(TestServer(_app(feed)))
        await client.start_server()
        try:
            until = wall_ms() + 10 * MIN
            await upstream.send(message(account_key(), until))
            await upstream.send(message(source_key("203.0.113.77"), until))
            await wait_until_async(
                lambda: refused(view),
                VISIBLE_TIMEOUT_S,
                description="the account block at the edge",
            )

            async def feed_text() -> bytes:
                response = await client.get("/v1/blocklist?format=text")
                return await response.read()

            await wait_until_async(
                lambda: _equals(feed_text(), b"203.0.113.77\n"),
                VISIBLE_TIMEOUT_S,
                description="the source block in the feed",
            )
            assert refused(view, account="bob", ip="203.0.113.77")
            await upstream.send(tombstone(account_key()))
            await upstream.send(tombstone(source_key("203.0.113.77")))
            await wait_until_async(
                lambda: not refused(view),
                VISIBLE_TIMEOUT_S,
                description="the lift of the account block",
            )
            await wait_until_async(
                lambda: _equals(feed_text(), b""), VISIBLE_TIMEOUT_S, description="an empty feed"
            )
            assert view.stats.outcomes["bad"] == 0
        finally:
            await client.close()


def _app(feed: DecisionFeed) -> web.Application:
    return create_app(feed.view, feed)


async def _equals(body: Awaitable[bytes], expected: bytes) -> bool:
    return await body == expected


async def test_expired_decision_without_tombstone_is_not_enforced(upstream: Upstream) -> None:
    """A decision refuses until its expires_at and not after, with no tombstone; one already
    expired when read is never enforced."""
    async with upstream.feed() as feed:
        await feed.wait_ready(READY_TIMEOUT_S)
        view = feed.view
        await upstream.send(message(account_key("late"), wall_ms() - SEC))
        short = wall_ms() + 3 * SEC
        await upstream.send(message(account_key(), short))
        await wait_until_async(
            lambda: refused(view), VISIBLE_TIMEOUT_S, description="the short block"
        )
        assert not refused(view, account="late")
        assert view.stats.outcomes["expired"] == 1
        await wait_until_async(
            lambda: not refused(view), 10.0, description="the block to lapse at expires_at"
        )
        assert wall_ms() >= short
        await wait_until_async(lambda: len(view) == 0, 5.0, description="prune of the lapsed block")


async def test_restarted_edge_rebuilds_the_same_view(upstream: Upstream) -> None:
    """A second edge reading the topic from the start holds, once ready, exactly the view of
    the first: re-issued keys keep their latest decision, tombstoned keys stay lifted."""
    until = wall_ms() + 30 * MIN
    for i in range(60):
        await upstream.send(message(account_key(f"user{i}"), until + i))
    for i in range(0, 60, 3):
        await upstream.send(tombstone(account_key(f"user{i}")))
    for i in range(1, 60, 3):
        await upstream.send(message(account_key(f"user{i}"), until + 1000 + i))
    await upstream.send(message(source_key("2001:db8:7:7::/64"), until))
    await upstream.send((b"garbage", b"{}"))
    first = upstream.feed()
    async with first:
        await first.wait_ready(READY_TIMEOUT_S)
        expected = snapshot(first.view)
    assert len(expected) == 41
    assert expected[account_key("user1")][2] == until + 1001
    second = upstream.feed()
    async with second:
        await second.wait_ready(READY_TIMEOUT_S)
        assert snapshot(second.view) == expected  # ready means caught up: no waiting here
        assert second.view.blocklist()[0][0].source == "2001:db8:7:7::/64"
        assert second.view.stats.bad_reasons == {"bad_key": 1}
        assert second.lag_messages() == 0


async def test_view_started_during_writes_converges(upstream: Upstream) -> None:
    """An edge that starts while decisions and tombstones are being written ends with the
    topic's final state."""
    rng = random.Random(6)
    until = wall_ms() + 30 * MIN
    latest: dict[Key, tuple[bytes, bytes | None]] = {}
    keys = [account_source_key(f"192.0.2.{i}", f"user{i % 40}") for i in range(200)]

    async def write(count: int) -> None:
        for n in range(count):
            key = rng.choice(keys)
            record = tombstone(key) if rng.random() < 0.3 else message(key, until + n)
            latest[key] = record
            await upstream.send(record)
            if n % 50 == 0:
                await asyncio.sleep(0.01)

    writer = asyncio.create_task(write(1500))
    await wait_until_async(lambda: len(latest) >= 100, 30.0, description="writes under way")
    async with upstream.feed() as feed:
        await writer
        expected = {key for key, (_, value) in latest.items() if value is not None}
        await wait_until_async(
            lambda: set(snapshot(feed.view)) == expected,
            VISIBLE_TIMEOUT_S,
            description="the view to converge",
        )
        await feed.wait_ready(READY_TIMEOUT_S)
        assert feed.lag_messages() == 0
        staleness = feed.staleness_ms()
        assert staleness is not None and staleness < 5 * SEC
    assert format_key(keys[0]).startswith("account_source|default|")


async def test_missing_topic_is_the_reason_until_it_exists(
    kafka_bootstrap: str, topic_name: str
) -> None:
    """An edge pointed at a decisions topic that does not exist says so (not 'catching up'):
    the reason names the topic and AUTHPIPE_KAFKA_DECISIONS_TOPIC; once the topic is created
    the feed becomes ready and the reason clears."""
    config = FeedConfig(kafka_bootstrap, topic_name, poll_interval_ms=100, retry_backoff_s=0.2)
    feed = DecisionFeed(DecisionView(normaliser()), config)
    async with feed:
        await wait_until_async(
            lambda: "does not exist" in (feed.not_ready_reason() or ""),
            READY_TIMEOUT_S,
            description="the missing-topic reason",
        )
        assert feed.not_ready_reason() == (
            f"topic {topic_name!r} does not exist on {kafka_bootstrap}: start the worker that "
            "creates it, or set AUTHPIPE_KAFKA_DECISIONS_TOPIC to the topic your worker writes "
            "decisions to"
        )
        assert not feed.ready()
        await ensure_topics(kafka_bootstrap, [TopicSpec(topic_name, 1, DECISIONS_CONFIG)])
        await feed.wait_ready(READY_TIMEOUT_S)
        assert feed.not_ready_reason() is None
