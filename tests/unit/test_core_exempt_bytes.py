"""``records.decision_value``: a decision's wire value, whose bytes (``dumps``) a first
sign-in's exempts are sent as without the pydantic model, byte for byte the model's (the
edge, the engine's decoder and replays read them alike)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contracts.codec import dumps, encode
from pipeline.contracts.models import format_utc_ms, ms_to_datetime
from pipeline.core.records import build_decision, decision_value, utc_ms_text

# Any text a field could carry, control characters, quotes and non-ASCII included.
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
OPT_TEXT = st.none() | TEXT
MS = st.integers(-30_610_224_000_000, 253_402_300_799_999)  # years 1000 to 9999
COUNT = st.integers(0, 2**53)
SCOPES = ["familiar", "passed", "account_source", "account", "device", "source", "tenant"]


FIELDS = st.fixed_dictionaries(
    {
        "decision_id": TEXT,
        "wire_key": TEXT,
        "scope": st.sampled_from(SCOPES),
        "action": st.sampled_from(["exempt", "block", "observe", "challenge"]),
        "rule": TEXT,
        "tenant": TEXT,
        "account": OPT_TEXT,
        "source": OPT_TEXT,
        "device": OPT_TEXT,
        "count": COUNT,
        "threshold": COUNT,
        "window_ms": COUNT,
        "issued_ms": MS,
        "expires_ms": MS,
        "version": TEXT,
        "challenge": st.none() | st.sampled_from(["captcha", "step_up"]),
    }
)


@settings(max_examples=400, deadline=None)
@given(FIELDS)
def test_a_decision_value_dumped_is_its_models_bytes(fields: dict[str, Any]) -> None:
    """Equal bytes for any text, counts and times of years 1000 to 9999 (four digits), with and without a
    challenge."""
    value = decision_value(**fields)
    assert dumps(value) == encode(build_decision(value))


@given(MS)
def test_the_memoised_time_text_is_format_utc_ms(epoch_ms: int) -> None:
    """Millisecond text equal to the model's serializer, before 1970 too."""
    assert utc_ms_text(epoch_ms) == format_utc_ms(ms_to_datetime(epoch_ms))


def test_an_exempt_of_a_first_sign_in_reads_as_expected() -> None:
    """The exact bytes of one familiar exempt."""
    value = decision_value(
        "d1", "familiar|t|a|s|-", "familiar", "exempt", "familiar", "t", "a", "s", None,
        1, 0, 0, 1_765_000_000_123, 1_767_592_000_000, "v1",
    )  # fmt: skip
    assert dumps(value) == (
        b'{"decision_id":"d1","key":"familiar|t|a|s|-","tenant":"t","scope":"familiar",'
        b'"account_digest":"a","source":"s","device_id":null,"applies_to":"untrusted",'
        b'"action":"exempt","rule":"familiar","count":1,"threshold":0,"window_ms":0,'
        b'"issued_at":"2025-12-06T05:46:40.123Z","expires_at":"2026-01-05T05:46:40.000Z",'
        b'"policy_version":"v1"}'
    )
