"""The dead letter of an undecodable batch (the real path runs in test_compression.py)."""

from __future__ import annotations

from aiokafka.errors import UnsupportedCodecError
from aiokafka.structs import TopicPartition

from pipeline.stream.undecodable import Salvage, salvage


def test_an_error_raised_outside_aiokafkas_unpacking_is_not_salvaged() -> None:
    """Without the fetcher's frames there is no batch to name: salvage says so (None)."""
    try:
        raise UnsupportedCodecError("Libraries for snappy compression codec not found")
    except UnsupportedCodecError as exc:
        assert salvage(exc) is None


def test_the_dead_letter_names_partition_offset_range_and_codec() -> None:
    """One dead letter for the whole batch: first and last offset, codec, the error once."""
    found = Salvage(TopicPartition("auth.login-attempts", 3), 120, 130, "zstd")
    dead = found.dead_letter(
        UnsupportedCodecError("Libraries for zstd compression codec not found")
    )
    assert dead.offsets == 10
    assert dict(dead.headers()) == {
        "error": b"undecodable_batch",
        "error_detail": b"offsets 120..129 (codec zstd): UnsupportedCodecError: Libraries for zstd "
        b"compression codec not found",
        "stage": b"ingest",
        "source_topic": b"auth.login-attempts",
        "source_partition": b"3",
        "source_offset": b"120",
        "source_offset_last": b"129",
    }
    assert (dead.record.key, dead.record.value) == (None, b"")
