"""Wire contracts: published schemas and examples match the models; the codec classifies."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from pipeline.contracts.codec import DecodeError, decode_attempt, dumps, encode, loads
from pipeline.contracts.models import Alert, Decision
from pipeline.contracts.schemas import SCHEMA_DIR, generate, render

EXAMPLES = SCHEMA_DIR / "examples"
VALID = {
    "event_id": "e1",
    "occurred_at": "2026-11-29T20:00:00Z",
    "service": "web",
    "account": "alice",
    "peer_ip": "192.0.2.1",
    "outcome": "failure",
    "failure_reason": "bad_password",
}


@pytest.mark.parametrize("name", sorted(generate()))
def test_published_schema_matches_its_model(name: str) -> None:
    """schemas/<name> is exactly what the model generates (regenerate with python -m pipeline.contracts.schemas)."""
    assert (SCHEMA_DIR / name).read_text(encoding="utf-8") == render(generate()[name])


@pytest.mark.parametrize(
    "path", sorted(EXAMPLES.glob("login_attempt.*.json")), ids=lambda p: p.name
)
def test_login_attempt_examples_decode(path: Path) -> None:
    """Every published login_attempt example is a valid v1 event."""
    event = decode_attempt(path.read_bytes())
    assert event.event_id == json.loads(path.read_text())["event_id"]


def test_decision_and_alert_examples_round_trip() -> None:
    """The decision and alert examples validate and re-encode byte for byte as compact JSON."""
    for path, model in [
        (EXAMPLES / "decision.block.json", Decision),
        (EXAMPLES / "alert.spray_source.json", Alert),
    ]:
        raw = path.read_bytes()
        parsed = model.model_validate_json(raw)
        assert encode(parsed) == orjson.dumps(orjson.loads(raw))


def test_unknown_input_fields_are_ignored_and_user_agent_is_cut() -> None:
    """Inputs ignore fields from newer producers; user_agent is cut to 512 characters."""
    event = decode_attempt(orjson.dumps({**VALID, "brand_new": 1, "user_agent": "u" * 600}))
    assert (event.account, len(event.user_agent or "")) == ("alice", 512)


def test_outputs_forbid_unknown_fields() -> None:
    """Output models reject fields they do not define."""
    body = json.loads((EXAMPLES / "decision.block.json").read_text())
    with pytest.raises(ValidationError):
        Decision.model_validate({**body, "extra": 1})


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty"),
        (None, "empty"),
        (b"x" * 20_000, "too_large"),
        (b"\xff\xfe{}", "bad_utf8"),
        (b'{"a": "\xc3\x28"}', "bad_utf8"),
        (b"not json", "not_json"),
        (b"[1, 2]", "not_object"),
        (b'"s"', "not_object"),
        (orjson.dumps({k: v for k, v in VALID.items() if k != "account"}), "missing_field"),
        (orjson.dumps({**VALID, "outcome": "maybe"}), "invalid_field"),
        (orjson.dumps({**VALID, "device_trusted": "true"}), "invalid_field"),
        (orjson.dumps({**VALID, "occurred_at": "2026-11-29T20:00:00"}), "invalid_field"),
        (orjson.dumps({**VALID, "account": "a" * 321}), "invalid_field"),
        (orjson.dumps({**VALID, "event_id": 7}), "invalid_field"),
    ],
)
def test_bad_events_get_a_stable_reason(raw: bytes | None, reason: str) -> None:
    """Each kind of bad event raises DecodeError with its documented reason code."""
    with pytest.raises(DecodeError) as caught:
        decode_attempt(raw)
    assert caught.value.reason == reason


def test_internal_dumps_holds_no_more_memory_than_its_bytes() -> None:
    """codec.dumps right-sizes orjson's buffer: 10,000 small changelog records held at once
    cost under 100 bytes each (orjson's own result holds about 4 kB each), same JSON."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        records = [dumps([3, "acme", "k", i]) for i in range(10_000)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 10_000 * 100
    assert records[7] == orjson.dumps([3, "acme", "k", 7]) == b'[3,"acme","k",7]'
    assert loads(records[7]) == [3, "acme", "k", 7]
