"""The one decision decoder: every field checked, one reason code per fault, the grouping
check injected, unknown fields ignored."""

from __future__ import annotations

import functools
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.contracts.codec import DecisionValue, DecodeError, decode_decision
from pipeline.contracts.models import Decision, datetime_to_ms
from pipeline.core.grouping import within_grouping
from tests.unit.test_contracts import EXAMPLES

ONE_SOURCE = functools.partial(within_grouping, ipv4_prefix=32, ipv6_prefix=64)
BLOCK = orjson.loads((EXAMPLES / "decision.block.json").read_bytes())
SOURCE = {
    **BLOCK,
    "scope": "source",
    "key": "source|acme|-|203.0.113.9|-",
    "account_digest": None,
    "source": "203.0.113.9",
    "device_id": None,
}


def decode(body: dict[str, Any], **kw: Any) -> DecisionValue:
    return decode_decision(orjson.dumps(body), source_ok=ONE_SOURCE, **kw)


def test_a_decision_decodes_to_every_field_with_times_in_ms() -> None:
    """The published example decodes to its fields in order, issued/expires as epoch ms."""
    model = Decision.model_validate_json(orjson.dumps(BLOCK))
    value = decode(BLOCK, key=BLOCK["key"])
    assert value._asdict() == {
        **model.model_dump(exclude={"issued_at", "expires_at"}),
        "operator": None,
        "reason": None,
        "challenge": None,
        "issued_at_ms": datetime_to_ms(model.issued_at),
        "expires_at_ms": datetime_to_ms(model.expires_at),
    }
    assert value.expires_at_ms - value.issued_at_ms == 900_000
    assert decode({**BLOCK, "brand_new": [1]}) == value


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "empty"),
        (b"", "empty"),
        (b"{oops", "not_json"),
        (b"[1, 2]", "not_object"),
        (orjson.dumps({k: v for k, v in BLOCK.items() if k != "rule"}), "missing_field"),
        (orjson.dumps({k: v for k, v in BLOCK.items() if k != "expires_at"}), "missing_field"),
        (orjson.dumps({**BLOCK, "decision_id": ""}), "invalid_field"),
        (orjson.dumps({**BLOCK, "rule": 7}), "invalid_field"),
        (orjson.dumps({**BLOCK, "action": "challenge"}), "invalid_field"),
        (orjson.dumps({**BLOCK, "scope": ["account"]}), "invalid_field"),
        (orjson.dumps({**BLOCK, "applies_to": "everyone"}), "invalid_field"),
        (orjson.dumps({**BLOCK, "account_digest": 5}), "invalid_field"),
        (orjson.dumps({**BLOCK, "operator": "o" * 129}), "invalid_field"),
        (orjson.dumps({**BLOCK, "count": -1}), "invalid_field"),
        (orjson.dumps({**BLOCK, "threshold": True}), "invalid_field"),
        (orjson.dumps({**BLOCK, "window_ms": "900000"}), "invalid_field"),
        (orjson.dumps({**BLOCK, "issued_at": "tomorrow"}), "invalid_field"),
        (orjson.dumps({**BLOCK, "expires_at": "2026-09-21T14:30:00"}), "invalid_field"),
        (orjson.dumps({**SOURCE, "source": "203.0.113.0/24"}), "invalid_field"),
        (orjson.dumps({**SOURCE, "source": None}), "invalid_field"),
    ],
)
def test_bad_decisions_get_a_stable_reason(raw: bytes | None, reason: str) -> None:
    """Each kind of bad decision value raises DecodeError with its reason code."""
    with pytest.raises(DecodeError) as caught:
        decode_decision(raw, source_ok=ONE_SOURCE)
    assert caught.value.reason == reason


def test_the_value_key_must_match_the_kafka_key_when_given() -> None:
    """With key=, a value naming another key is key_mismatch; without, it is not compared."""
    with pytest.raises(DecodeError) as caught:
        decode(BLOCK, key="account|acme|other|-|-")
    assert (caught.value.reason, decode(BLOCK).key) == ("key_mismatch", BLOCK["key"])


def test_the_grouping_check_is_the_callers() -> None:
    """A /24 source block is refused by the /32 grouping and read under a /24 grouping."""
    wide = {**SOURCE, "source": "203.0.113.0/24"}
    with pytest.raises(DecodeError, match="wider than one source"):
        decode(wide)
    by_24 = functools.partial(within_grouping, ipv4_prefix=24, ipv6_prefix=64)
    assert decode_decision(orjson.dumps(wide), source_ok=by_24).source == "203.0.113.0/24"


JSON_INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what orjson writes


@given(
    st.dictionaries(
        st.sampled_from(sorted(BLOCK)),
        st.none() | JSON_INTS | st.text() | st.lists(JSON_INTS) | st.booleans(),
    )
)
def test_any_json_object_decodes_or_raises_decode_error(changes: dict[str, Any]) -> None:
    """Whatever the fields hold, the decoder returns a value or raises DecodeError."""
    try:
        decode({**BLOCK, **changes})
    except DecodeError as exc:
        assert exc.reason in {"missing_field", "invalid_field"}
