"""``authpipe decisions add|list|remove`` through the real broker to a running edge's
check and block-list feed (issue 14, seed 001's manual block-list)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from pipeline.kafka_admin import TopicSpec, ensure_topics
from pipeline.sim.topics import read_topic
from pipeline.topics import DECISIONS_CONFIG
from tests.integration.edge_process import authpipe, edge_serving, get, write_config
from tests.plugins.kafka import free_ports
from tests.plugins.waiting import wait_until

pytestmark = pytest.mark.integration

WAIT_S = 30.0


def _check(base: str, ip: str, account: str = "someone@example.com") -> bool:
    status, body = get(f"{base}/v1/check?account={account}&ip={ip}")
    assert status == 200, body
    return bool(orjson.loads(body)["allowed"])


def test_decisions_add_list_remove_reach_the_edge_check_and_the_feed(
    kafka_bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    """An operator blocks a source and an account: the edge refuses both within seconds,
    the feed serves the source (rule manual), list shows who and why, the topic holds no
    plain account; remove lifts the source block; bad input exits 2, an unknown id 1."""
    asyncio.run(ensure_topics(kafka_bootstrap, [TopicSpec(topic_name, 2, DECISIONS_CONFIG)]))
    config = write_config(tmp_path, kafka_bootstrap, topic_name)
    (port,) = free_ports(1)
    with edge_serving(config, port, tmp_path / "edge.log") as base:
        assert _check(base, "203.0.113.9")
        added = authpipe(
            config,
            "decisions",
            "add",
            "--source",
            "203.0.113.9",
            "--ttl",
            "1h",
            "--reason",
            "stuffing proxy, ticket 42",
            "--by",
            "alice",
        )
        assert added.returncode == 0, added.stderr
        source_id = added.stdout.split()[1].rstrip(":")
        added = authpipe(
            config,
            "decisions",
            "add",
            "--account",
            "Victim@Example.COM",
            "--tenant",
            "default",
            "--ttl",
            "30m",
            "--reason",
            "compromised",
        )
        assert added.returncode == 0, added.stderr

        wait_until(
            lambda: not _check(base, "203.0.113.9"),
            WAIT_S,
            interval_s=0.2,
            description="the source block to reach the edge",
        )
        wait_until(
            lambda: not _check(base, "198.51.100.1", "victim@example.com"),
            WAIT_S,
            interval_s=0.2,
            description="the account block to reach the edge",
        )
        assert _check(base, "203.0.113.10")
        status, feed = get(f"{base}/v1/blocklist?format=json")
        assert status == 200
        (entry,) = orjson.loads(feed)["entries"]
        assert (entry["source"], entry["rule"], entry["action"], entry["decision_id"]) == (
            "203.0.113.9",
            "manual",
            "block",
            source_id,
        )

        listed = authpipe(config, "decisions", "list")
        assert listed.returncode == 0, listed.stderr
        assert source_id in listed.stdout
        assert "alice: stuffing proxy, ticket 42" in listed.stdout
        assert "compromised" in listed.stdout
        records = asyncio.run(read_topic(kafka_bootstrap, topic_name, 30)).records
        assert records and not any(b"victim" in (value or b"").lower() for _, value in records)

        removed = authpipe(config, "decisions", "remove", source_id)
        assert removed.returncode == 0, removed.stderr
        wait_until(
            lambda: _check(base, "203.0.113.9"),
            WAIT_S,
            interval_s=0.2,
            description="the lifted source block to reach the edge",
        )
        assert orjson.loads(get(f"{base}/v1/blocklist?format=json")[1])["entries"] == []
        assert not _check(base, "198.51.100.1", "victim@example.com")

    unknown = authpipe(config, "decisions", "remove", "0" * 32)
    assert unknown.returncode == 1
    assert unknown.stderr.strip().count("\n") == 0 and "no active decision" in unknown.stderr
    wide = authpipe(
        config, "decisions", "add", "--source", "10.0.0.0/8", "--ttl", "1h", "--reason", "x"
    )
    assert wide.returncode == 2 and "wider than one source" in wide.stderr
