"""What the stages send and write, free of faust: the envelopes between stages (their
sizes, and where the event-time marks ride), a stage's outputs for one envelope, and its
changelog keys. The faust shell (``pipeline.stream.app``) and the in-memory twin
(``pipeline.stream.memory``) both send through these, so the twin cuts messages as the
worker does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.contracts.codec import dumps, encode
from pipeline.contracts.models import AUDIT_COLUMNS
from pipeline.core.outbox import Outbox
from pipeline.core.rollup import TICK_MS
from pipeline.core.sequence import Sequencer

# Rows per message on the internal and audit topics: a few hundred bytes each, so a
# message stays well under the broker's default 1 MB limit however a batch is skewed.
MAX_ROWS_PER_MESSAGE = 2000


def chunks(rows: list[Any], size: int = MAX_ROWS_PER_MESSAGE) -> list[list[Any]]:
    """``rows`` in order, in lists of at most ``size``."""
    if len(rows) <= size:
        return [rows]
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def account_envelopes(
    rows: dict[int, list[list[Any]]],
    marks: list[list[int]],
    partitions: int,
    size: int = MAX_ROWS_PER_MESSAGE,
    targets: set[int] | None = None,
) -> list[tuple[int, list[list[Any]], list[list[int]]]]:
    """``(account partition, rows, marks)`` of one ingest batch: every partition (or
    every one of ``targets``, which holds those with rows) gets the marks, rows or not
    (its watermark is the minimum over every input partition), in messages of at most
    ``size`` rows. The marks ride on each partition's last message only: they cover
    every row of the batch, so an earlier message carrying them would make the rows of
    the later ones late."""
    out: list[tuple[int, list[list[Any]], list[list[int]]]] = []
    for partition in range(partitions) if targets is None else sorted(targets):
        parts = chunks(rows.get(partition, []), size)
        for i, part in enumerate(parts):
            out.append((partition, part, marks if i == len(parts) - 1 else []))
    return out


def latest_shares(shares: list[list[Any]]) -> list[list[Any]]:
    """Tenant shares ``[tenant, window, kind, partition, share, time_ms, event_id, seq]``,
    each subject's latest per second of event time only (a share is the shard's absolute
    count and rule 8 is evaluated at second boundaries, so an older one of the same
    subject and second carries nothing), then each upstream's latest mark
    ``[None, watermark_ms, kind, partition]``.

    The marks go last: a mark says nothing earlier follows, and the batch may be sent as
    several messages (``chunks``), so a mark moved ahead of shares sent after it in an
    earlier chunk would make them late. Moving a mark later only delays a release."""
    latest: dict[tuple[Any, ...], list[Any]] = {}
    marks: dict[tuple[Any, ...], list[Any]] = {}
    for share in shares:
        if share[0] is None:
            subject: tuple[Any, ...] = (share[2], share[3])
            old = marks.get(subject)
            if old is None or old[1] < share[1]:
                marks[subject] = share
        else:
            latest[(share[0], share[1], share[2], share[3], share[5] // TICK_MS)] = share
    return [*latest.values(), *marks.values()]


@dataclass
class StageOutput:
    """What one envelope produced, ready to send. Decision values of None are tombstones."""

    decisions: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    alerts: list[bytes] = field(default_factory=list)
    notices: list[tuple[bytes, bytes]] = field(default_factory=list)
    audit: list[list[Any]] = field(default_factory=list)
    forwards: dict[int, list[list[Any]]] = field(default_factory=dict)
    shares: list[list[Any]] = field(default_factory=list)
    changelog: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    # The stage partition's new watermark, to send to every downstream partition (None:
    # unchanged). Everything it will still send is at or after it in event time.
    mark_ms: int | None = None
    counted: int = 0
    skipped: int = 0
    held: int = 0
    # Changelog records of rows held across envelopes: written when held, deleted when
    # released (a row held and released within one envelope writes none).
    held_records: int = 0
    # Rows that arrived below the stage's released watermark (applied at once, out of
    # event-time order: ``pipeline.core.sequence``), and the first of them as
    # [upstream, position, time_ms, released_ms], for the worker's log.
    late: int = 0
    first_late: list[int] | None = None

    def note_late(self, upstream: int, position: int, time_ms: int, released_ms: int) -> None:
        self.late += 1
        if self.first_late is None:
            self.first_late = [upstream, position, time_ms, released_ms]

    def audit_messages(self) -> list[bytes]:
        """The audit rows as batch messages of at most MAX_ROWS_PER_MESSAGE rows."""
        if not self.audit:
            return []
        return [
            dumps({"v": 1, "columns": AUDIT_COLUMNS, "rows": rows}) for rows in chunks(self.audit)
        ]


def collect(out: Outbox, result: StageOutput) -> None:
    for key, decision in out.decisions:
        result.decisions.append((key.encode(), encode(decision) if decision else None))
    for key, exempt in out.exempts:
        result.decisions.append((key.encode(), exempt))
    result.alerts.extend(encode(alert) for alert in out.alerts)
    result.notices.extend((n.account_digest.encode(), encode(n)) for n in out.notices)
    out.decisions.clear()
    out.exempts.clear()
    out.alerts.clear()
    out.notices.clear()


def changelog_key(partition: int, key: list[Any]) -> bytes:
    return dumps([partition, *key])


def commit_record(next_offset: int, sequencer: Sequencer) -> bytes:
    """The commit record's value: ``[next, hold_from]``, the offset of the next input message
    and of the first one with a row still held (``next`` when none is): a restore resumes
    the input at ``hold_from`` and holds those rows again (``pipeline.stream.stages``)."""
    oldest = sequencer.oldest_origin()
    return dumps([next_offset, next_offset if oldest is None else min(oldest, next_offset)])


def commit_value(value: Any) -> tuple[int, int]:
    """``(next, hold_from)`` of a decoded commit record (a changelog written before
    ``hold_from`` has the bare next offset, its held rows as records)."""
    if isinstance(value, list):
        return int(value[0]), int(value[1])
    return int(value), int(value)


def commit_key(partition: int) -> bytes:
    """The key of the record every stage writes last for each message it applies (the
    offset of its next input message): a restore counts a message's records only up to it
    (``pipeline.stream.restore.ChangelogFold``)."""
    return changelog_key(partition, ["next"])
