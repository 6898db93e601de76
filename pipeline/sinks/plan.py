"""The lane's plan in its Kafka commit metadata (pure): ``ap1:120,37,!,15|<marks>``.

A lane's commit carries the batches planned since the committed offset (spans in
offsets, ``!`` a rate-cap close) and then its upstream marks (``|<topic>=<partition>:
<offset>,…``), so a restarted sink rebuilds the same batches and tokens
(``pipeline.sinks.lanes``). Everything together stays under Kafka's 4,096-byte limit:
``MAX_PLAN_CHARS`` for the plan (the lane closes its cap to make a clean point when the
plan grows past it) and ``MAX_MARKS_CHARS`` for the marks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from pipeline.errors import AuthpipeError

MAX_PLAN_CHARS: Final = 2_000
MAX_MARKS_CHARS: Final = 1_900  # plan + marks stay under Kafka's 4,096-byte metadata limit
PLAN_PREFIX: Final = "ap1:"
CLOSE: Final = "!"
MARKS_SEPARATOR: Final = "|"

Entry = int | str  # a batch span in offsets, or CLOSE


class SinkError(AuthpipeError):
    """The sink cannot start or go on (bad configuration, no broker, a foreign commit)."""


def encode_plan(entries: Iterable[Entry], marks: str = "") -> str:
    """``ap1:`` then the entries (batch spans in offsets, ``!`` for a close), then marks."""
    return PLAN_PREFIX + ",".join(str(entry) for entry in entries) + marks


def decode_plan(metadata: str | None) -> list[Entry]:
    """The entries of a commit's metadata; empty for no or foreign metadata."""
    if not metadata or not metadata.startswith(PLAN_PREFIX):
        return []
    body = metadata[len(PLAN_PREFIX) :].split(MARKS_SEPARATOR, 1)[0]
    if not body:
        return []
    entries: list[Entry] = []
    for part in body.split(","):
        if part == CLOSE:
            entries.append(CLOSE)
        elif part.isdigit() and int(part) > 0:
            entries.append(int(part))
        else:
            raise _foreign(metadata)
    return entries


Marks = dict[str, dict[int, int]]  # input topic -> input partition -> highest offset planned


def encode_marks(marks: Marks, limit: int = MAX_MARKS_CHARS) -> tuple[str, bool]:
    """``|<topic>=<partition>:<offset>,…`` per input topic, and whether any were left out.

    Kafka topic names hold only ``[A-Za-z0-9._-]``, so ``|``, ``=``, ``:`` and ``,``
    cannot occur in them.
    """
    parts: list[str] = []
    size = 0
    cut = False
    for topic in sorted(marks):
        pairs = []
        head = len(topic) + 2
        for partition, offset in sorted(marks[topic].items()):
            pair = f"{partition}:{offset}"
            if size + head + len(pair) + 1 > limit:
                cut = True
                break
            pairs.append(pair)
            size += len(pair) + 1
        if pairs:
            parts.append(f"{MARKS_SEPARATOR}{topic}={','.join(pairs)}")
            size += head
        if cut:
            break
    return "".join(parts), cut


def decode_marks(metadata: str | None) -> Marks:
    """The marks of a commit's metadata; empty for none, old or foreign metadata."""
    if not metadata or not metadata.startswith(PLAN_PREFIX):
        return {}
    marks: Marks = {}
    for section in metadata.split(MARKS_SEPARATOR)[1:]:
        topic, _, pairs = section.partition("=")
        found = marks.setdefault(topic, {})
        for pair in pairs.split(","):
            partition, _, offset = pair.partition(":")
            if not (topic and partition.isdigit() and offset.isdigit()):
                raise _foreign(metadata)
            found[int(partition)] = int(offset)
    return marks


def _foreign(metadata: str) -> SinkError:
    return SinkError(
        f"commit metadata {metadata[:80]!r} is not a sink plan; "
        "another program committed for this group: give the sink its own group"
    )
