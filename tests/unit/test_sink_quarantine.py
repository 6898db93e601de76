"""Quarantined rows: the dead letters they become, on the topic and in dead_letters."""

from __future__ import annotations

import orjson

from pipeline.contracts.models import AUDIT_COLUMNS
from pipeline.sinks.quarantine import Quarantine, Quarantined
from pipeline.sinks.rows import decode_audit, decode_dead_letter


def test_rows_become_dead_letter_messages_and_rows_located_by_their_input() -> None:
    """Messages of at most N rows with ingest's headers; one dead_letters row per row."""
    rows = [["x", i, "auth.login-attempts", 3, 100 + i] for i in range(5)] + [["garbage"]]
    q = Quarantined(
        reason="too_many_partitions",
        detail="refused",
        table="attempts",
        columns=("a", "b", "kafka_topic", "kafka_partition", "kafka_offset"),
        rows=rows,
        topic="auth.audit",
        partition=1,
        offset=40,
        token="attempts:auth.audit:1:40-41",
    )
    messages = q.messages(max_rows=4)
    assert [len(orjson.loads(value)["rows"]) for _, value, _ in messages] == [4, 2]
    key, value, headers = messages[1]
    assert key == b"attempts:auth.audit:1:40-41"
    assert orjson.loads(value) == {
        "v": 1,
        "table": "attempts",
        "columns": ["a", "b", "kafka_topic", "kafka_partition", "kafka_offset"],
        "rows": [["x", 4, "auth.login-attempts", 3, 104], ["garbage"]],
    }
    assert dict(headers) == {
        "error": b"too_many_partitions",
        "error_detail": b"refused",
        "stage": b"sink",
        "source_topic": b"auth.audit",
        "source_partition": b"1",
        "source_offset": b"40",
        "dedup_token": b"attempts:auth.audit:1:40-41",
    }
    assert q.dead_letter_rows(7) == [
        *([7, "too_many_partitions", "sink", "auth.login-attempts", 3, 100 + i] for i in range(5)),
        [7, "too_many_partitions", "sink", "auth.audit", 1, 40],  # not locatable: the batch
    ]
    # The sink's dead-letter lane skips what it quarantined itself (in dead_letters already).
    assert decode_dead_letter("dlq", 0, 9, 7, headers).rows == []


def test_audit_rows_before_1970_are_rejects_with_a_reason_not_silent_drops() -> None:
    """A row before 1970 is past_timestamp, a malformed row invalid_row; both queued."""
    good = [
        1_000,
        "t",
        "s",
        "f",
        "d",
        None,
        "src",
        "",
        False,
        "failure",
        "bad_password",
        "allowed",
        1,
        False,
        "p",
        "ev",
        "auth.login-attempts",
        2,
        5,
    ]
    old = [-1_000, *good[1:-1], 6]
    body = {"v": 1, "columns": list(AUDIT_COLUMNS), "rows": [good, old, ["nonsense"]]}
    message = decode_audit(12, orjson.dumps(body))
    assert (len(message.rows), message.bad_rows) == (1, 2)
    assert [reason for reason, _ in message.rejects] == ["past_timestamp", "invalid_row"]
    quarantine = Quarantine({"bootstrap_servers": "127.0.0.1:1"}, "dlq")
    quarantine.queue_rejects("auth.audit", 0, 12, message.rejects)
    assert [(q.reason, q.token, q.dead_letter_rows(0)) for q in quarantine.pending] == [
        (
            "invalid_row",
            "rejects:auth.audit:0:12:invalid_row",
            [[0, "invalid_row", "sink", "auth.audit", 0, 12]],
        ),
        (
            "past_timestamp",
            "rejects:auth.audit:0:12:past_timestamp",
            [[0, "past_timestamp", "sink", "auth.login-attempts", 2, 6]],
        ),
    ]
