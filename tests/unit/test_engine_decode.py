"""The edge's bulk path for familiar exempts (``DecisionView.apply_encoded``: the engine's
``FamiliarStore.put_encoded`` decodes them, engine/src/decode.rs) against the Python
decoder's path, message by message, on the compiled store and on the dict
(``AUTHPIPE_ENGINE=python``): a differential test of what each message does to the
index, the view's counts, its bad-message reports and the verdicts."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contracts.codec import dumps
from pipeline.core.decision_keys import applicable_keys
from pipeline.core.decisions import FAMILIAR_RULE, Active, DecisionIndex
from pipeline.core.keys import Key, parse_key
from pipeline.core.records import decision_value
from pipeline.edge.feed import DecisionFeed, FeedConfig
from pipeline.edge.view import DecisionView
from pipeline.settings import Settings
from pipeline.wiring import build_normaliser
from tests.unit.test_core_support import policy

try:
    import authpipe_engine as engine
except ImportError as exc:  # never skipped: an unbuilt engine is a failure that says why
    raise ImportError("authpipe_engine is not installed: run scripts/build-engine") from exc

NOW = 1_796_601_600_000
DAY = 86_400_000
A1, A2 = "a" * 32, "b" * 32
S1, S2 = "198.51.100.1", "203.0.113.0/24"
D1 = "d" * 32
FAMILIAR_KEYS = [
    f"familiar|acme|{A1}|{S1}|-",
    f"familiar|acme|{A1}|-|{D1}",
    f"familiar|acme|{A2}|{S2}|-",
    f"familiar|b8|{A1}|{S1}|-",
    f"familiar|acme||{S1}|-",  # the same key as the next: an empty part is none
    f"familiar|acme|-|{S1}|-",
    f"familiar|acme|{A1}||{D1}",  # the same key as the second
]
OTHER_KEYS = [
    f"source|acme|-|{S1}|-",
    f"account|acme|{A1}|-|-",
    f"passed|acme|{A1}|-|{D1}",
    "tenant|acme|-|-|-",
]
BAD_KEYS: list[bytes | None] = [
    None,
    b"",
    b"familiar|Acme|a|s|-",
    b"familiar|acme|a|s",
    b"familiar|acme|a|s|-|x",
    b"familiar|acme|\xff|s|-",
    b"famil1ar|acme|a|s|-",
    b"|acme|a|s|-",
]
SCOPE_OF_KEY = {"familiar": "familiar", "source": "source", "account": "account"}


def _view(store: Any) -> DecisionView:
    """An edge's view at the fixed clock whose index keeps its familiar exempts in
    ``store`` (the engine) or the dict (None), [verify] enforced; bad messages recorded."""
    clock = [NOW]
    view = DecisionView(
        build_normaliser(Settings()),
        now_ms=lambda: clock[0],
        policy=policy(verify={"mode": "enforce"}),
    )
    view.index = DecisionIndex(
        announce=False, policy=policy(verify={"mode": "enforce"}), engine=store
    )
    view._may_apply = view.index.may_apply
    view.clock = clock  # type: ignore[attr-defined]
    view.reports = defaultdict(list)  # type: ignore[attr-defined]
    bad = view._bad

    def recorded(exc: Any, key: Key | None) -> str:
        kept = key is not None and view.index.get(key) is not None
        view.reports[key].append((exc.reason, kept))  # type: ignore[attr-defined]
        return bad(exc, key)

    view._bad = recorded  # type: ignore[method-assign]
    return view


def _value(
    wire_key: str,
    decision_id: str,
    action: str,
    rule: str,
    issued_ms: int,
    expires_ms: int,
    challenge: str | None = None,
    scope: str | None = None,
) -> bytes:
    """The value the worker encodes for ``wire_key`` (``decision_value``)."""
    parts = (
        parse_key(wire_key) if "||" not in wire_key else parse_key(wire_key.replace("||", "|-|"))
    )
    scope = scope or parts[0]
    return dumps(
        decision_value(
            decision_id,
            wire_key,
            scope,
            action,
            rule,
            parts[1],
            parts[2],
            parts[3],
            parts[4],
            0,
            0,
            0,
            issued_ms,
            expires_ms,
            "policy-1",
            challenge,
        )
    )


# -- the messages ------------------------------------------------------------------------

TIMES = st.sampled_from(
    [
        NOW - 29 * DAY,
        NOW - DAY,
        NOW - 1,
        NOW,
        NOW + 1,
        NOW + 30 * DAY,
        0,
        -1,
        -2,
        -62_135_596_800_000,  # 0001-01-01
        253_402_300_799_999,  # 9999-12-31T23:59:59.999
    ]
)
# (bytes to find, bytes to put instead): each a way the worker never writes a value, some
# still valid for the Python decoder (which then applies them), most not.
MUTATIONS = [
    (b'"action":"exempt"', b'"action":"block"'),
    (b'"action":"exempt"', b'"action":"observe"'),
    (b'"action":"exempt"', b'"action":"challenge","challenge":"captcha"'),
    (b'"action":"exempt"', b'"action":"exempt","challenge":"step_up"'),
    (b'"action":"exempt"', b'"action":"exempt","challenge":null'),
    (b'"action":"exempt"', b'"action":"exempt","challenge":"sms"'),
    (b'"action":"exempt"', b'"action":"exempt","action":"exempt"'),
    (b'"action":"exempt"', b'"action":"Exempt"'),
    (b'"rule":"familiar"', b'"rule":"manual"'),
    (b'"rule":"familiar"', b'"rule":""'),
    (b'"scope":"familiar"', b'"scope":"tenant"'),
    (b'"scope":"familiar"', b'"scope":"passed"'),
    (b'"scope":"familiar"', b'"scope":"nope"'),
    (b'"applies_to":"untrusted"', b'"applies_to":"all"'),
    (b'"applies_to":"untrusted"', b'"applies_to":"nobody"'),
    (b'"count":0', b'"count":-1'),
    (b'"count":0', b'"count":-0'),
    (b'"count":0', b'"count":1.0'),
    (b'"count":0', b'"count":"0"'),
    (b'"count":0', b'"count":true'),
    (b'"count":0', b'"count":4294967295'),
    (b'"count":0', b'"count":4294967296'),
    (b'"count":0', b'"count":00'),
    (b'"window_ms":0', b'"window_ms":18446744073709551615'),
    (b'"window_ms":0', b'"window_ms":18446744073709551616'),
    (b'"window_ms":0', b'"window_ms":99999999999999999999999'),
    (b'"threshold":0', b'"threshold":null'),
    (b'"tenant":"', b'"tenant":"x'),
    (b'"tenant":"acme"', b'"tenant":""'),
    (b'"tenant":"acme"', b'"tenant":null'),
    (b'"policy_version":"policy-1"', b'"policy_version":""'),
    (b'"policy_version":"policy-1"', b'"policy_version":1'),
    (b'"decision_id":"', b'"decision_id":"\\u0061'),
    (b'"decision_id":"', b'"decision_id":"\\"'),
    (b'"decision_id":"', b'"decision_id":"\xc3\xa9'),
    (b'"decision_id":"', b'"decision_id":"\xff'),
    (b'"decision_id":"', b'"decision_id":"\x01'),
    (b'"decision_id":"', b'"decision_id":"\xed\xa0\x80'),
    (b'"decision_id":"', b'"decision_\\u0069d":"'),
    (b'"key":"', b'"key":"x'),
    (b'"key":"familiar|acme||', b'"key":"familiar|acme|-|'),
    (b'"source":', b'"source":null,"x":'),
    (b'"device_id":null', b'"device_id":7'),
    (b'"device_id":null', b'"device_id":"\xc3\xa9"'),
    (b'Z","expires_at"', b'+00:00","expires_at"'),
    (b'Z","policy_version"', b'000Z","policy_version"'),
    (b'"expires_at":"', b'"expires_at":"x'),
    (b'"expires_at":"', b'"expires_at" : "'),
    (b"{", b"{ \n\t\r"),
    (b"{", b"\xef\xbb\xbf{"),
    (b"{", b'{"extra":[1,{"a":null}],'),
    (b"{", b'{"extra":1.5e3,'),
    (b"{", b'{"extra":"\\n",'),
    (b"{", b'{"extra":-12345678901234567890,'),
    (b"{", b'{"extra":123456789012345678901,'),
    (b"{", b'{"extra":false,"extra":null,'),
    (b"{", b"{,"),
    (b"{", b"["),
    (b"}", b"} "),
    (b"}", b"}}"),
    (b"}", b",}"),
    (b"}", b""),
    (b"}", b',"operator":"' + "\u00e9".encode() * 128 + b'"}'),
    (b"}", b',"operator":"' + "\u00e9".encode() * 129 + b'"}'),
    (b"}", b',"reason":"' + b"r" * 512 + b'"}'),
    (b"}", b',"reason":"' + b"r" * 513 + b'"}'),
    (b"}", b',"reason":null,"operator":null}'),
]
TIME_TEXTS = [
    b"2026-02-29T00:00:00.000Z",
    b"2024-02-29T00:00:00.000Z",
    b"2026-12-07T24:00:00.000Z",
    b"2026-12-07T23:60:00.000Z",
    b"2026-12-07T23:00:60.000Z",
    b"2026-13-07T23:00:00.000Z",
    b"2026-12-00T23:00:00.000Z",
    b"0000-12-07T23:00:00.000Z",
    b"2027-1-07T23:00:00.000Z",
    b"2027-01-07T23:00:00.000z",
    b"2027-01-07 23:00:00.000Z",
    b"2027-01-07T23:00:00,000Z",
    b"2027-01-07T23:00:00.000",
]


@st.composite
def messages(draw: st.DrawFn) -> tuple[bytes | None, bytes | None]:
    """One message of the decisions topic: mostly familiar exempts as the worker writes
    them, and tombstones, other decisions, other keys, bad keys and bad values."""
    kind = draw(
        st.sampled_from(["exempt"] * 5 + ["tombstone"] * 2 + ["other", "bad_key", "mutated"] * 2)
    )
    if kind == "bad_key":
        return draw(st.sampled_from(BAD_KEYS)), draw(st.sampled_from([None, b"{}"]))
    wire = draw(st.sampled_from(FAMILIAR_KEYS + (OTHER_KEYS if kind == "other" else [])))
    key = wire.encode()
    if kind == "tombstone":
        return key, None
    # Ids are unique across keys (``stable_id`` of the key and times): the index's heaps
    # order by (expiry, id) and never compare keys.
    decision_id = draw(st.sampled_from(["d1", "d2", "e" * 32, "\u00e9t\u00e9"])) + wire
    issued, expires = draw(TIMES), draw(TIMES)
    scope = wire.split("|")[0]
    if kind == "other":
        action = draw(st.sampled_from(["block", "observe", "exempt", "challenge"]))
        challenge = "captcha" if action == "challenge" else None
        rule = FAMILIAR_RULE if scope == "familiar" and draw(st.booleans()) else "manual"
        return key, _value(wire, decision_id, action, rule, issued, expires, challenge)
    value = _value(wire, decision_id, "exempt", FAMILIAR_RULE, issued, expires)
    if kind == "mutated":
        how = draw(st.sampled_from(["replace", "time", "truncate", "flip"]))
        if how == "replace":
            old, new = draw(st.sampled_from(MUTATIONS))
            value = value.replace(old, new, 1)
        elif how == "time":
            field = draw(st.sampled_from([b"issued_at", b"expires_at"]))
            text = orjson.loads(value)[field.decode()].encode()
            value = value.replace(
                b'"' + field + b'":"' + text,
                b'"' + field + b'":"' + draw(st.sampled_from(TIME_TEXTS)),
            )
        elif how == "truncate":
            value = value[: draw(st.integers(0, len(value) - 1))]
        else:
            at = draw(st.integers(0, len(value) - 1))
            value = value[:at] + bytes([draw(st.integers(0, 255))]) + value[at + 1 :]
    return key, value


def _pool() -> list[Key]:
    keys = {parse_key(k.replace("||", "|-|")) for k in FAMILIAR_KEYS + OTHER_KEYS}
    return sorted(keys, key=repr)


def _attempts() -> list[tuple[str, str, str, str | None]]:
    return [
        (t, a, s, d) for t in ("acme", "b8") for a in (A1, A2) for s in (S1, S2) for d in (None, D1)
    ]


def _store_held(key: Key, a: Active) -> bool:
    """Would a reader's index keep ``a`` on ``key`` in the compiled store?"""
    return (
        key[0] == "familiar"
        and a.action == "exempt"
        and a.rule == FAMILIAR_RULE
        and a.challenge is None
        and a.expires_ms >= 0
        and a.since_ms >= -1
    )


def _as_stored(key: Key, a: Active | None) -> Active | None:
    """The dict's decision as the store gives it back (its id as the fingerprint)."""
    if a is None or not _store_held(key, a):
        return a
    return a._replace(decision_id=f"{engine.id_fingerprint(a.decision_id):016x}")


def _state(view: DecisionView, to_store: bool = False) -> dict[str, Any]:
    """Everything the differential test compares, at the view's clock and a day later."""
    index = view.index
    now = view.clock[0]  # type: ignore[attr-defined]
    got = {k: index.get(k) for k in _pool()}
    if to_store:
        got = {k: _as_stored(k, a) for k, a in got.items()}
    verdicts = []
    for at in (now, now + DAY, now + 31 * DAY):
        for t, a, s, d in _attempts():
            keys = applicable_keys(t, a, s, d, None, False, "login")
            verdicts.append(
                (index.check(keys, at), index.unfamiliar(t, a, s, d, at), index.may_apply(t, a, s))
            )
    return {
        "get": got,
        "len": len(index),
        "subjects": dict(index.subjects),
        "outcomes": dict(view.stats.outcomes),
        "bad_reasons": dict(view.stats.bad_reasons),
        "reports": dict(view.reports),  # type: ignore[attr-defined]
        "tenants": set(view.tenants),
        "changes": view.changes.version,
        "blocklist": view.blocklist(include_observe=True),
        "blocklist_changes": view.blocklist_changes.version,
        "verdicts": verdicts,
    }


BATCHES = st.lists(
    st.tuples(st.lists(messages(), max_size=12), st.sampled_from([0, 1, DAY, 31 * DAY])),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(BATCHES)
def test_the_bulk_path_equals_the_python_decoders_message_by_message(
    batches: list[tuple[list[tuple[bytes | None, bytes | None]], int]],
) -> None:
    """Batches of messages (the clock moving between them) applied by ``apply_encoded``
    with the store, and by ``apply`` one by one with the store and with the dict: the same
    decisions by key (the dict's ids as the store's fingerprints), counts, bad-message
    reports by key (reason, and whether the key kept a decision), tenants, change
    versions, block-list and verdicts."""
    bulk, one_by_one, reference = _view(engine), _view(engine), _view(None)
    for records, advance in batches:
        for view in (bulk, one_by_one, reference):
            view.clock[0] += advance  # type: ignore[attr-defined]
        keys = [k for k, _ in records]
        values = [v for _, v in records]
        assert bulk.apply_encoded(keys, values) == len(records)
        for key, value in records:
            one_by_one.apply(key, value)
            reference.apply(key, value)
        assert _state(bulk) == _state(one_by_one)
        assert _state(bulk) == _state(reference, to_store=True)


def _exempts(
    count: int, expires_ms: int = NOW + DAY
) -> tuple[list[bytes | None], list[bytes | None]]:
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    for i in range(count):
        wire = f"familiar|acme|{i:032x}|10.0.{i >> 8 & 255}.{i & 255}|-"
        keys.append(wire.encode())
        values.append(_value(wire, f"{i:032x}", "exempt", FAMILIAR_RULE, NOW - DAY, expires_ms))
    return keys, values


def test_the_engine_takes_every_exempt_the_worker_writes() -> None:
    """1,000 exempts as the worker encodes them: all put by the engine, none handed back;
    each found by key with its expiry, evidence start and the id's fingerprint."""
    keys, values = _exempts(1_000)
    index = DecisionIndex(announce=False, engine=engine)
    batch = index.apply_familiar_encoded(keys, values, NOW)
    assert batch is not None
    assert (
        batch.handed_back,
        batch.put,
        batch.lifted,
        batch.expired,
        batch.changed,
        batch.tenants,
    ) == (
        [],
        1_000,
        0,
        0,
        1_000,
        ["acme"],
    )
    key = parse_key(keys[7].decode())  # type: ignore[union-attr]
    assert index.get(key) == Active(
        f"{engine.id_fingerprint(f'{7:032x}'):016x}",
        "exempt",
        NOW + DAY,
        FAMILIAR_RULE,
        None,
        NOW - DAY,
    )


def test_tombstones_and_expired_exempts_lift_and_count() -> None:
    """A tombstone of a held key and an exempt expired at the clock both remove the record
    (changed 2), a tombstone of an unknown key only counts as lifted."""
    keys, values = _exempts(3)
    index = DecisionIndex(announce=False, engine=engine)
    index.apply_familiar_encoded(keys, values, NOW)
    _, expired = _exempts(2, expires_ms=NOW)
    batch = index.apply_familiar_encoded(
        [keys[0], keys[1], b"familiar|acme|x|-|y"], [None, expired[1], None], NOW
    )
    assert batch is not None
    assert (
        batch.handed_back,
        batch.put,
        batch.lifted,
        batch.expired,
        batch.changed,
        len(index),
    ) == (
        [],
        0,
        2,
        1,
        2,
        1,
    )


def test_a_key_held_in_the_dict_is_handed_back_and_so_are_its_later_messages() -> None:
    """An observe on a familiar key lives in the dict: the key's exempt after it is handed
    back to Python (which then replaces it in order); a bad value hands back its key's
    later exempt in the same batch, never another key's."""
    keys, values = _exempts(3)
    index = DecisionIndex(announce=False, engine=engine)
    wire = keys[0].decode()  # type: ignore[union-attr]
    index.put(parse_key(wire), Active("o1", "observe", NOW + DAY, FAMILIAR_RULE))
    batch = index.apply_familiar_encoded(
        [keys[0], keys[1], keys[1], keys[2]], [values[0], b"{", values[1], values[2]], NOW
    )
    assert batch is not None
    assert (batch.handed_back, batch.put) == ([0, 1, 2], 1)


def test_a_view_without_the_engine_applies_every_message_itself() -> None:
    """``AUTHPIPE_ENGINE=python``: ``apply_familiar_encoded`` is None, ``apply_encoded``
    applies each message with the Python decoder."""
    view = _view(None)
    keys, values = _exempts(5)
    assert view.index.apply_familiar_encoded(keys, values, NOW) is None
    assert (view.apply_encoded(keys, values), len(view), view.stats.outcomes["put"]) == (5, 5, 5)


def test_a_cold_feed_reserves_the_store_for_the_topics_messages() -> None:
    """``DecisionFeed._reserve`` makes room for the messages not held yet (no growth while
    loading them); a reservation over the engine's bound is skipped, not raised."""
    view = _view(engine)
    feed = DecisionFeed(view, FeedConfig("unused:9092", "decisions"))
    feed._reserve(100_000)
    slots = view.index._familiar.slot_count()
    keys, values = _exempts(1_000)
    view.apply_encoded(keys, values)
    assert (slots >= 100_000 / 0.85, view.index._familiar.slot_count()) == (True, slots)
    feed._reserve(1 << 40)
    assert view.index._familiar.slot_count() == slots


@pytest.mark.parametrize("chunked", [False, True])
def test_apply_batch_is_apply_encoded_of_the_records(chunked: bool) -> None:
    """``apply_batch`` of records (objects with key and value; a list or any iterable)
    applies them as ``apply_encoded`` does."""
    from types import SimpleNamespace

    keys, values = _exempts(10)
    records = [SimpleNamespace(key=k, value=v) for k, v in zip(keys, values, strict=True)]
    view = _view(engine)
    applied = view.apply_batch(iter(records) if chunked else records)
    assert (applied, len(view), view.stats.outcomes["put"], view.tenants) == (
        10,
        10,
        10,
        {"default", "acme"},
    )


class _Fetches:
    """Enough of an AIOKafkaConsumer for ``DecisionFeed._read``: one fetched batch, then
    fetches that find nothing; its position is the batch's end once fetched."""

    def __init__(self, tp: Any, records: list[Any]) -> None:
        self.batches = [{tp: records}]
        self.offset = 0
        self.end = len(records)

    async def getmany(self, *partitions: Any, **kw: object) -> object:
        import asyncio

        if self.batches:
            self.offset = self.end
            return self.batches.pop()
        await asyncio.sleep(0.01)
        return {}

    async def position(self, tp: Any) -> int:
        return self.offset


@pytest.mark.parametrize("ready", [False, True], ids=["loading", "ready"])
async def test_the_feed_applies_load_chunks_while_loading_and_small_ones_after(
    ready: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a zero budget the feed yields after every chunk: LOAD_CHUNK messages while it
    reads up to its targets (the cold load), APPLY_CHUNK once ready; all end applied."""
    import asyncio
    from types import SimpleNamespace

    from aiokafka.structs import TopicPartition

    from pipeline.edge import feed as feed_module

    monkeypatch.setattr(feed_module, "APPLY_BUDGET_S", 0.0)
    monkeypatch.setattr(feed_module, "LOAD_CHUNK", 256)
    view = _view(engine)
    keys, values = _exempts(1_000)
    records = [SimpleNamespace(key=k, value=v) for k, v in zip(keys, values, strict=True)]
    tp = TopicPartition("decisions", 0)
    feed = DecisionFeed(view, FeedConfig("unused:9092", "decisions"))
    feed._targets = {tp: len(records)}
    if ready:
        feed._ready.set()
    seen: list[int] = []
    reading = asyncio.create_task(feed._read(_Fetches(tp, records), [tp]))  # type: ignore[arg-type]
    try:
        async with asyncio.timeout(5):
            while len(view) < 1_000:
                seen.append(len(view))
                await asyncio.sleep(0)
    finally:
        reading.cancel()
    chunk = feed_module.APPLY_CHUNK if ready else 256
    assert sorted({n for n in seen if 0 < n < 1_000})[:3] == [chunk, 2 * chunk, 3 * chunk]
    assert (feed._ready.is_set(), view.stats.outcomes["put"]) == (True, 1_000)
