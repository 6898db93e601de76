"""Bounded decompression of the input topic's record batches (decompression bombs).

A producer allowed to write the input topic chooses how its batches are compressed, and
the broker bounds only the compressed size (the topic's ``max.message.bytes``): 64 MiB of
one repeated letter is 65 KiB in gzip and 2 KiB in zstd, and aiokafka inflates a whole
batch into memory (twice: its codec's output, then a bytearray copy) with no limit. So
inside ingest's read loop (``bound_decompression``, a context variable: only the task
that set it is bounded; the worker's own internal topics and changelogs are read as
before) every compressed batch of the input must inflate to

* at most ``max_batch_bytes`` in all (``ingest.max_batch_bytes``), checked while
  inflating: a bomb is refused before it is in memory, and
* no record over ``max_record_bytes`` (``ingest.max_event_bytes`` + ``RECORD_OVERHEAD_BYTES``
  for the key, headers and framing), so the records a batch of ``batch_max_events``
  holds are bounded too, whatever each batch inflates to.

A batch that breaks either raises ``OversizeBatch`` (a ``CorruptRecordException``) out
of ``getmany``; ``pipeline.stream.undecodable`` turns it into one dead letter for the
batch's offset range, reason ``oversize``, with an empty value (its bytes stay in the
input topic until retention). A codec error is a ``CorruptRecordException`` too
(``undecodable_batch``), never a crash. aiokafka (pinned below 0.15) calls its codec
functions through its record modules' globals; ``install`` replaces them there, and
``tests/integration/test_decompression_bomb.py`` runs a real bomb through a real worker.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aiokafka.record._crecords.default_records as _cython_records
import aiokafka.record.default_records as _python_records
from aiokafka import codec
from aiokafka.errors import CorruptRecordException
from aiokafka.record._crecords.cutil import decode_varint_cython

from pipeline.stream.ingest import OVERSIZE, RECORD_OVERHEAD_BYTES

REASON = OVERSIZE
FIRST_GUESS_RATIO = 16
"""The first output buffer holds 16 times the compressed size (or 64 KiB): an ordinary
batch of JSON events inflates less, so only a bomb needs a second, larger one."""
FIRST_GUESS_MIN_BYTES = 65_536


class OversizeBatch(CorruptRecordException):  # type: ignore[misc]
    """An input batch inflates past ``ingest.max_batch_bytes`` or holds a record past the
    record bound: dead-lettered ``oversize``, never inflated in full."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch_bytes: int
    max_record_bytes: int


_LIMITS: ContextVar[Limits | None] = ContextVar("authpipe_inflation_limits", default=None)
_ORIGINAL = {
    "gzip_decode": codec.gzip_decode,
    "snappy_decode": codec.snappy_decode,
    "lz4_decode": codec.lz4_decode,
    "zstd_decode": codec.zstd_decode,
}


def bound_decompression(max_batch_bytes: int, max_event_bytes: int) -> None:
    """Bound every batch the current task (and tasks it starts) inflates (module docstring)."""
    install()
    _LIMITS.set(Limits(max_batch_bytes, max_event_bytes + RECORD_OVERHEAD_BYTES))


def install() -> None:
    """Put the bounded codecs into aiokafka's record modules (idempotent). Outside a
    bounded task they call aiokafka's own codecs."""
    for module in (_cython_records, _python_records):
        for name, bounded in _BOUNDED.items():
            setattr(module, name, bounded)


def check_records(data: bytes, limits: Limits) -> None:
    """Raise OversizeBatch if an inflated batch's records (each a varint length, then that
    many bytes) include one over ``limits.max_record_bytes`` (about 0.4 µs a record, only
    for batches larger than one record may be)."""
    if len(data) <= limits.max_record_bytes:
        return
    end, pos, bound = len(data), 0, limits.max_record_bytes
    while pos < end:
        length, pos = decode_varint_cython(data, pos)
        if length > bound:
            raise OversizeBatch(
                f"a record of {length} bytes is over the {bound}-byte bound "
                "(ingest.max_event_bytes + 4096)"
            )
        if length < 0:
            raise CorruptRecordException(f"a record of negative length {length}")
        pos += length


def _too_large(limits: Limits, what: str) -> OversizeBatch:
    return OversizeBatch(
        f"the batch inflates to {what} than ingest.max_batch_bytes={limits.max_batch_bytes}"
    )


def _checked(out: bytes, limits: Limits) -> bytes:
    check_records(out, limits)
    return out


def _gzip(payload: Any) -> bytes:
    limits = _LIMITS.get()
    if limits is None:
        return bytes(_ORIGINAL["gzip_decode"](payload))
    data, parts, total = bytes(payload), [], 0
    try:
        while data:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            part = inflater.decompress(data, limits.max_batch_bytes - total + 1)
            total += len(part)
            if total > limits.max_batch_bytes or inflater.unconsumed_tail:
                raise _too_large(limits, "more")
            if not inflater.eof:
                raise CorruptRecordException("gzip: the stream ends inside a member")
            parts.append(part)
            data = inflater.unused_data  # a further gzip member
    except zlib.error as exc:
        raise CorruptRecordException(f"gzip: {exc}") from None
    return _checked(b"".join(parts), limits)


def _into(
    decompress_into: Callable[[Any, bytearray], int], payload: bytes, limits: Limits
) -> bytes:
    """Inflate with cramjam's ``*_into`` into a bounded buffer: first a guess, then the
    whole bound; a buffer the output does not fit is a bomb at the bound."""
    size = min(max(FIRST_GUESS_MIN_BYTES, FIRST_GUESS_RATIO * len(payload)), limits.max_batch_bytes)
    while True:
        buffer = bytearray(size + 1)
        try:
            written = decompress_into(payload, buffer)
        except Exception as exc:  # cramjam.DecompressionError
            if "whole buffer" not in str(exc):
                raise CorruptRecordException(f"{type(exc).__name__}: {exc}") from None
            written = size + 1
        if written <= size:
            return _checked(bytes(memoryview(buffer)[:written]), limits)
        if size >= limits.max_batch_bytes:
            raise _too_large(limits, "more")
        size = limits.max_batch_bytes


def _zstd(payload: Any) -> bytes:
    limits = _LIMITS.get()
    if limits is None:
        return bytes(_ORIGINAL["zstd_decode"](payload))
    return _into(codec.cramjam.zstd.decompress_into, bytes(payload), limits)


def _lz4(payload: Any) -> bytes:
    limits = _LIMITS.get()
    if limits is None:
        return bytes(_ORIGINAL["lz4_decode"](payload))
    return _into(codec.cramjam.lz4.decompress_into, bytes(payload), limits)


def _snappy(payload: Any) -> bytes:
    """Raw snappy, or xerial's framing (a 16-byte header, then length-prefixed raw
    blocks), as aiokafka reads it; every block's stated length is checked first."""
    limits = _LIMITS.get()
    if limits is None:
        return bytes(_ORIGINAL["snappy_decode"](payload))
    snappy = codec.cramjam.snappy
    data = memoryview(bytes(payload))
    blocks = [data]
    if codec._detect_xerial_stream(data):
        blocks, cursor, body = [], 0, data[16:]
        while cursor < len(body):
            (size,) = struct.unpack_from("!i", body, cursor)
            blocks.append(body[cursor + 4 : cursor + 4 + size])
            cursor += 4 + size
    parts, total = [], 0
    try:
        for block in blocks:
            total += int(snappy.decompress_raw_len(block))
            if total > limits.max_batch_bytes:
                raise _too_large(limits, f"{total} bytes or more")
            parts.append(bytes(snappy.decompress_raw(block)))
    except OversizeBatch:
        raise
    except Exception as exc:  # cramjam.DecompressionError, struct.error
        raise CorruptRecordException(f"snappy: {type(exc).__name__}: {exc}") from None
    return _checked(b"".join(parts), limits)


_BOUNDED: dict[str, Callable[[Any], bytes]] = {
    "gzip_decode": _gzip,
    "snappy_decode": _snappy,
    "lz4_decode": _lz4,
    "zstd_decode": _zstd,
}
