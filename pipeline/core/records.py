"""The wire records the rules emit, each built in one place: decisions, alerts and the
owner's notices. Ids are ``stable_id``s of what the record is about and the policy
version, so replaying the same events gives byte-identical records."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pipeline.contracts.models import AccountNotice, Alert, Decision, format_utc_ms, ms_to_datetime
from pipeline.core.keys import stable_id

APPLIES_TO = {
    "account_source": "untrusted",
    "account": "untrusted",
    "device": "device",
    "uia": "uia",
    "mfa": "mfa",
    "source": "all",
    "lock": "untrusted",
    "tenant": "untrusted",
    "familiar": "untrusted",
    "passed": "untrusted",
}
"""Which attempts a decision of each scope refuses (``pipeline.core.decisions``)."""


def decision_value(
    decision_id: str,
    wire_key: str,
    scope: str,
    action: str,
    rule: str,
    tenant: str,
    account: str | None,
    source: str | None,
    device: str | None,
    count: int,
    threshold: int,
    window_ms: int,
    issued_ms: int,
    expires_ms: int,
    version: str,
    challenge: str | None = None,
) -> dict[str, Any]:
    """The wire value of the decision a rule issues on ``wire_key`` (its id is the
    caller's: it is also kept in the decision index), in the codec's field order;
    ``challenge`` names what a challenge demands (absent otherwise, as the model's
    serializer leaves it out). ``dumps`` of it is the decision's bytes, equal to
    ``encode(Decision.model_validate(value))`` (``tests/unit/test_core_exempt_bytes.py``):
    a first sign-in's exempts are sent so, without the pydantic model and its two
    datetimes (a quarter of its cost); the rarer decisions become models
    (``build_decision``) for the replays that read them."""
    value: dict[str, Any] = {
        "decision_id": decision_id,
        "key": wire_key,
        "tenant": tenant,
        "scope": scope,
        "account_digest": account,
        "source": source,
        "device_id": device,
        "applies_to": APPLIES_TO[scope],
        "action": action,
        "rule": rule,
        "count": count,
        "threshold": threshold,
        "window_ms": window_ms,
        "issued_at": utc_ms_text(issued_ms),
        "expires_at": utc_ms_text(expires_ms),
        "policy_version": version,
    }
    if challenge is not None:
        value["challenge"] = challenge
    return value


def build_decision(value: dict[str, Any]) -> Decision:
    """The model of a ``decision_value``."""
    return Decision.model_validate(value, strict=False)


def utc_ms_text(epoch_ms: int) -> str:
    """``format_utc_ms`` of the time ``epoch_ms``, its seconds' text memoised (exempts of
    one batch share their seconds; the memo is bounded)."""
    return _second_text(epoch_ms // 1000) + f"{epoch_ms % 1000:03d}Z"


@lru_cache(maxsize=4096)
def _second_text(epoch_s: int) -> str:
    """``format_utc_ms`` of the second ``epoch_s``, up to and with its dot."""
    return format_utc_ms(ms_to_datetime(epoch_s * 1000))[:-4]


def build_alert(
    kind: str,
    tenant: str,
    source: str | None,
    account: str | None,
    count: int,
    distinct: int,
    start_ms: int,
    end_ms: int,
    version: str,
) -> Alert:
    """An alert of ``kind`` over ``[start_ms, end_ms]``; one id per (subject, start)."""
    return Alert(
        alert_id=stable_id(kind, tenant, source or "-", account or "-", start_ms, version),
        type=kind,
        tenant=tenant,
        source=source,
        account_digest=account,
        count=count,
        distinct_accounts=distinct,
        window_start=ms_to_datetime(start_ms),
        window_end=ms_to_datetime(end_ms),
        policy_version=version,
    )


def build_notice(
    tenant: str,
    account: str,
    reason: str,
    now_ms: int,
    expires_ms: int,
    window_ms: int,
    version: str,
) -> AccountNotice:
    """The owner's notice (seed 001's unlock mail) for one notice window from ``now_ms``."""
    return AccountNotice(
        notice_id=stable_id("notice", tenant, account, now_ms, version),
        tenant=tenant,
        account_digest=account,
        reason=reason,  # type: ignore[arg-type]
        expires_at=ms_to_datetime(expires_ms),
        window_start=ms_to_datetime(now_ms),
        window_end=ms_to_datetime(now_ms + window_ms),
        policy_version=version,
    )
