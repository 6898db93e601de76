"""Replay = live in the twin: any batch sizes, any delivery interleaving, a restart: the Engine's outputs."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.contracts.codec import decode_attempt, dumps, encode
from pipeline.core.engine import Engine, replay_order
from pipeline.core.policy import Policy, policy_from_toml
from pipeline.core.sequence import Sequencer
from pipeline.settings import Settings
from pipeline.stream.ingest import Record
from pipeline.stream.memory import MemoryPipeline
from pipeline.stream.rollup_stage import RollupStage
from pipeline.wiring import build_normaliser
from tests.unit.test_stream_memory import NOW_MS, records

# Low thresholds so a short stream trips every kind of rule, rule 8, its strangers tier (its
# quick check and its settled one) and spray included.
POLICY = policy_from_toml("""
policy_version = "order-1"
[defaults.source]
threshold = 20
[defaults.tenant_spray]
min_accounts = 30
min_sources = 1
window_ms = 60000
baseline_windows = 8
factor = 5.0
min_history_windows = 0
recount_ms = 0
[defaults.strangers]
redeem_ms = 60000
span_ms = 300000
active_ms = 60000
min_sources = 4
min_history_ms = 0
quick_ms = 10000
quick_span_ms = 120000
quick_min_sources = 3
""")
RECORDS = records(3000, seed=9)


def outputs(decisions: list[bytes], alerts: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    return sorted(decisions), sorted(alerts)


def engine_outputs(recs: list[Record], policy: Policy = POLICY) -> tuple[list[bytes], list[bytes]]:
    normaliser = build_normaliser(Settings(), policy)
    attempts = sorted(
        (normaliser.normalise(decode_attempt(r.value)) for r in recs), key=replay_order
    )
    engine = Engine(policy)
    engine.run(attempts)
    return outputs(
        [
            *(encode(d) for _, d in engine.out.decisions if d is not None),
            *(raw for _, raw in engine.out.exempts),
        ],
        [encode(a) for a in engine.out.alerts],
    )


EXPECTED = engine_outputs(RECORDS)


def twin_outputs(
    seed: int, sizes: list[int], restart_after: int | None
) -> tuple[list[bytes], list[bytes]]:
    twin = MemoryPipeline(Settings(), POLICY, rng=random.Random(seed))
    start, batch = 0, 0
    while start < len(RECORDS):
        size = sizes[batch % len(sizes)]
        twin.feed(
            RECORDS[start : start + size], NOW_MS, pump=random.Random(seed + batch).random() < 0.5
        )
        start, batch = start + size, batch + 1
        if restart_after is not None and batch == restart_after:
            twin.restart()
    twin.finish()
    return outputs([v for _, v in twin.out.decisions if v is not None], twin.out.alerts)


def test_the_reference_stream_trips_every_kind_of_output() -> None:
    """The policy and traffic above give account and source decisions, spray, tenant (rule 8
    and the strangers tier, its quick check at 00:01:10 then its settled one) and ceiling
    alerts."""
    decisions, alerts = EXPECTED
    assert {b'"rule":"account_source"', b'"rule":"source"'} <= {
        part
        for d in decisions
        for part in (b'"rule":"account_source"', b'"rule":"source"')
        if part in d
    }
    kinds = {
        t
        for a in alerts
        for t in (b"spray_source", b"spray_tenant", b"strangers_tenant", b"account_under_attack")
        if t in a
    }
    assert kinds == {b"spray_source", b"spray_tenant", b"strangers_tenant", b"account_under_attack"}
    tier = [d for d in decisions if b'"rule":"strangers_tenant"' in d]
    # The quick check at 00:01:10, then the settled one; rule 8's window (minute 0) is no
    # calm window for the tier's baseline, so the tier holds while the strangers go on.
    assert sorted(d.split(b'"issued_at":"')[1][11:19] for d in tier) == [
        b"00:01:10",
        b"00:02:00",
        b"00:02:10",
        b"00:03:00",
        b"00:04:00",
        b"00:05:00",
        b"00:06:00",
    ]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    sizes=st.lists(st.integers(1, 700), min_size=1, max_size=4),
    restart_after=st.one_of(st.none(), st.integers(1, 6)),
)
def test_any_batching_and_interleaving_gives_the_engines_outputs(
    seed: int, sizes: list[int], restart_after: int | None
) -> None:
    """Random batch sizes, a random delivery order across partitions and a restart: the
    decisions and alerts of the Engine over the events sorted by (event time, event id)."""
    assert twin_outputs(seed, sizes, restart_after) == EXPECTED


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), max_size=60), st.randoms())
def test_sequencer_releases_in_event_time_order_whatever_the_arrival(
    rows: list[tuple[int, int]], rnd: random.Random
) -> None:
    """Rows of 4 upstreams, each in time order, pushed in any interleaving: released sorted."""
    per_upstream: dict[int, list[int]] = {}
    for upstream, time_ms in rows:
        per_upstream.setdefault(upstream, []).append(time_ms)
    queues = {u: sorted(times) for u, times in per_upstream.items()}
    sequencer = Sequencer(4)
    released: list[int] = []
    positions = dict.fromkeys(range(4), 0)
    while any(queues.values()):
        upstream = rnd.choice([u for u, q in queues.items() if q])
        time_ms = queues[upstream].pop(0)
        sequencer.push(
            time_ms, f"e{upstream}-{positions[upstream]}", upstream, positions[upstream], time_ms, 0
        )
        positions[upstream] += 1
        for u in range(4):
            sequencer.mark(u, queues[u][0] if queues.get(u) else 1 << 40)
        released.extend(item for _, _, item in sequencer.release())
    assert released == sorted(t for _, t in rows)
    assert sequencer.late == 0 and len(sequencer) == 0


def test_any_number_of_stage_partitions_gives_the_engines_outputs() -> None:
    """1 and 3 stage partitions (8 input partitions), random delivery: the same outputs."""
    for partitions in (1, 3):
        settings = Settings.model_validate({"kafka": {"partitions": partitions}})
        twin = MemoryPipeline(settings, POLICY, rng=random.Random(partitions), input_partitions=8)
        for start in range(0, len(RECORDS), 450):
            twin.feed(RECORDS[start : start + 450], NOW_MS)
        twin.finish()
        assert (
            outputs([v for _, v in twin.out.decisions if v is not None], twin.out.alerts)
            == EXPECTED
        )


def test_a_batch_sent_as_several_envelopes_per_partition_applies_no_row_late() -> None:
    """Ingest batches of 450 events sent as envelopes of at most 7 rows (the worker cuts at
    2,000): the marks ride on each partition's last envelope, so no row arrives below its
    stage's watermark, and the outputs are the Engine's."""
    twin = MemoryPipeline(Settings(), POLICY, rng=random.Random(3), envelope_rows=7)
    for start in range(0, len(RECORDS), 450):
        twin.feed(RECORDS[start : start + 450], NOW_MS)
    twin.finish()
    assert outputs([v for _, v in twin.out.decisions if v is not None], twin.out.alerts) == EXPECTED
    sequencers = [*twin.accounts.sequencers.values(), *twin.sources.sequencers.values()]
    assert sum(q.late for q in sequencers) == 0


def test_the_rollup_records_a_rows_spray_and_stuffing_shares_though_they_share_its_position() -> (
    None
):
    """One source-stage row can change both its tenant share ("s") and its unknown-account
    share ("u"), stamped with the same upstream position: the rollup records both, and
    skips both when an upstream's restart sends them again."""
    stage = RollupStage(POLICY, partitions=1)
    stage.rebuild(0, [])
    shares = [
        ["acme", 7, "s", 0, 1, 1_000, "e1", 0],
        ["acme", 7, "u", 0, 1, 1_000, "e1", 0],
        [None, 2_000, "a", 0],
        [None, 2_000, "s", 0],
    ]
    stage.process(0, shares)
    rollup = stage.rollups[0]
    assert (rollup.recorded("acme", 7, "s", 0), rollup.recorded("acme", 7, "u", 0)) == (1, 1)
    assert (stage.sequencers[0].late, stage.sequencers[0].forced, len(stage.sequencers[0])) == (
        0,
        0,
        0,
    )
    stage.process(0, shares[:2])  # re-sent after an upstream's restart: old, skipped, not late
    assert (stage.sequencers[0].late, len(stage.sequencers[0])) == (0, 0)


def test_the_rollup_keeps_its_next_offset_and_any_tenant_name_across_a_rebuild() -> None:
    """The rollup's changelog brings back the next shares message it expects (so a message
    faust dropped is sought back to, as in the other stages) and the shares of tenants named
    like its own records ("fired", "order", "next", "held")."""
    stage = RollupStage(POLICY, partitions=1)
    stage.rebuild(0, [])
    assert stage.expected(0) is None
    shares = [
        [tenant, 7, "s", 0, 1, 1_000, f"e-{tenant}", i]
        for i, tenant in enumerate(("fired", "order", "next", "held"))
    ]
    result = stage.process(0, [*shares, [None, 2_000, "a", 0], [None, 2_000, "s", 0]], offset=41)
    assert stage.expected(0) == 42
    again = RollupStage(POLICY, partitions=1)
    again.rebuild(0, [(key, value) for key, value in result.changelog if value is not None])
    assert again.expected(0) == 42
    assert [
        again.rollups[0].recorded(t, 7, "s", 0) for t in ("fired", "order", "next", "held")
    ] == [1, 1, 1, 1]


def test_a_share_below_the_released_watermark_is_reported_late_with_its_coordinates() -> None:
    """A row that arrives after its stage released past its time is counted and reported
    (upstream, position, time, released watermark) for the worker's stream_rows_late line."""
    stage = RollupStage(POLICY, partitions=1)
    stage.rebuild(0, [])
    first = stage.process(0, [[None, 2_000, "a", 0], [None, 2_000, "s", 0]], offset=0)
    assert (first.late, first.first_late) == (0, None)
    late = stage.process(0, [["acme", 7, "s", 0, 1, 1_500, "e1", 3]], offset=1)
    # position: four slots per source row (source, unknown, stranger, redeemed shares)
    assert (late.late, late.first_late) == (1, [1, 12, 1_500, 2_000])
    assert stage.sequencers[0].late == 1


def test_held_rows_cost_no_changelog_records_and_the_commit_names_the_oldest_message_holding_one() -> (
    None
):
    """A row held across envelopes writes no record; the commit record is [next, hold_from],
    hold_from the first message with a row still held (next when none is)."""
    from pipeline.stream.envelopes import commit_key
    from pipeline.stream.stages import SourceStage

    def forward(seq: int, at_ms: int) -> list[object]:
        attempt = [f"e{seq}", at_ms, "default", "a" * 32, "203.0.113.7", None, None, False]
        return [0, seq, *attempt, "login", False, "bad_password"]

    def commit(result: Any) -> Any:
        return dict(result.changelog)[commit_key(0)]

    stage = SourceStage(POLICY, partitions=1)
    stage.rebuild(0, [])
    first = stage.process(0, 0, [forward(1, 1_000), forward(2, 3_000), [0, -1, 2_000]])
    assert (first.counted, first.held, first.held_records, commit(first)) == (1, 1, 0, b"[1,0]")
    assert not any(b'"held"' in key for key, _ in first.changelog)
    second = stage.process(0, 1, [forward(3, 5_000), [0, -1, 2_500]])
    assert (second.counted, second.held, commit(second)) == (0, 2, b"[2,0]")
    third = stage.process(0, 2, [[0, -1, 4_000]])
    assert (third.counted, third.held, commit(third)) == (1, 1, b"[3,1]")
    fourth = stage.process(0, 3, [[0, -1, 6_000]])
    assert (fourth.counted, fourth.held, commit(fourth)) == (1, 0, b"[4,4]")


def test_a_restore_reads_the_input_again_from_hold_from_and_holds_exactly_what_was_held() -> None:
    """Rebuilt from the changelog after message 2, the stage expects message 1 again; messages
    1-2 only hold their rows again (no outputs, no records), then message 3 releases what the
    stage that never stopped releases, with the same changelog."""
    from pipeline.stream.stages import SourceStage

    def forward(seq: int, at_ms: int) -> list[object]:
        attempt = [f"e{seq}", at_ms, "default", "a" * 32, "203.0.113.7", None, None, False]
        return [0, seq, *attempt, "login", False, "bad_password"]

    messages = [
        [forward(1, 1_000), [0, -1, 2_000]],
        [forward(2, 3_000), forward(3, 2_500), [0, -1, 2_400]],
        [forward(4, 5_000), [0, -1, 2_600]],
        [[0, -1, 9_000]],
    ]
    live = SourceStage(POLICY, partitions=1)
    live.rebuild(0, [])
    changelog: dict[bytes, bytes | None] = {}
    for offset, rows in enumerate(messages[:3]):
        changelog.update(live.process(0, offset, rows).changelog)
    restored = SourceStage(POLICY, partitions=1)
    restored.rebuild(0, [(k, v) for k, v in changelog.items() if v is not None])
    assert (restored.expected(0), len(restored.sequencers[0])) == (1, 0)
    for offset in (1, 2):
        again = restored.process(0, offset, messages[offset])
        assert (again.counted, again.changelog, again.decisions, again.alerts) == (0, [], [], [])
    assert restored.expected(0) == 3
    assert len(restored.sequencers[0]) == len(live.sequencers[0]) == 2
    after, expected = restored.process(0, 3, messages[3]), live.process(0, 3, messages[3])
    assert (after.counted, after.changelog, after.decisions) == (
        expected.counted,
        expected.changelog,
        expected.decisions,
    )
    assert after.counted == 2


def test_held_rows_an_older_worker_wrote_as_records_restore_and_their_records_are_deleted() -> None:
    """A changelog with held-row records and a bare next offset (written before hold_from):
    the row is held again, and once released its record gets a tombstone."""
    from pipeline.contracts.codec import dumps
    from pipeline.stream.envelopes import changelog_key, commit_key
    from pipeline.stream.stages import SourceStage

    attempt = ["e2", 3_000, "default", "a" * 32, "203.0.113.7", None, None, False]
    row = [0, 2, *attempt, "login", False, "bad_password"]
    held_key = changelog_key(0, ["held", 0, 2])
    progress = {"positions": {"0": 2}, "order": [1, 2_000, [[0, 2_000]], [1_000, "e1", 0, 1]]}
    legacy = [
        (held_key, dumps([3_000, "e2", row])),
        (changelog_key(0, ["inputs"]), dumps(progress)),
        (commit_key(0), dumps(1)),
    ]
    stage = SourceStage(POLICY, partitions=1)
    stage.rebuild(0, legacy)
    assert (stage.expected(0), len(stage.sequencers[0])) == (1, 1)
    result = stage.process(0, 1, [[0, -1, 4_000]])
    assert (result.counted, result.held, result.held_records) == (1, 0, 1)
    assert (held_key, None) in result.changelog
    assert dict(result.changelog)[commit_key(0)] == b"[2,2]"


def test_the_rollup_keeps_each_tenants_last_wave_across_a_rebuild() -> None:
    """The rollup's ``order`` record carries each tenant's last wave ``[since, expires]``,
    so a restored rollup's next wave record reaches back to the same lead-in."""
    stage = RollupStage(POLICY, partitions=1)
    stage.rebuild(0, [])
    stage.rollups[0].waves["t"] = [1_000, 61_000]
    result = stage.process(0, [[None, 2_000, "a", 0], [None, 2_000, "s", 0]], offset=3)
    again = RollupStage(POLICY, partitions=1)
    again.rebuild(0, [(key, value) for key, value in result.changelog if value is not None])
    assert again.rollups[0].waves == {"t": [1_000, 61_000]}


def test_the_rollup_keeps_the_quick_checks_sums_and_firings_across_a_rebuild() -> None:
    """The quick check's sums (its baseline sample) and fired windows are changelog records;
    a forgotten sum is a tombstone, so a restored rollup holds exactly the live one's."""
    stage = RollupStage(POLICY, partitions=1)
    stage.rebuild(0, [])
    tier = stage.rollups[0].tier
    tier.quick_sums["t"] = {7: 3, 8: 5}
    tier.newly_quick_sums.extend([("t", 7, 3), ("t", 8, 5), ("t", 6, None)])
    tier.quick_fired.add(("t", 8))
    tier.newly_quick_fired.append(("t", 8))
    result = stage.process(0, [[None, 2_000, "a", 0], [None, 2_000, "s", 0]], offset=3)
    assert (dumps([0, "quick", "t", 6]), None) in result.changelog
    again = RollupStage(POLICY, partitions=1)
    again.rebuild(0, [(key, value) for key, value in result.changelog if value is not None])
    assert (again.rollups[0].tier.quick_sums, again.rollups[0].tier.quick_fired) == (
        {"t": {7: 3, 8: 5}},
        {("t", 8)},
    )


def test_the_tier_gets_rule_8s_fired_windows_back_across_a_rebuild() -> None:
    """Rule 8's fired windows are changelog records; a restored rollup gives them to the
    slow tier too (its baselines leave them out), as the live one did when they fired."""
    stage = RollupStage(POLICY, partitions=1)
    stage.rebuild(0, [])
    rollup = stage.rollups[0]
    rollup.fired.add(("t", 8))
    rollup.tier.rule8_fired.add(("t", 8))
    rollup.newly_fired.append(("t", 8))
    result = stage.process(0, [[None, 2_000, "a", 0], [None, 2_000, "s", 0]], offset=3)
    again = RollupStage(POLICY, partitions=1)
    again.rebuild(0, [(key, value) for key, value in result.changelog if value is not None])
    assert (again.rollups[0].fired, again.rollups[0].tier.rule8_fired) == ({("t", 8)}, {("t", 8)})
