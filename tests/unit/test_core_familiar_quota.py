"""``familiar.new_per_day``: an account makes at most that many new places and clients
familiar per UTC day, so one account signing in from a proxy pool cannot evict the owners'."""

from __future__ import annotations

import orjson

from pipeline.contracts.models import Decision
from pipeline.core.account import AccountShard
from pipeline.core.engine import Engine
from pipeline.core.outbox import Outbox
from tests.unit.test_core_support import T0, att, policy

DAY = 86_400_000
OWN = "a" * 32
T_DAY = T0 - T0 % DAY  # the UTC day T0 falls in


def _exit(i: int) -> str:
    return f"203.0.{i // 250}.{i % 250 + 1}"


def _exempts(out: Outbox) -> list[Decision]:
    return [Decision.model_validate_json(raw) for _, raw in out.exempts]


def _exempt_sources(out: Outbox) -> list[str | None]:
    return [d.source for d in _exempts(out) if d.device_id is None]


def test_the_quota_stops_new_places_for_the_rest_of_the_utc_day() -> None:
    """new_per_day 3: four new places in a day publish three; the next UTC day a fifth
    place is published again, and a known place renews without counting."""
    shard, out = AccountShard(policy(familiar={"new_per_day": 3})), Outbox()
    at = T_DAY - T0 + 3_600_000  # 01:00 UTC of T0's day, relative to T0
    for i in range(4):
        shard.step(att(at + i * 1000, account=OWN, source=_exit(i), success=True), 0, out, i)
    assert _exempt_sources(out) == [_exit(0), _exit(1), _exit(2)]
    assert shard.metrics.familiar_quota_reached == 1
    out.clear()
    tomorrow = at + DAY
    shard.step(att(tomorrow, account=OWN, source=_exit(0), success=True), 0, out, 10)
    shard.step(att(tomorrow + 1000, account=OWN, source=_exit(4), success=True), 0, out, 11)
    assert _exempt_sources(out) == [_exit(0), _exit(4)]  # a renewal, then a new place
    today = shard.tenants["default"].familiar_new.get(("familiar_new", "default", OWN, None, None))
    assert today is not None and (today.count, today.keep_until_ms) == (1, T_DAY + 2 * DAY)


def test_places_and_clients_share_the_quota() -> None:
    """A new place and a new cookie each count: new_per_day 3 lets two successes through
    (place, client, place), the third's client is not published."""
    shard, out = AccountShard(policy(familiar={"new_per_day": 3})), Outbox()
    for i in range(2):
        success = att(i * 1000, account=OWN, source=_exit(i), device=f"c{i}", success=True)
        shard.step(success, 0, out, i)
    kinds = [(d.source, d.device_id) for d in _exempts(out)]
    assert kinds == [(_exit(0), None), (None, "c0"), (_exit(1), None)]
    assert shard.metrics.familiar_quota_reached == 1


def test_zero_is_no_limit() -> None:
    """new_per_day 0: 50 new places in one day publish 50."""
    shard, out = AccountShard(policy(familiar={"new_per_day": 0})), Outbox()
    for i in range(50):
        shard.step(att(i * 1000, account=OWN, source=_exit(i), success=True), 0, out, i)
    assert len(_exempt_sources(out)) == 50 and shard.metrics.familiar_quota_reached == 0


def test_the_days_count_survives_a_restore_and_a_replay_is_not_counted_twice() -> None:
    """Two places counted, then a restore from the changelog: a replay of the second
    success counts nothing, and the quota of 3 leaves one more new place that day."""
    pol = policy(familiar={"new_per_day": 3})
    shard, out = AccountShard(pol), Outbox()
    for i in range(2):
        shard.step(att(i * 1000, account=OWN, source=_exit(i), success=True), 0, out, i)
    log = {orjson.dumps(k): v for k, v in shard.take_dirty()}
    restored = AccountShard(pol)
    for key, value in log.items():
        restored.restore(orjson.loads(key), value)
    restored.finish_restore(Outbox())
    out = Outbox()
    restored.step(att(1000, account=OWN, source=_exit(1), success=True), 0, out, 1)  # replayed
    for i in range(2, 4):
        restored.step(att(i * 1000, account=OWN, source=_exit(i), success=True), 0, out, i)
    assert _exempt_sources(out) == [_exit(2)]
    assert restored.metrics.familiar_quota_reached == 1


def test_one_account_signing_in_from_a_pool_does_not_evict_the_owners() -> None:
    """familiar.entry_cap 100: 40 owners at home, then the attacker's own account signs in from
    1,000 exits in an hour. It makes 20 of them familiar (the default quota); every owner's
    place keeps its exempt and nothing is evicted."""
    engine = Engine(policy(familiar={"entry_cap": 100}))
    owners = [
        att(i * 1000, account=f"{i:032x}", source=f"198.51.100.{i + 1}", success=True)
        for i in range(40)
    ]
    flood = [
        att(60_000 + i * 3_600, account=OWN, source=_exit(i), success=True) for i in range(1000)
    ]
    engine.step_batch([*owners, *flood])
    familiar = engine.accounts.tenants["default"].familiar
    assert (len(familiar), familiar.evictions) == (60, 0)
    assert all(("familiar", "default", o.account, o.source, None) in familiar for o in owners)
    assert engine.accounts.metrics.familiar_quota_reached == 980
