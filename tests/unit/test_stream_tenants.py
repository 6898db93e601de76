"""Tenants at ingest (issue 15): one syntax (dead-letter invalid_field), an allow-list,
a cap on the tenants a worker tracks, and dedupe scoped by tenant."""

from __future__ import annotations

import orjson
import pytest

from pipeline.core.dedupe import Deduper
from pipeline.core.engine import Engine
from pipeline.errors import ConfigError
from pipeline.settings import load_settings
from pipeline.stream.ingest import Ingest, Record
from pipeline.wiring import build_normaliser
from tests.unit.test_core_support import att
from tests.unit.test_edge_support import SETTINGS

NOW_MS = 1_790_000_000_000


def _record(offset: int, tenant: str, event_id: str | None = None) -> Record:
    event = {
        "event_id": event_id or f"e{offset}",
        "occurred_at": "2026-09-21T14:13:20Z",
        "tenant": tenant,
        "service": "web",
        "account": "alice",
        "peer_ip": "203.0.113.9",
        "outcome": "failure",
        "failure_reason": "bad_password",
    }
    return Record("auth.login-attempts", 0, offset, None, orjson.dumps(event))


def _ingest(**kw: object) -> Ingest:
    return Ingest(normaliser=build_normaliser(SETTINGS), partitions=4, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tenant",
    ["a\\", "\\') OR 1=1 --", "Acme", "acme corp", "-", ".a", "a|b", "a" * 65, "caf\u00e9"],
)
def test_a_tenant_outside_the_syntax_is_dead_lettered_invalid_field(tenant: str) -> None:
    """Issue 15 #15: tenants outside [a-z0-9][a-z0-9._-]{0,63} never reach counters,
    decisions or ClickHouse: dead-lettered invalid_field, naming the tenant field."""
    result = _ingest().process([_record(0, tenant)], NOW_MS)
    assert (result.valid, [d.reason for d in result.dead]) == (0, ["invalid_field"])
    assert result.dead[0].detail.startswith("tenant: ")


def test_tenants_inside_the_syntax_pass() -> None:
    """acme, eu-1.prod, a_b, 0 and a 64-character name are accepted."""
    tenants = ["acme", "eu-1.prod", "a_b", "0", "a" * 64]
    result = _ingest().process([_record(i, t) for i, t in enumerate(tenants)], NOW_MS)
    assert (result.valid, result.dead) == (5, [])


def test_an_allow_list_dead_letters_other_tenants() -> None:
    """Issue 15 #16: with ingest.tenants set, other tenants are dead-lettered unknown_tenant."""
    ingest = _ingest(tenants=frozenset({"acme", "default"}))
    records = [_record(0, "acme"), _record(1, "globex"), _record(2, "default")]
    result = ingest.process(records, NOW_MS)
    assert result.valid == 2
    assert [(d.record.offset, d.reason) for d in result.dead] == [(1, "unknown_tenant")]


def test_the_worker_tracks_at_most_max_tenants() -> None:
    """Issue 15 #16: past ingest.max_tenants, new tenants are dead-lettered tenant_cap (the
    tenants already tracked still pass), so inventing tenants cannot grow a worker."""
    ingest = _ingest(max_tenants=3)
    records = [_record(i, f"t{i % 5}") for i in range(10)]
    result = ingest.process(records, NOW_MS)
    assert result.valid == 6
    assert [(d.record.offset, d.reason) for d in result.dead] == [
        (3, "tenant_cap"),
        (4, "tenant_cap"),
        (8, "tenant_cap"),
        (9, "tenant_cap"),
    ]
    assert ingest.admitted == {"t0", "t1", "t2"}
    assert result.reasons == {"tenant_cap": 4}


def test_settings_refuse_bad_tenant_names_and_wire_the_cap() -> None:
    """ingest.tenants and case_sensitive_tenants use the same validator; max_tenants >= 1."""
    for bad in ({"tenants": ["Acme"]}, {"case_sensitive_tenants": ["a|b"]}, {"max_tenants": 0}):
        with pytest.raises(ConfigError, match="ingest"):
            load_settings(ingest=bad)
    assert load_settings(ingest={"tenants": ["acme"]}).ingest.max_tenants == 1000


def test_dedupe_is_scoped_by_tenant() -> None:
    """Issue 15 #16: one event_id in two tenants is two attempts; in one tenant, one."""
    dedupe = Deduper(horizon_ms=1000, capacity=100)
    assert dedupe.seen("e1", 0, "acme") is False
    assert dedupe.seen("e1", 1, "globex") is False
    assert dedupe.seen("e1", 2, "acme") is True
    assert (len(dedupe), dedupe.duplicates) == (2, 1)


def test_a_tenant_reusing_event_ids_does_not_hide_another_tenants_attempts() -> None:
    """The engine counts both tenants' failures when their event ids collide."""
    engine = Engine()
    engine.step_batch([att(0, tenant="acme", event_id="x"), att(1, tenant="globex", event_id="x")])
    assert (engine.accounts.metrics.counted, engine.accounts.metrics.duplicates) == (2, 0)


def test_the_worker_builds_its_ingest_with_the_tenant_settings() -> None:
    """ingest.tenants and ingest.max_tenants reach the worker's ingest (its in-memory twin
    builds it the same way): a refused tenant's events are dead letters, never decisions."""
    from pipeline.core.policy import DEFAULT_POLICY
    from pipeline.settings import Settings
    from pipeline.stream.memory import MemoryPipeline

    twin = MemoryPipeline(Settings(ingest={"max_tenants": 1}), DEFAULT_POLICY)
    twin.feed([_record(i, "acme" if i < 20 else "globex") for i in range(40)], NOW_MS)
    assert [d.reason for d in twin.out.dead] == ["tenant_cap"] * 20
    assert {key.split(b"|")[1] for key, _ in twin.out.decisions} <= {b"acme"}
    twin = MemoryPipeline(Settings(ingest={"tenants": ["globex"]}), DEFAULT_POLICY)
    twin.feed([_record(0, "acme")], NOW_MS)
    assert [d.reason for d in twin.out.dead] == ["unknown_tenant"]


def test_a_policy_tenant_table_outside_the_syntax_is_refused() -> None:
    """[tenants.<name>] uses the same validator: a name no event could carry is an error."""
    from pipeline.core.errors import PolicyError
    from pipeline.core.policy import policy_from_toml

    with pytest.raises(PolicyError, match="tenant must match"):
        policy_from_toml('[tenants."Acme"]\nentry_cap = 1000\n')
    assert "acme" in policy_from_toml("[tenants.acme]\nentry_cap = 1000\n").tenants
