"""``authpipe decisions remove`` pairs each record with its Kafka key (issue 26 item 8): it
lifts the key a decision was published under, never the key a value claims."""

from __future__ import annotations

import pytest

from pipeline import manual
from pipeline.contracts.codec import encode
from pipeline.contracts.models import Decision
from pipeline.manual import ManualError, Target, active_decisions, manual_decision
from tests.unit.test_edge_support import SETTINGS, T0, normaliser

Records = list[tuple[bytes | None, bytes | None]]


def operator_block(source: str, operator: str = "op") -> Decision:
    """An operator's block of ``source`` in tenant default for an hour, made at T0."""
    return manual_decision(
        Target("default", source=source),
        normaliser(),
        ttl_ms=3_600_000,
        reason="x",
        operator=operator,
        now_ms=T0,
    )


@pytest.fixture
def topic(monkeypatch: pytest.MonkeyPatch) -> tuple[Records, list[tuple[str, bytes | None]]]:
    """The decisions topic ``remove`` reads (records) and what it publishes (sent)."""
    records: Records = []
    sent: list[tuple[str, bytes | None]] = []

    async def read(_settings: object) -> Records:
        return records

    async def publish(_settings: object, key: str, value: bytes | None) -> None:
        sent.append((key, value))

    monkeypatch.setattr(manual, "_read", read)
    monkeypatch.setattr(manual, "_publish", publish)
    monkeypatch.setattr(manual.time, "time_ns", lambda: T0 * 1_000_000)
    return records, sent


def test_a_value_under_another_key_is_not_listed_and_cannot_be_removed(
    topic: tuple[Records, list[tuple[str, bytes | None]]],
) -> None:
    """A value naming the real block's key, published under another key, is skipped: list
    shows only the real block, and removing the impostor's id lifts nothing."""
    records, sent = topic
    real = operator_block("1.2.3.4")
    impostor = operator_block("1.2.3.4", operator="mallory")
    records += [
        (real.key.encode(), encode(real)),
        (b"source|default|-|5.6.7.8|manual", encode(impostor)),
    ]
    assert [d.decision_id for d in active_decisions(records, T0)] == [real.decision_id]
    with pytest.raises(ManualError, match=f"no active decision has id {impostor.decision_id}"):
        manual.remove(SETTINGS, impostor.decision_id)
    assert sent == []
    assert manual.remove(SETTINGS, real.decision_id) == real
    assert sent == [(real.key, None)]


def test_a_manual_looking_value_under_a_rule_key_is_not_removed(
    topic: tuple[Records, list[tuple[str, bytes | None]]],
) -> None:
    """A value saying rule 'manual' under a key without 'manual' in the device slot (a
    rule's key) is refused: remove never tombstones a rule's key."""
    records, sent = topic
    forged = operator_block("1.2.3.4").model_copy(update={"key": "source|default|-|1.2.3.4|-"})
    records.append((forged.key.encode(), encode(forged)))
    with pytest.raises(ManualError, match="not by an operator"):
        manual.remove(SETTINGS, forged.decision_id)
    assert sent == []
