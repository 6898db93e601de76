"""The sink's rows: a decisions row's layout comes from one place, tombstones are read by
the core's key parser, and the crash-test hook is the command's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from pipeline.contracts.codec import DecodeError
from pipeline.sinks.command import TEST_KILL_AFTER_INSERTS_ENV, _test_hook, kill_after_inserts
from pipeline.sinks.plan import SinkError
from pipeline.sinks.rows import decision_message
from pipeline.sinks.tables import DECISIONS_COLUMNS
from tests.unit.test_contracts import EXAMPLES

REPO = Path(__file__).resolve().parents[2]
BLOCK = (EXAMPLES / "decision.block.json").read_bytes()


def test_a_decision_row_names_every_column() -> None:
    """A decision's row, read by DECISIONS_COLUMNS, holds each field under its own name."""
    body = orjson.loads(BLOCK)
    (row,) = decision_message("auth.throttle-decisions", 3, 17, 0, body["key"].encode(), BLOCK).rows
    assert dict(zip(DECISIONS_COLUMNS, row, strict=True)) == {
        **{name: body.get(name) for name in DECISIONS_COLUMNS[:13]},
        "issued_at": 1_795_985_109_123,
        "expires_at": 1_795_986_009_123,
        "policy_version": "default-1",
        "tombstone": False,
        "operator": None,
        "reason": None,
        "challenge": None,
        "kafka_topic": "auth.throttle-decisions",
        "kafka_partition": 3,
        "kafka_offset": 17,
    }


def test_a_tombstone_row_comes_from_the_parsed_key() -> None:
    """A tombstone's subject comes from core.keys.parse_key ('-' is none); a key without a
    scope or tenant, or not UTF-8, is bad_key."""
    (row,) = decision_message("t", 0, 9, 5_000, b"device|acme|a1|-|d1", None).rows
    named = dict(zip(DECISIONS_COLUMNS, row, strict=True))
    assert [named[n] for n in ("scope", "tenant", "account_digest", "source", "device_id")] == [
        "device",
        "acme",
        "a1",
        None,
        "d1",
    ]
    assert (named["issued_at"], named["expires_at"], named["tombstone"]) == (5_000, 5_000, True)
    for key in (b"-|acme|a|-|-", b"account|-|a|-|-", b"\xff|a|b|c|d", None):
        with pytest.raises(DecodeError) as caught:
            decision_message("t", 0, 9, 5_000, key, None)
        assert caught.value.reason == "bad_key"


def test_the_crash_hook_is_off_unless_the_command_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the test-only variable the command passes no hook; with it, a hook; with a
    value that is not a number, a SinkError saying so."""
    monkeypatch.delenv(TEST_KILL_AFTER_INSERTS_ENV, raising=False)
    assert _test_hook() is None
    monkeypatch.setenv(TEST_KILL_AFTER_INSERTS_ENV, "3")
    assert _test_hook() is not None
    monkeypatch.setenv(TEST_KILL_AFTER_INSERTS_ENV, "three")
    with pytest.raises(SinkError, match="not a whole number"):
        _test_hook()
    kill_after_inserts(3)(2, "attempts:t:0:0-9")  # below the count: nothing happens


def test_the_crash_hook_kills_the_process_at_its_count() -> None:
    """kill_after_inserts(2) SIGKILLs its process on the second insert."""
    code = "from pipeline.sinks.command import kill_after_inserts; kill_after_inserts(2)(2, 't')"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=60)
    assert done.returncode == -9
