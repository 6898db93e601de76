"""B1's traffic, message by message: what the floor parts send instead of the stages' work.

``measure`` reads back every topic a B1 worker wrote (after its run) and counts, per
topic, the messages, their key and value bytes, the tombstones and, for the internal
and audit topics, the rows inside each message; ``Traffic.of`` turns those counts into
per-row rates and sizes. The floor shells (``bench.floor``) send, per envelope, the
messages those rates and sizes give, as pre-built bytes.

``B1_COUNTS`` holds the counts of one B1 run: the floor parts use them when no B1 ran in
the same ``bench.run``.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from pipeline.core.outbox import ACCOUNT_SHARE

PARTITIONS = 8
Counts = dict[str, dict[str, float]]
"""Per topic role: messages, key_bytes, value_bytes, tombstones and row counts."""

ROLES = (
    "by_account",
    "by_source",
    "shares",
    "decisions",
    "alerts",
    "notices",
    "audit",
    "account_changelog",
    "source_changelog",
    "rollup_changelog",
)


def _sized(prefix: str, rows: list[Any]) -> dict[str, float]:
    return {prefix: len(rows), f"{prefix}_bytes": len(orjson.dumps(rows)) if rows else 0}


def _rows_of(role: str, key: bytes | None, value: bytes) -> dict[str, float]:
    """The rows inside one message of ``role`` and their bytes as a JSON list (empty for
    opaque topics): a message's bytes less its rows' are its header and marks."""
    if role == "by_account":
        rows = orjson.loads(value)["rows"]
        return {**_sized("rows", rows), "marks_only": float(not rows)}
    if role == "by_source":
        rows = orjson.loads(value)["rows"]
        marks = [row for row in rows if len(row) == 3 and row[1] == -1]
        data = [row for row in rows if not (len(row) == 3 and row[1] == -1)]
        return {**_sized("rows", data), **_sized("mark_rows", marks)}
    if role == "shares":
        entries = orjson.loads(value)
        marks = [entry for entry in entries if entry[0] is None]
        account = [e for e in entries if e[0] is not None and e[2] == ACCOUNT_SHARE]
        source = [e for e in entries if e[0] is not None and e[2] != ACCOUNT_SHARE]
        return {
            **_sized("account_entries", account),
            **_sized("source_entries", source),
            **_sized("marks", marks),
        }
    if role == "audit":
        return _sized("rows", orjson.loads(value)["rows"])
    if role == "decisions" and key is not None and key.split(b"|")[2] == b"-":
        return {"source_scoped": 1}  # no account: a source stage's decision
    if role.endswith("_changelog") and key is not None and key.endswith(b',"next"]'):
        return {"commits": 1}
    return {}


async def _read(bootstrap: str, topic: str, partitions: int, fold: Callable[[Any], None]) -> None:
    """Every message of ``topic`` from its start to its end offsets, through ``fold``."""
    # larger than any batch a worker writes: aiokafka returns nothing for a partition
    # whose next batch is over this limit
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",  # no group: every partition is read from its start
        max_partition_fetch_bytes=16 << 20,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        left = {tp for tp in tps if ends[tp] > 0}
        while left:
            batch = await consumer.getmany(*left, timeout_ms=1000, max_records=10_000)
            for messages in batch.values():
                for message in messages:
                    fold(message)
            # by position, not the last offset read: compaction leaves gaps
            left = {tp for tp in left if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()


async def _measure(bootstrap: str, topics: dict[str, str], partitions: int) -> Counts:
    counts: Counts = {}
    for role, topic in topics.items():
        tally: dict[str, float] = {"messages": 0, "key_bytes": 0, "value_bytes": 0, "tombstones": 0}

        def fold(message: Any, role: str = role, tally: dict[str, float] = tally) -> None:
            tally["messages"] += 1
            tally["key_bytes"] += len(message.key or b"")
            if message.value is None:
                tally["tombstones"] += 1
                extra = _rows_of(role, message.key, b"") if role.endswith("_changelog") else {}
            else:
                tally["value_bytes"] += len(message.value)
                extra = _rows_of(role, message.key, message.value)
            for name, value in extra.items():
                tally[name] = tally.get(name, 0) + value

        await _read(bootstrap, topic, partitions, fold)
        counts[role] = tally
    return counts


def measure(
    bootstrap: str, app_id: str, outputs: dict[str, str], partitions: int = PARTITIONS
) -> Counts:
    """The counts of every topic one worker (``app_id``) wrote; ``outputs`` maps the
    roles decisions, alerts, notices and audit to that run's topic names."""
    topics = {
        "by_account": f"{app_id}.attempts-by-account",
        "by_source": f"{app_id}.attempts-by-source",
        "shares": f"{app_id}.tenant-shares",
        **outputs,
        **{f"{t}_changelog": f"{app_id}-{t}-state-changelog" for t in ("account", "source")},
        "rollup_changelog": f"{app_id}-rollup-state-changelog",
    }
    return asyncio.run(_measure(bootstrap, {role: topics[role] for role in ROLES}, partitions))


def _per(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


@dataclass(frozen=True)
class Traffic:
    """B1's messages as per-row rates and mean sizes.

    ``rates``: audit messages, decisions (tombstones included), alerts, notices, forwarded
    rows, share entries and changelog records (commit records apart: one per envelope)
    per row of the stage that sends them: account rows for the account stage, forwarded
    rows for the source stage, share entries for the rollup; ``*_tombstones`` are shares
    of those messages. ``sizes``: bytes of a message's header and of each row in it (the
    rows as JSON lists), of keys and of values."""

    rates: dict[str, float]
    sizes: dict[str, int]

    @classmethod
    def of(cls, counts: Counts) -> Traffic:
        c = {role: defaultdict(float, counts.get(role, {})) for role in ROLES}
        acc, fwd, sh, audit = c["by_account"], c["by_source"], c["shares"], c["audit"]
        dec, alerts, notices = c["decisions"], c["alerts"], c["notices"]
        rows, forwarded = acc["rows"], fwd["rows"]
        entries = sh["account_entries"] + sh["source_entries"]
        source_dec = dec.get("source_scoped", 0)
        rates = {
            "audit_messages": _per(audit["messages"], rows),
            "account_decisions": _per(dec["messages"] - source_dec, rows),
            "source_decisions": _per(source_dec, forwarded),
            "decision_tombstones": _per(dec["tombstones"], dec["messages"]),
            "alerts": _per(alerts["messages"], rows),
            "notices": _per(notices["messages"], rows),
            "forwards": _per(forwarded, rows),
            "account_shares": _per(sh["account_entries"], rows),
            "source_shares": _per(sh["source_entries"], forwarded),
        }
        listed = ("account_entries", "source_entries", "marks")
        sizes = {
            "envelope_header": _per(acc["value_bytes"] - acc["rows_bytes"], acc["messages"]),
            "envelope_row": _per(acc["rows_bytes"], rows),
            "audit_header": _per(audit["value_bytes"] - audit["rows_bytes"], audit["messages"]),
            "audit_row": _per(audit["rows_bytes"], audit["rows"]),
            "audit_rows": _per(audit["rows"], audit["messages"]),
            "decision_key": _per(dec["key_bytes"], dec["messages"]),
            "decision_value": _per(dec["value_bytes"], dec["messages"] - dec["tombstones"]),
            "alert": _per(alerts["value_bytes"], alerts["messages"]),
            "notice_key": _per(notices["key_bytes"], notices["messages"]),
            "notice_value": _per(notices["value_bytes"], notices["messages"]),
            "forward_header": _per(
                fwd["value_bytes"] - fwd["rows_bytes"] - fwd["mark_rows_bytes"], fwd["messages"]
            ),
            "forward_row": _per(fwd["rows_bytes"], forwarded),
            "mark_row": _per(fwd["mark_rows_bytes"], fwd["mark_rows"]),
            "shares_header": _per(
                sh["value_bytes"] - sum(sh[f"{k}_bytes"] for k in listed), sh["messages"]
            ),
            "share_entry": _per(sh["account_entries_bytes"] + sh["source_entries_bytes"], entries),
            "share_mark": _per(sh["marks_bytes"], sh["marks"]),
        }
        for stage, per in (("account", rows), ("source", forwarded), ("rollup", entries)):
            log = c[f"{stage}_changelog"]
            records = log["messages"] - log.get("commits", 0)
            rates[f"{stage}_changelog"] = _per(records, per)
            rates[f"{stage}_changelog_tombstones"] = _per(log["tombstones"], records)
            sizes[f"{stage}_changelog_key"] = _per(log["key_bytes"], log["messages"])
            sizes[f"{stage}_changelog_value"] = _per(
                log["value_bytes"], log["messages"] - log["tombstones"]
            )
        return cls(rates, {name: round(size) for name, size in sizes.items()})


def per_event(counts: Counts, events: int) -> dict[str, dict[str, float]]:
    """Messages and bytes per input event, per topic role (for the report)."""
    return {
        role: {
            "messages": round(tally["messages"] / events, 4),
            "bytes": round((tally["key_bytes"] + tally["value_bytes"]) / events, 1),
        }
        for role, tally in counts.items()
    }


B1_COUNTS: dict[str, Any] = {
    "source": "the 1M-event B1 of bench/results/2026-12-02.json (e53b179)",
    "events": 1_000_000,
    "counts": {
        "by_account": {
            "messages": 1_616,
            "key_bytes": 1_616,
            "value_bytes": 175_098_257,
            "tombstones": 0,
            "rows": 1_000_000,
            "rows_bytes": 174_817_129,
            "marks_only": 16,
        },
        "by_source": {
            "messages": 2_816,
            "key_bytes": 2_816,
            "value_bytes": 71_331_544,
            "tombstones": 0,
            "rows": 461_999,
            "rows_bytes": 71_215_356,
            "mark_rows": 3_520,
            "mark_rows_bytes": 76_736,
        },
        "shares": {
            "messages": 3_920,
            "key_bytes": 3_920,
            "value_bytes": 2_695_850,
            "tombstones": 0,
            "account_entries": 16_619,
            "account_entries_bytes": 1_071_939,
            "source_entries": 22_505,
            "source_entries_bytes": 1_435_602,
            "marks": 6_880,
            "marks_bytes": 189_680,
        },
        "decisions": {
            "messages": 113_938,
            "key_bytes": 6_287_720,
            "value_bytes": 49_476_529,
            "tombstones": 4_109,
            "source_scoped": 40_239,
        },
        "alerts": {
            "messages": 224,
            "key_bytes": 0,
            "value_bytes": 64_658,
            "tombstones": 0,
        },
        "notices": {
            "messages": 205,
            "key_bytes": 6_560,
            "value_bytes": 61_090,
            "tombstones": 0,
        },
        "audit": {
            "messages": 769,
            "key_bytes": 769,
            "value_bytes": 225_689_531,
            "tombstones": 0,
            "rows": 1_000_000,
            "rows_bytes": 225_496_512,
        },
        "account_changelog": {
            "messages": 1_313_705,
            "key_bytes": 113_866_790,
            "value_bytes": 106_830_569,
            "tombstones": 7_368,
            "commits": 1_616,
        },
        "source_changelog": {
            "messages": 461_418,
            "key_bytes": 30_190_124,
            "value_bytes": 73_389_092,
            "tombstones": 8_695,
            "commits": 2_816,
        },
        "rollup_changelog": {
            "messages": 46_998,
            "key_bytes": 1_146_086,
            "value_bytes": 1_555_275,
            "tombstones": 0,
            "commits": 3_920,
        },
    },
}
