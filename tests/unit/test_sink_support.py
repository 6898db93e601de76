"""Audit rows for the sink's tests (unit and integration): one builder of the row."""

from __future__ import annotations

from typing import Any

from pipeline.contracts.models import AUDIT_COLUMNS


def audit_row(
    index: int,
    ts_ms: int,
    *,
    outcome: str = "failure",
    account: str = "acct",
    source: str = "203.0.113.66",
    tenant: str = "acme",
    partition: int | None = None,
    decision: str = "allowed",
    weight: int = 1,
    **columns: Any,
) -> list[Any]:
    """One audit row (AUDIT_COLUMNS order), input coordinates (auth.login-attempts,
    ``partition`` or ``index % 7``, ``index``); ``columns`` set any other column."""
    values = {
        "ts_ms": ts_ms,
        "tenant": tenant,
        "service": "idp",
        "flow": "login",
        "account_digest": account,
        "account": None,
        "source": source,
        "device_id": "",
        "trusted": False,
        "outcome": outcome,
        "failure_reason": "bad_password" if outcome == "failure" else "",
        "decision": decision,
        "weight": weight,
        "summary": False,
        "policy_version": "p1",
        "event_id": f"ev-{index}",
        "kafka_topic": "auth.login-attempts",
        "kafka_partition": index % 7 if partition is None else partition,
        "kafka_offset": index,
    }
    unknown = set(columns) - set(values)
    assert not unknown, f"not audit columns: {sorted(unknown)}"
    values.update(columns)
    return [values[name] for name in AUDIT_COLUMNS]
