"""The held-out ``stuffing_bursts`` scenario: a pool stuffer pausing past the wave's hold."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from pipeline.core.policy_waves import WaveConfig
from pipeline.sim.scenarios import HOLDOUT_SCENARIOS, SimConfig, SimEvent, generate

T0 = 1_789_999_200_000
HOUR_MS = 3_600_000


def bursts(events: list[SimEvent]) -> list[list[SimEvent]]:
    """The attempts split where more than the wave's hold passes between two of them."""
    out: list[list[SimEvent]] = []
    for e in events:
        if not out or e.occurred_ms - out[-1][-1].occurred_ms > WaveConfig().hold_ms:
            out.append([])
        out[-1].append(e)
    return out


def test_stuffing_bursts_sends_bursts_pauses_past_the_hold_one_use_per_exit() -> None:
    """Seed 7, 5/s, 1 h: 16 bursts of 20-39 s at 7/s, pauses 111-236 s (over the hold), 3,297 exits once each, 82 valid."""
    assert "stuffing_bursts" in HOLDOUT_SCENARIOS
    events = list(generate(SimConfig(("stuffing_bursts",), 5.0, HOUR_MS, 7, T0)))
    runs = bursts(events)
    spans = [(b[-1].occurred_ms - b[0].occurred_ms) / 1000 for b in runs]
    pauses = [(b[0].occurred_ms - a[-1].occurred_ms) / 1000 for a, b in pairwise(runs)]
    reasons = Counter(e.wire.get("failure_reason", "success") for e in events)
    assert (len(events), len(runs)) == (3297, 16)
    assert all(len(b) % 7 == 0 and 20 * 7 <= len(b) <= 40 * 7 for b in runs)
    assert (round(min(spans)), round(max(spans))) == (20, 39)
    assert (round(min(pauses)), round(max(pauses))) == (111, 236)
    assert min(pauses) * 1000 > WaveConfig().hold_ms
    assert len({e.wire["peer_ip"] for e in events}) == len(events)
    assert reasons == {"unknown_account": 2720, "bad_password": 495, "success": 82}
    assert {e.label.role for e in events} == {"attacker"}
    assert {e.wire["user_agent"].startswith("Mozilla/5.0") for e in events} == {True}
