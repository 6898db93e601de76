"""Rule 8's baseline never learns an attack, however long it lasts, and still learns a true
change of the norm (issue 44 item 3): once every window of its horizon fired, only the
fired windows whose strangers a sign-in mostly redeemed (people) are its sample."""

from __future__ import annotations

from pipeline.core.rollup import TenantRollup
from tests.unit.test_core_support import policy

WINDOW_MS = 60_000
HORIZON = 60
"""An hour of one-minute windows (the default is an hour of 10 s windows: the same
arithmetic, six times the work)."""
POLICY = policy(tenant_spray={"window_ms": WINDOW_MS, "baseline_windows": HORIZON})
CALM = 20
DAY = 24 * 60


def _fired_windows(accounts: int, strangers: int, redeemed: int, windows: int) -> list[int]:
    """Rule 8's fired windows when ``CALM`` calm windows (5 accounts, 3 sources) are
    followed by ``windows`` windows of ``accounts`` accounts from 12 sources, of which
    ``strangers`` are strangers' places and ``redeemed`` of those a sign-in redeemed."""
    rollup = TenantRollup(POLICY)
    for window in range(CALM + windows):
        busy = window >= CALM
        shares = {
            "a": accounts if busy else 5,
            "s": 12 if busy else 3,
            "x": strangers if busy else 0,
            "r": redeemed if busy else 0,
        }
        for kind, share in shares.items():
            if share:
                rollup.update("t", window, kind, 0, share, window * WINDOW_MS)
        rollup.advance(window * WINDOW_MS + WINDOW_MS // 2)
        rollup.tier.newly_slow_fired.clear()
        rollup.tier.newly_quick_fired.clear()
    return [window for tenant, window in rollup.newly_fired if tenant == "t"]


def test_an_attack_of_a_day_fires_rule_8_in_every_one_of_its_windows() -> None:
    """30 accounts a minute from 12 unredeemed exits for 24 hours: all 1,440 windows fire."""
    fired = _fired_windows(30, 12, 0, DAY)
    assert fired == list(range(CALM, CALM + DAY))


def test_a_true_change_of_the_norm_is_a_wave_for_an_hour_at_most() -> None:
    """The same counts, but people's (10 of 12 strangers' places redeemed): rule 8 fires
    while calm windows remain in its hour, then takes the new level as its norm."""
    fired = _fired_windows(30, 12, 10, 3 * HORIZON)
    assert fired == list(range(CALM, CALM + HORIZON))


def test_an_attack_from_places_that_are_not_strangers_stays_a_wave() -> None:
    """Failures from known places only (no stranger's place: nothing to redeem) are not a
    norm either: every window of three hours fires."""
    fired = _fired_windows(30, 0, 0, 3 * HORIZON)
    assert fired == list(range(CALM, CALM + 3 * HORIZON))


def test_a_wave_of_an_attack_mixed_with_people_stays_a_wave() -> None:
    """Half of the strangers' places redeemed is people's; fewer is an attack's: 5 of 12
    redeemed for three hours fires every window."""
    fired = _fired_windows(30, 12, 5, 3 * HORIZON)
    assert fired == list(range(CALM, CALM + 3 * HORIZON))
