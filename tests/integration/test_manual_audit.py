"""Operators' decisions in the audit sink: who and why land in ClickHouse's ``decisions``
table; a source decision wider than one source is refused (issue 14, issue 15 item 3)."""

from __future__ import annotations

import orjson
import pytest

from pipeline.contracts.codec import DecodeError as BadMessage
from pipeline.contracts.codec import encode
from pipeline.core.attempt import Normaliser
from pipeline.core.keys import Digester
from pipeline.core.normalise import NetworkSet, SourceRules
from pipeline.manual import Target, manual_decision
from pipeline.sinks.clickhouse import ClickHouse
from pipeline.sinks.rows import decision_message as decode_decision
from pipeline.wiring import source_check
from tests.integration.test_audit_sink import (
    SINK_TIMEOUT_S,
    SinkProcess,
    Topics,
    ch,  # noqa: F401 (fixture)
    create_topics,
    produce,
    scalar,
    sink,  # noqa: F401 (fixture)
    topics,  # noqa: F401 (fixture)
)
from tests.plugins.waiting import wait_until

NOW_MS = 1_790_000_000_000


def _normaliser() -> Normaliser:
    return Normaliser(
        digester=Digester("k" * 32), sources=SourceRules(trusted_proxies=NetworkSet())
    )


MANUAL_KEY = b"source|acme|-|203.0.113.66|manual"
"""The Kafka key of ``_manual()``'s decision (the sink pairs a value with its key)."""


def _manual(source: str | None = "203.0.113.66", account: str | None = None) -> bytes:
    decision = manual_decision(
        Target("acme", source=source, account=account),
        _normaliser(),
        ttl_ms=3_600_000,
        reason="ticket 42",
        operator="alice",
        now_ms=NOW_MS,
    )
    return encode(decision)


def test_decode_decision_keeps_operator_and_reason_and_refuses_wide_sources() -> None:
    """A manual decision's row carries operator and reason; a /24 source (IPv4 grouped by
    /32) is a bad message, and fine when the sink groups IPv4 by /24."""
    (row,) = decode_decision("t", 0, 1, 0, MANUAL_KEY, _manual()).rows
    assert row[3:10] == ["source", None, "203.0.113.66", "manual", "all", "block", "manual"]
    assert row[16:19] == [False, "alice", "ticket 42"]
    wide = _manual().replace(b'"203.0.113.66"', b'"203.0.113.0/24"')
    with pytest.raises(BadMessage, match="wider than one source"):
        decode_decision("t", 0, 1, 0, MANUAL_KEY, wide)
    assert decode_decision("t", 0, 1, 0, MANUAL_KEY, wide, source_check(24, 64)).rows[0][5] == (
        "203.0.113.0/24"
    )


async def test_sink_audits_operator_decisions(
    kafka_bootstrap: str,
    topics: Topics,  # noqa: F811
    ch: ClickHouse,  # noqa: F811
    sink: SinkProcess,  # noqa: F811
) -> None:
    """The running sink writes an operator's source and account blocks with who and why,
    and skips a deny-all source decision (0.0.0.0/0)."""
    await create_topics(kafka_bootstrap, topics)
    deny_all = _manual().replace(b'"203.0.113.66"', b'"0.0.0.0/0"')
    account = _manual(None, "Victim@Example.com")
    account_key = orjson.loads(account)["key"].encode()  # the sink pairs values with keys
    await produce(
        kafka_bootstrap,
        [
            (topics.decisions, 0, b"source|acme|-|203.0.113.66|manual", _manual(), None),
            (topics.decisions, 0, b"source|acme|-|0.0.0.0/0|manual", deny_all, None),
            (topics.decisions, 1, account_key, account, None),
        ],
    )
    sink.start()
    wait_until(
        lambda: scalar(ch, "SELECT count() FROM decisions") == 2,
        SINK_TIMEOUT_S,
        description="the operator's decisions in ClickHouse",
    )
    assert sink.stop() == 0
    rows = ch.query("SELECT scope, source, rule, operator, reason FROM decisions ORDER BY scope")
    assert rows == [
        ("account", None, "manual", "alice", "ticket 42"),
        ("source", "203.0.113.66", "manual", "alice", "ticket 42"),
    ]
