"""Where ``clickhouse.store_plain_account = true`` puts the typed account (issue 26 item
12, as docs/contract.md states it): on the account stage's envelopes
(``<app>.attempts-by-account``) and the audit rows (``auth.audit``), so into ClickHouse;
nowhere else (source envelopes, decisions, alerts, changelogs). Off (the default), on
no topic at all."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pipeline.contracts.models import AUDIT_COLUMNS
from pipeline.core.policy import DEFAULT_POLICY
from pipeline.settings import Settings
from pipeline.stream.ingest import Record
from pipeline.stream.memory import MemoryPipeline
from tests.unit.test_edge_support import DIGEST_KEY

NOW_MS = 1_790_000_000_000
TYPED = "Plain.Owner@Example.com"


def _events(count: int) -> list[Record]:
    """``count`` failures of the account TYPED from one address (enough to be decided)."""
    return [
        Record(
            "auth.login-attempts",
            0,
            i,
            None,
            orjson.dumps(
                {
                    "event_id": f"e{i}",
                    "occurred_at": f"2026-09-21T14:13:{i:02d}Z",
                    "tenant": "default",
                    "service": "web",
                    "account": TYPED,
                    "peer_ip": "203.0.113.9",
                    "outcome": "failure",
                    "failure_reason": "bad_password",
                }
            ),
        )
        for i in range(count)
    ]


def _run(store_plain: bool) -> MemoryPipeline:
    settings = Settings(
        identity={"digest_key": DIGEST_KEY}, clickhouse={"store_plain_account": store_plain}
    )
    twin = MemoryPipeline(settings, DEFAULT_POLICY)
    twin.feed(_events(30), NOW_MS)
    twin.finish()
    return twin


def _carries(messages: object) -> bool:
    return TYPED in repr(messages)


@pytest.mark.parametrize("store_plain", [True, False])
def test_the_plain_account_travels_only_to_the_audit_path(store_plain: bool) -> None:
    """On: every account envelope row and audit row holds the typed account; off: none.
    Either way no source envelope, rollup share, decision, alert or changelog does."""
    twin = _run(store_plain)
    rows = [
        row
        for (stage, _), log in twin.logs.items()
        if stage == "a"
        for rows, _ in log
        for row in rows
    ]
    plain = AUDIT_COLUMNS.index("account")
    assert len(rows) == 30
    assert {row[3] for row in rows} == {TYPED if store_plain else None}
    assert {row[plain] for row in twin.out.audit_rows} == {TYPED if store_plain else None}
    others = [log for (stage, _), log in twin.logs.items() if stage != "a"]
    assert twin.out.decisions
    assert [
        _carries(others),
        _carries(twin.out.decisions),
        _carries(twin.out.alerts),
        _carries(twin.changelog),
    ] == [False, False, False, False]


def test_the_contract_says_which_topics_carry_it() -> None:
    """docs/contract.md names both topics the plain account travels on when it is on."""
    contract = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text()
    paragraph = contract[contract.index("store_plain_account = true") :][:600]
    assert ("<app>.attempts-by-account" in paragraph, "`auth.audit`" in paragraph) == (True, True)
