"""The cold load's record batches read by the engine (``DecisionView.apply_fetched``,
engine/src/batch.rs) against aiokafka's own reader of the same bytes fed to
``apply_encoded``: the same records, the same offset to read next, the same view; and the
batches the engine leaves to the consumer (a codec, a bad CRC, another format), the
control batches it skips and the batch cut short it stops before."""

from __future__ import annotations

import struct
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pipeline.core.decisions import DecisionIndex
from tests.unit.test_engine_decode import NOW, _exempts, _state, _value, _view, engine, messages

GZIP = 1
CONTROL = 0x20


def batch(
    base_offset: int,
    records: list[tuple[bytes | None, bytes | None]],
    *,
    gaps: list[int] | None = None,
    codec: int = 0,
) -> bytes:
    """One v2 record batch as a producer writes it (aiokafka's builder), its offsets from
    ``base_offset`` with ``gaps[i]`` offsets missing before record i (compaction)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        batch_size=1 << 30,
    )
    delta = 0
    for i, (key, value) in enumerate(records):
        delta += (gaps or [0] * len(records))[i]
        builder.append(delta, timestamp=NOW + i, key=key, value=value, headers=[])
        delta += 1
    raw = bytearray(builder.build())
    raw[0:8] = struct.pack(">q", base_offset)  # not under the CRC
    return bytes(raw)


def as_control(raw: bytes) -> bytes:
    """``raw`` with the control attribute set and its CRC made again."""
    out = bytearray(raw)
    attributes = struct.unpack_from(">h", out, 21)[0] | CONTROL
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">I", out, 17, calc_crc32c(bytes(out[21:])))
    return bytes(out)


def aiokafka_reads(raw: bytes, from_offset: int) -> tuple[list[Any], int, bool]:
    """What a consumer reads of ``raw`` as this contract has it: the records at or after
    ``from_offset`` of each whole batch up to the first compressed one (then ``unread``),
    control batches skipped, and the offset to read next."""
    records: list[Any] = []
    next_offset = from_offset
    memory = MemoryRecords(raw)
    while memory.has_next():
        b = memory.next_batch()
        assert b is not None and b.validate_crc()
        if b.compression_type != 0:
            return records, max(next_offset, b.base_offset), True
        if not b.is_control_batch:
            records.extend(r for r in b if r.offset >= from_offset)
        next_offset = max(next_offset, b.next_offset)
    return records, next_offset, False


@st.composite
def fetches(draw: st.DrawFn) -> tuple[bytes, int]:
    """A fetch answer: batches of messages with offset gaps, now and then a control batch
    or a compressed one, perhaps cut short; and the offset the fetch asked from."""
    parts: list[bytes] = []
    offset = draw(st.integers(0, 50))
    first = offset
    for _ in range(draw(st.integers(1, 4))):
        records = draw(st.lists(messages(), min_size=1, max_size=8))
        gaps = draw(st.lists(st.integers(0, 3), min_size=len(records), max_size=len(records)))
        kind = draw(st.sampled_from(["plain"] * 6 + ["control", "gzip"]))
        raw = batch(offset, records, gaps=gaps, codec=GZIP if kind == "gzip" else 0)
        parts.append(as_control(raw) if kind == "control" else raw)
        offset += len(records) + sum(gaps)
    raw = b"".join(parts)
    if draw(st.booleans()):
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw, draw(st.integers(first, offset))


@settings(max_examples=300, deadline=None)
@given(st.lists(fetches(), min_size=1, max_size=3))
def test_apply_fetched_is_apply_encoded_of_what_aiokafka_reads(
    answers: list[tuple[bytes, int]],
) -> None:
    """Fetch answers applied by the engine reading their batches, and by ``apply_encoded``
    of the records aiokafka's reader finds in the same bytes: the same offset to read next,
    records read, unread flag, and the same view (decisions by key, counts, bad-message
    reports, tenants, change versions, block-list, verdicts)."""
    fetched, encoded = _view(engine), _view(engine)
    for raw, from_offset in answers:
        got = fetched.apply_fetched(raw, from_offset)
        records, next_offset, unread = aiokafka_reads(raw, from_offset)
        encoded.apply_encoded([r.key for r in records], [r.value for r in records])
        assert (got.next_offset, got.records, got.unread) == (next_offset, len(records), unread)
        event(f"unread={unread} handed_back={bool(got.handed_back)} put={got.put > 0}")
        assert _state(fetched) == _state(encoded)


def test_every_exempt_of_a_fetch_is_put_and_none_handed_back() -> None:
    """Three batches of 300 worker-encoded exempts: all 900 put by the engine, nothing
    handed back, the next offset past the last."""
    keys, values = _exempts(900)
    pairs = list(zip(keys, values, strict=True))
    raw = b"".join(batch(300 * n, pairs[300 * n : 300 * (n + 1)]) for n in range(3))
    index = DecisionIndex(announce=False, engine=engine)
    got = index.apply_familiar_batches(raw, 0, NOW)
    assert got is not None
    assert (got.handed_back, got.put, got.changed, got.tenants) == ([], 900, 900, ["acme"])
    assert (got.next_offset, got.records, got.unread) == (900, 900, False)
    assert len(index) == 900


def test_a_bad_crc_leaves_its_batch_to_the_consumer() -> None:
    """A batch whose CRC does not match stops the walk at its first offset, unread; the
    batch before it is applied."""
    keys, values = _exempts(4)
    pairs = list(zip(keys, values, strict=True))
    second = bytearray(batch(2, pairs[2:]))
    second[-1] ^= 0xFF
    view = _view(engine)
    got = view.apply_fetched(batch(0, pairs[:2]) + bytes(second), 0)
    assert (got.put, got.next_offset, got.records, got.unread) == (2, 2, 2, True)


def test_another_format_is_left_to_the_consumer() -> None:
    """A batch of message format v1 (magic 1) is not read: unread at its offset."""
    keys, values = _exempts(1)
    raw = bytearray(batch(5, [(keys[0], values[0])]))
    raw[16] = 1
    got = _view(engine).apply_fetched(bytes(raw), 5)
    assert (got.put, got.next_offset, got.records, got.unread) == (0, 5, 0, True)


def test_a_batch_cut_short_ends_the_walk_before_it() -> None:
    """The fetch's byte limit cuts the last batch: the whole ones are applied and the next
    offset is the cut batch's first, not unread (the next fetch reads it)."""
    keys, values = _exempts(6)
    pairs = list(zip(keys, values, strict=True))
    raw = batch(10, pairs[:3]) + batch(13, pairs[3:])
    got = _view(engine).apply_fetched(raw[:-7], 11)
    assert (got.put, got.next_offset, got.records, got.unread) == (2, 13, 2, False)


def test_a_control_batch_is_skipped_and_its_offsets_passed() -> None:
    """A transaction marker's batch applies nothing and moves the next offset past it."""
    keys, values = _exempts(2)
    raw = as_control(batch(0, [(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00")])) + batch(
        1, list(zip(keys, values, strict=True))
    )
    got = _view(engine).apply_fetched(raw, 0)
    assert (got.put, got.next_offset, got.records, got.handed_back) == (2, 3, 2, [])


def test_other_decisions_are_handed_back_in_order_with_their_keys() -> None:
    """A block and a bad value between exempts reach the view's Python path as messages:
    the block is enforced, the bad value counted, the exempts stored."""
    keys, values = _exempts(2)
    block = _view(engine)
    wire = "account|acme|" + "a" * 32 + "|-|-"
    value = _value(wire, "blk", "block", "manual", NOW, NOW + 60_000)
    raw = batch(
        0, [(keys[0], values[0]), (wire.encode(), value), (b"x|y", b"{"), (keys[1], values[1])]
    )
    got = block.apply_fetched(raw, 0)
    assert got.handed_back == [(wire.encode(), value), (b"x|y", b"{")]
    assert (got.put, got.records) == (2, 4)
    assert block.stats.outcomes["put"] == 3
    assert block.stats.bad_reasons == {"bad_key": 1}
