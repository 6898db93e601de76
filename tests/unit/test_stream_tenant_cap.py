"""The tenant cap admits a tenant only for a fully valid event (issue 26 item 3): events
dead-lettered for any other reason take no ``ingest.max_tenants`` slot."""

from __future__ import annotations

import orjson
import pytest

from pipeline.stream.ingest import Ingest, Record
from pipeline.wiring import build_normaliser
from tests.unit.test_edge_support import SETTINGS

NOW_MS = 1_790_000_000_000
GOOD = {
    "event_id": "e",
    "occurred_at": "2026-09-21T14:13:20Z",
    "tenant": "acme",
    "service": "web",
    "account": "alice",
    "peer_ip": "203.0.113.9",
    "outcome": "failure",
    "failure_reason": "bad_password",
}
# Each is valid up to one fault found after decoding: normalisation or a timestamp check.
FAULTS = {
    "empty_account": {"account": "\u200b \u00ad"},
    "bad_peer_ip": {"peer_ip": "not-an-address"},
    "future_timestamp": {"occurred_at": "2027-09-21T14:13:20Z"},
    "past_timestamp": {"occurred_at": "2026-01-01T00:00:00Z"},
}


def _record(offset: int, **fields: object) -> Record:
    return Record("auth.login-attempts", 0, offset, None, orjson.dumps({**GOOD, **fields}))


@pytest.mark.parametrize("reason", sorted(FAULTS))
def test_a_dead_lettered_event_takes_no_tenant_slot(reason: str) -> None:
    """With max_tenants=1, an invalid event of tenant 'evil' is dead-lettered for its own
    fault and 'acme' is still admitted afterwards."""
    ingest = Ingest(normaliser=build_normaliser(SETTINGS), partitions=4, max_tenants=1)
    records = [_record(0, tenant="evil", **FAULTS[reason]), _record(1)]
    result = ingest.process(records, NOW_MS)
    assert [(d.record.offset, d.reason) for d in result.dead] == [(0, reason)]
    assert (result.valid, ingest.admitted) == (1, {"acme"})
