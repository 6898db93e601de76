"""The edge's decision view (issue 6): applying the topic, expiry, bad messages, and the
check answering exactly as the core's shared check with the worker's normalisation."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from types import SimpleNamespace

import orjson
import pytest
from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contracts.codec import encode
from pipeline.core.decision_keys import applicable_keys
from pipeline.core.decisions import DecisionIndex
from pipeline.core.keys import Key, format_key
from pipeline.edge import feed as view_module
from pipeline.edge.blocklist import BlockEntry
from pipeline.edge.changes import ChangeSignal
from pipeline.edge.errors import CheckInputError
from pipeline.edge.feed import DecisionFeed, FeedConfig
from pipeline.edge.view import DecisionView
from pipeline.settings import Settings
from tests.unit.test_edge_support import (
    ACCOUNT,
    MIN,
    PEER,
    PROXY,
    T0,
    TENANT,
    Clock,
    account_digest,
    account_key,
    account_source_key,
    decision,
    device_digest,
    device_key,
    message,
    new_view,
    normaliser,
    session_digest,
    source_key,
    tombstone,
)

UNTIL = T0 + 15 * MIN


def test_decision_refuses_and_tombstone_lifts() -> None:
    """An account block refuses with the remaining time; its tombstone lifts it."""
    clock = Clock()
    view = new_view(clock)
    assert view.apply(*message(account_key(), UNTIL)) == "put"
    clock.now = T0 + 5 * MIN
    verdict = view.check(TENANT, ACCOUNT, PEER, (), None, False, "login")
    assert (verdict.allowed, verdict.retry_after_ms) == (False, 10 * MIN)
    assert verdict.matched_key == account_key()
    assert view.apply(*tombstone(account_key())) == "lift"
    assert view.check(TENANT, ACCOUNT, PEER).allowed is True
    assert len(view) == 0


def test_expired_decision_is_not_enforced_without_tombstone() -> None:
    """A decision stops refusing at its expires_at and prune drops it, no tombstone needed."""
    clock = Clock()
    view = new_view(clock)
    view.apply(*message(account_key(), UNTIL))
    clock.now = UNTIL - 1
    assert view.check(TENANT, ACCOUNT, PEER).retry_after_ms == 1
    clock.now = UNTIL
    assert view.check(TENANT, ACCOUNT, PEER).allowed is True
    assert view.prune() == 1
    assert len(view) == 0
    assert view.stats.pruned == 1


def test_decision_already_expired_on_arrival_is_dropped_and_lifts_its_key() -> None:
    """An expired decision read from the topic replaces (lifts) the key's older decision."""
    clock = Clock(T0 + 20 * MIN)
    view = new_view(clock)
    view.apply(*message(account_key(), T0 + 60 * MIN))
    assert view.apply(*message(account_key(), T0 + 16 * MIN)) == "expired"
    assert len(view) == 0
    assert view.check(TENANT, ACCOUNT, PEER).allowed is True
    assert view.stats.outcomes == {"put": 1, "lift": 0, "expired": 1, "bad": 0}


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (None, b"{}", "bad_key"),
        (b"", b"{}", "bad_key"),
        (b"\xff\xfe", b"{}", "bad_key"),
        (b"account|default|x", b"{}", "bad_key"),
        (b"weird|default|a|-|-", b"{}", "bad_key"),
        (b"source|default|-|10.0.0.1; allow all|-", b"{}", "bad_source"),
        (b"source|default|-|not-an-ip|-", b"{}", "bad_source"),
    ],
)
def test_bad_keys_are_counted_and_ignored(key: bytes | None, value: bytes, reason: str) -> None:
    """A message with a missing or malformed key is counted by reason and changes nothing."""
    view = new_view()
    view.apply(*message(account_key(), UNTIL))
    assert view.apply(key, value) == "bad"
    assert view.stats.bad_reasons == {reason: 1}
    assert len(view) == 1


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: b"not json", "not_json"),
        (lambda d: b"[1, 2]", "not_json"),
        (lambda d: orjson.dumps({**d, "key": "account|default|other|-|-"}), "key_mismatch"),
        (lambda d: orjson.dumps({**d, "action": "challenge"}), "bad_value"),
        (lambda d: orjson.dumps({**d, "expires_at": "tomorrow"}), "bad_value"),
        (lambda d: orjson.dumps({**d, "expires_at": "2026-09-21T14:30:00"}), "bad_value"),
        (lambda d: orjson.dumps({k: v for k, v in d.items() if k != "decision_id"}), "bad_value"),
        (lambda d: orjson.dumps({**d, "rule": 7}), "bad_value"),
        (lambda d: b"", "not_json"),
    ],
)
def test_bad_values_are_counted_and_keep_the_last_good_decision(
    mutate: object, reason: str
) -> None:
    """Issue 15 #2: a bad value under a valid key is counted and logged, and the key keeps
    its last good decision (the check still refuses); the view never raises."""
    view = new_view()
    key_bytes, good = message(account_key(), UNTIL)
    view.apply(key_bytes, good)
    bad = mutate(orjson.loads(good))  # type: ignore[operator]
    assert view.apply(key_bytes, bad) == "bad"
    assert view.stats.bad_reasons == {reason: 1}
    assert len(view) == 1
    assert view.check(TENANT, ACCOUNT, PEER).allowed is False


def test_garbage_on_a_source_block_keeps_the_block_and_the_blocklist_entry() -> None:
    """Issue 15 #2 as reported: a block on 6.6.6.6, then b"garbage" on its key: still refused."""
    view = new_view()
    key_bytes, good = message(source_key("6.6.6.6"), UNTIL)
    view.apply(key_bytes, good)
    assert view.apply(key_bytes, b"garbage") == "bad"
    assert view.check(TENANT, ACCOUNT, "6.6.6.6").allowed is False
    assert [entry.source for entry in view.blocklist()[0]] == ["6.6.6.6"]
    assert view.stats.outcomes["bad"] == 1


def test_extra_fields_from_a_newer_worker_are_ignored() -> None:
    """A decision with fields this edge does not know still applies."""
    view = new_view()
    key_bytes, good = message(account_key(), UNTIL)
    newer = orjson.dumps({**orjson.loads(good), "challenge": "captcha", "schema": 2})
    assert view.apply(key_bytes, newer) == "put"
    assert view.check(TENANT, ACCOUNT, PEER).allowed is False


def test_normalisation_matches_the_worker() -> None:
    """Case and NFKC folding, the keyed digest, trusted-proxy XFF and IPv6 /64 grouping give
    the keys the worker wrote."""
    view = new_view()
    view.apply(*message(account_source_key("203.0.113.9"), UNTIL))
    view.apply(*message(account_source_key("2001:db8:1:2::/64"), UNTIL))
    fullwidth = "ＡＬＩＣＥ@example.com"  # noqa: RUF001 - full-width letters on purpose
    assert view.check(TENANT, fullwidth, PROXY, "203.0.113.9").allowed is False
    assert (
        view.check(TENANT, "  alice@EXAMPLE.com ", PROXY, ["198.51.100.1", "203.0.113.9"]).allowed
        is False
    )
    # A client's own XFF claim behind an untrusted peer is ignored: the peer is the source.
    assert view.check(TENANT, ACCOUNT, "192.0.2.1", "203.0.113.9").allowed is True
    assert view.check(TENANT, ACCOUNT, "2001:db8:1:2:aaaa::1").allowed is False
    assert view.check(TENANT, ACCOUNT, "2001:db8:1:3::1").allowed is True
    assert account_digest() == normaliser().account_digest(TENANT, "alice@example.com")


def test_other_digest_key_means_other_digests() -> None:
    """An edge configured with another digest key does not match the worker's decisions."""
    view = new_view(settings=Settings(identity={"digest_key": "another-key-0123456789-0123456789"}))
    view.apply(*message(account_key(), UNTIL))
    assert view.check(TENANT, ACCOUNT, PEER).allowed is True


def test_trusted_device_is_never_refused_by_account_blocks() -> None:
    """Account and account_source blocks refuse strangers but not the owner's trusted device;
    a device block refuses that device only; trusted without a device counts as untrusted."""
    view = new_view()
    view.apply(*message(account_key(), UNTIL))
    view.apply(*message(account_source_key(), UNTIL))
    assert view.check(TENANT, ACCOUNT, PEER, (), "owner-laptop", True).allowed is True
    assert view.check(TENANT, ACCOUNT, PEER, (), "owner-laptop", False).allowed is False
    assert view.check(TENANT, ACCOUNT, PEER, (), None, True).allowed is False
    view.apply(*message(device_key("stolen-cookie"), UNTIL))
    assert view.check(TENANT, ACCOUNT, PEER, (), "stolen-cookie", True).allowed is False
    assert view.check(TENANT, ACCOUNT, PEER, (), "owner-laptop", True).allowed is True


def test_uia_mfa_and_source_scopes() -> None:
    """uia blocks apply per session, mfa per device, a rule's source blocks (address or
    grouped IPv6 /64) to every flow but a password flow from a trusted device."""
    view = new_view()
    digest = account_digest()
    view.apply(*message(("uia", TENANT, digest, None, session_digest("s-1")), UNTIL))
    view.apply(*message(("mfa", TENANT, digest, None, device_digest("phone")), UNTIL))
    assert view.check(TENANT, ACCOUNT, PEER, flow="uia", session_id="s-1").allowed is False
    assert view.check(TENANT, ACCOUNT, PEER, flow="uia", session_id="s-2").allowed is True
    assert view.check(TENANT, ACCOUNT, PEER, flow="login", session_id="s-1").allowed is True
    assert view.check(TENANT, ACCOUNT, PEER, (), "phone", flow="mfa").allowed is False
    assert view.check(TENANT, ACCOUNT, PEER, (), "tablet", flow="mfa").allowed is True
    view.apply(*message(source_key("203.0.113.5"), UNTIL))
    view.apply(*message(source_key("2001:db8:1:2::/64"), UNTIL))
    for flow in ("login", "token", "recovery", "uia", "mfa"):
        for peer in ("203.0.113.5", "2001:db8:1:2::99"):
            verdict = view.check(TENANT, "bob", peer, (), "dev", False, flow)
            assert verdict.allowed is False, (flow, peer)
            trusted = view.check(TENANT, "bob", peer, (), "dev", True, flow)
            assert trusted.allowed is (flow in ("login", "token", "recovery")), (flow, peer)
    assert view.check(TENANT, "bob", "203.0.113.6").allowed is True


def test_observe_decision_never_refuses_but_is_reported() -> None:
    """An observe-only decision allows and names itself as observed; a block alongside wins."""
    view = new_view()
    view.apply(*message(account_key(), UNTIL, action="observe"))
    verdict = view.check(TENANT, ACCOUNT, PEER)
    assert (verdict.allowed, verdict.retry_after_ms, verdict.applied) == (True, 0, "observe")
    assert verdict.observed_key == account_key()
    view.apply(*message(account_source_key(), T0 + 3 * MIN))
    verdict = view.check(TENANT, ACCOUNT, PEER)
    assert (verdict.allowed, verdict.retry_after_ms) == (False, 3 * MIN)


def test_check_equals_the_core_check() -> None:
    """For a spread of attempts, the view's verdict equals DecisionIndex.check on the keys
    the core derives from the worker's normalisation."""
    clock = Clock(T0 + 2 * MIN)
    view = new_view(clock)
    core = DecisionIndex()
    for i, key in enumerate(
        [
            account_key(),
            account_source_key(),
            device_key("d1"),
            source_key("203.0.113.5"),
            account_key("bob"),
        ]
    ):
        key_bytes, value = message(key, T0 + (i + 3) * MIN, action="observe" if i == 4 else "block")
        view.apply(key_bytes, value)
        active = view.index.get(key)
        assert active is not None
        core.put(key, active)
    norm = normaliser()
    for account in (ACCOUNT, "bob", "carol"):
        for peer in (PEER, "203.0.113.5", "192.0.2.44"):
            for device, trusted in ((None, False), ("d1", True), ("d1", False), ("d2", True)):
                for flow in ("login", "uia", "mfa"):
                    keys = applicable_keys(
                        TENANT,
                        norm.account_digest(TENANT, account),
                        norm.sources.source_of(peer, ()),
                        norm.digester.device(TENANT, device) if device else None,
                        None,
                        trusted and device is not None,
                        flow,
                    )
                    expected = core.check(keys, clock.now)
                    assert view.check(TENANT, account, peer, (), device, trusted, flow) == expected


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"flow": "bogus"}, "flow"),
        ({"trusted": "false"}, "trusted"),
        ({"account": ""}, "account"),
        ({"account": "a" * 321}, "account"),
        ({"account": "   "}, "account"),
        ({"tenant": ""}, "tenant"),
        ({"tenant": "a|b"}, "tenant"),
        ({"tenant": "-"}, "tenant"),
        ({"tenant": "t" * 65}, "tenant"),
        ({"source_ip": "not-an-ip"}, "ip"),
        ({"source_ip": ""}, "ip"),
        ({"forwarded_for": ",".join(["192.0.2.1"] * 65)}, "forwarded_for"),
        ({"forwarded_for": [1, 2]}, "forwarded_for"),
        ({"device_id": "d" * 257}, "device"),
        ({"session_id": "s" * 257, "flow": "uia"}, "session"),
    ],
)
def test_malformed_arguments_name_their_parameter(
    kwargs: dict[str, object], parameter: str
) -> None:
    """Every malformed argument raises CheckInputError naming the HTTP parameter."""
    args: dict[str, object] = {"tenant": TENANT, "account": ACCOUNT, "source_ip": PEER, **kwargs}
    with pytest.raises(CheckInputError) as caught:
        new_view().check(**args)  # type: ignore[arg-type]
    assert caught.value.parameter == parameter


def test_at_320_characters_an_account_is_accepted() -> None:
    """The account length limit is inclusive (320 characters, as in login_attempt)."""
    assert new_view().check(TENANT, "a" * 320, PEER).allowed is True


def test_caches_are_bounded() -> None:
    """Distinct identifiers never grow the normalisation caches past their capacity; the
    oldest entries go first (OrderedDicts: a plain dict slowed down evicting its head)."""
    view = DecisionView(normaliser(), now_ms=Clock(), cache_entries=100)
    for i in range(1000):
        view.check(TENANT, f"user{i}", f"192.0.2.{i % 250}", (), f"dev{i}", True)
    sizes = [len(c) for c in (view._accounts, view._addresses, view._devices, view._keys)]
    assert sizes == [100, 100, 100, 100]
    assert [type(c) for c in (view._accounts, view._keys)] == [OrderedDict, OrderedDict]
    assert next(iter(view._devices)) == (TENANT, "dev900")  # the oldest 900 went first


def test_list_forwarded_for_gives_the_same_answer_as_text() -> None:
    """forwarded_for as a list, a tuple or a header value gives the same verdict."""
    view = new_view()
    view.apply(*message(account_source_key("203.0.113.9"), UNTIL))
    for hops in (["203.0.113.9"], ("203.0.113.9",), "203.0.113.9", " 203.0.113.9 ,"):
        assert view.check(TENANT, ACCOUNT, PROXY, hops).allowed is False


def test_blocklist_lists_active_source_decisions() -> None:
    """blocklist() holds unexpired source blocks (observe ones on request), filtered by tenant,
    with the first expiry as its validity."""
    clock = Clock()
    view = new_view(clock)
    view.apply(*message(source_key("203.0.113.7"), T0 + 10 * MIN, decision_id="a" * 32))
    view.apply(*message(source_key("2001:db8:1:2::/64"), T0 + 5 * MIN, decision_id="b" * 32))
    view.apply(
        *message(
            source_key("192.0.2.9", "acme"), T0 + 7 * MIN, action="observe", decision_id="c" * 32
        )
    )
    view.apply(*message(account_key(), UNTIL))
    entries, valid_until = view.blocklist()
    assert sorted(entries) == [
        BlockEntry("default", "2001:db8:1:2::/64", "block", "source", "b" * 32, T0 + 5 * MIN),
        BlockEntry("default", "203.0.113.7", "block", "source", "a" * 32, T0 + 10 * MIN),
    ]
    assert valid_until == T0 + 5 * MIN
    entries, _ = view.blocklist(include_observe=True, tenant="acme")
    assert [(e.source, e.action) for e in entries] == [("192.0.2.9", "observe")]
    clock.now = T0 + 5 * MIN
    assert [e.source for e in view.blocklist()[0]] == ["203.0.113.7"]


def test_source_decisions_wider_than_one_source_are_refused() -> None:
    """0.0.0.0/0, a /24 (IPv4 grouped by /32) or an IPv6 /48 never become active: counted
    as bad_source, never in the check nor on the feed; they lift nothing either."""
    clock = Clock()
    view = new_view(clock)
    view.apply(*message(source_key("203.0.113.0/25"), T0 + 10 * MIN, decision_id="e" * 32))
    view.apply(*message(source_key("203.0.113.7"), T0 + 10 * MIN, decision_id="a" * 32))
    for wide in ("0.0.0.0/0", "203.0.113.0/24", "2001:db8::/48"):
        assert view.apply(*message(source_key(wide), T0 + 10 * MIN)) == "bad"
    assert view.stats.bad_reasons["bad_source"] == 4
    assert [e.source for e in view.blocklist()[0]] == ["203.0.113.7"]
    assert view.check("default", "x@example.com", "203.0.113.8").allowed


def test_blocklist_version_moves_on_source_changes_only() -> None:
    """Source puts, lifts and expiries bump the block-list version; other scopes do not."""
    clock = Clock()
    view = new_view(clock)
    version = view.blocklist_changes.version
    view.apply(*message(account_key(), UNTIL))
    assert view.blocklist_changes.version == version
    view.apply(*message(source_key("203.0.113.7"), T0 + MIN))
    assert view.blocklist_changes.version == version + 1
    view.apply(*tombstone(source_key("203.0.113.7")))
    assert view.blocklist_changes.version == version + 2
    view.apply(*tombstone(source_key("203.0.113.7")))
    assert view.blocklist_changes.version == version + 2
    view.apply(*message(source_key("203.0.113.8"), T0 + MIN))
    clock.now = T0 + MIN
    view.prune()
    assert view.blocklist_changes.version == version + 4
    assert view.blocklist()[0] == []


async def test_change_signal_wakes_waiters() -> None:
    """A waiter wakes at the next bump; without one it times out with False."""
    signal = ChangeSignal()
    assert await signal.wait(signal.version, 0.01) is False
    waiter = asyncio.create_task(signal.wait(signal.version, 5.0))
    await asyncio.sleep(0)
    signal.bump()
    assert await asyncio.wait_for(waiter, 1.0) is True
    assert await signal.wait(0, 0.0) is True


def test_wire_key_of_value_must_match() -> None:
    """The value's key field is compared with the Kafka key byte for byte."""
    view = new_view()
    value = encode(decision(account_key(), UNTIL))
    assert view.apply(format_key(account_key("bob")).encode(), value) == "bad"
    assert view.stats.bad_reasons == {"key_mismatch": 1}
    assert view.check(TENANT, ACCOUNT, PEER).allowed is True


ACCOUNTS = ("alice", "bob", "carol")
PEERS = ("198.51.100.7", "203.0.113.5")


def _keys_pool() -> list[Key]:
    keys: list[Key] = []
    for account in ACCOUNTS:
        keys += [
            account_key(account),
            account_source_key(PEERS[0], account),
            device_key("d1", account),
        ]
    return keys + [source_key(peer) for peer in PEERS]


KEYS = _keys_pool()
OPS = st.lists(
    st.tuples(
        st.sampled_from(("put", "observe", "tombstone", "tick", "prune")),
        st.integers(0, len(KEYS) - 1),
        st.integers(-2, 6),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_view_check_always_equals_the_core_check_on_its_decisions(
    ops: list[tuple[str, int, int]],
) -> None:
    """After any sequence of decisions, tombstones, clock ticks and prunes, every check
    equals the core's check over a reference index fed the same live decisions (so the
    subject shortcut and the caches never change an answer)."""
    clock = Clock()
    view = new_view(clock)
    reference = DecisionIndex()
    for op, index, minutes in ops:
        key = KEYS[index]
        if op in ("put", "observe"):
            expires = clock.now + minutes * MIN
            action = "block" if op == "put" else "observe"
            view.apply(*message(key, expires, action=action))
            active = view.index.get(key)
            if active is None:
                reference.lift(key)
            else:
                reference.put(key, active)
        elif op == "tombstone":
            view.apply(*tombstone(key))
            reference.lift(key)
        elif op == "tick":
            clock.now += max(minutes, 0) * MIN
        else:
            view.prune()
        norm = normaliser()
        for account in ACCOUNTS:
            for peer in PEERS:
                for device, trusted in ((None, False), ("d1", True)):
                    keys = applicable_keys(
                        TENANT,
                        norm.account_digest(TENANT, account),
                        peer,
                        norm.digester.device(TENANT, device) if device else None,
                        None,
                        trusted,
                        "login",
                    )
                    expected = reference.check(keys, clock.now)
                    got = view.check(TENANT, account, peer, (), device, trusted, "login")
                    assert got == expected, (op, account, peer, device)


class _OneBatchConsumer:
    """Enough of an AIOKafkaConsumer for ``DecisionFeed._read``: one fetched batch, then
    fetches that find nothing."""

    def __init__(self, tp: TopicPartition, records: list[SimpleNamespace]) -> None:
        self.tp = tp
        self.batches = [{tp: records}]
        self.offset = len(records)

    async def getmany(self, *partitions: TopicPartition, **kw: object) -> object:
        if self.batches:
            return self.batches.pop()
        await asyncio.sleep(0.01)
        return {}

    async def position(self, tp: TopicPartition) -> int:
        return self.offset


async def test_feed_yields_to_the_loop_within_a_large_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a zero budget the feed yields after every chunk: the loop runs while a fetched
    batch of 100 decisions is partly applied, and the whole batch ends applied."""
    monkeypatch.setattr(view_module, "APPLY_BUDGET_S", 0.0)
    clock = Clock()
    view = new_view(clock)
    records = [
        SimpleNamespace(key=k, value=v)
        for k, v in (message(account_key(f"user{i}"), T0 + MIN) for i in range(100))
    ]
    tp = TopicPartition("decisions", 0)
    feed = DecisionFeed(view, FeedConfig("unused:9092", "decisions"))
    seen: list[int] = []
    reading = asyncio.create_task(feed._read(_OneBatchConsumer(tp, records), [tp]))  # type: ignore[arg-type]
    try:
        async with asyncio.timeout(5):
            while len(view) < 100:
                seen.append(len(view))
                await asyncio.sleep(0)
    finally:
        reading.cancel()
    assert sorted({n for n in seen if 0 < n < 100}) == [
        view_module.APPLY_CHUNK * k for k in (1, 2, 3)
    ]


def test_seed_002_lock_refuses_every_untrusted_door_but_not_the_trusted_device() -> None:
    """A `lock` decision refuses the account's untrusted login, token and recovery attempts
    from any address, never its trusted device, never uia or mfa."""
    clock = Clock()
    view = new_view(clock)
    lock: Key = ("lock", TENANT, account_digest(), None, None)
    assert view.apply(*message(lock, UNTIL)) == "put"
    clock.now = T0 + MIN
    for flow in ("login", "token", "recovery"):
        verdict = view.check(TENANT, ACCOUNT, "192.0.2.200", (), None, False, flow)
        assert (verdict.allowed, verdict.retry_after_ms, verdict.matched_key) == (
            False,
            14 * MIN,
            lock,
        )
    assert view.check(TENANT, ACCOUNT, PEER, (), "laptop", True, "login").allowed is True
    assert view.check(TENANT, ACCOUNT, PEER, (), "laptop", True, "mfa").allowed is True
