"""What the demo says about its block-list feed when the feed shows less than the run did.

The demo plays an hour of simulated traffic in about a minute, with event times ending
about now; decisions expire in event time (``expires_at``), so the ones made early in the
simulated hour have lapsed on the wall clock by the time the feed is read. A user must be
told that, and what the feed shows in production (events in real time).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import orjson

from pipeline.contracts.models import datetime_to_ms, format_utc_ms, ms_to_datetime


@dataclass(frozen=True)
class SourceDecision:
    """The last record of one source-scope decision key in the run."""

    source: str
    action: str
    expires_ms: int
    lifted: bool


def load_source_decisions(path: Path) -> list[SourceDecision]:
    """Source-scope decisions (what the feed lists) from a decisions JSONL written by
    ``scorecard --save-outputs``: the last record per key; a tombstone marks it lifted."""
    last: dict[str, SourceDecision] = {}
    if not path.is_file():
        return []
    with path.open("rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            row = orjson.loads(line)
            key, value = str(row.get("key", "")), row.get("value")
            if not key.startswith("source|"):
                continue
            if value is None:
                if key in last:
                    last[key] = SourceDecision(
                        last[key].source, last[key].action, last[key].expires_ms, True
                    )
                continue
            expires = datetime_to_ms(
                datetime.fromisoformat(value["expires_at"].replace("Z", "+00:00"))
            )
            last[key] = SourceDecision(
                str(value.get("source")), str(value["action"]), expires, False
            )
    return list(last.values())


def _at(ms: int) -> str:
    return format_utc_ms(ms_to_datetime(ms))


def blocklist_note(decisions: Iterable[SourceDecision], listed: int, now_ms: int) -> list[str]:
    """Lines explaining the feed's count against the run's source-scope decisions. A
    decision has ended when its expiry passed on the wall clock or a tombstone came (the
    worker tombstones a decision when its expires_at passes on the wall clock, or when a
    success lifts it)."""
    decisions = list(decisions)
    production = (
        "In production events arrive in real time, and the feed lists each source "
        "for as long as its decision is active (until its expires_at)."
    )
    if not decisions:
        return [
            "why: this run made no source-level decision. The feed lists only source-scope "
            "decisions (rule 5 `source`: 200 distinct accounts failing from one source in "
            "15 min; observe-only by default, shown with include=observe); blocks on accounts "
            "are enforced through /v1/check, not this feed.",
            production,
        ]
    blocks = sum(d.action == "block" for d in decisions)
    ended = [d for d in decisions if d.lifted or d.expires_ms <= now_ms]
    made = (
        f"this run made {len(decisions)} source-level decision(s) ({blocks} block, "
        f"{len(decisions) - blocks} observe-only)"
    )
    if not ended:
        return [f"{made}; all active."]
    last = max(d.expires_ms for d in ended)
    why = "why" if listed < len(decisions) else "note"
    return [
        f"{why}: {made}; {len(ended)} ended before the feed was read (latest expiry "
        f"{_at(last)}). Decisions expire in event time and the worker tombstones them when that "
        "time passes on the wall clock; the demo plays its simulated hour in about a minute "
        "with event times ending now, so decisions made early in simulated time have ended "
        "by the time the feed is read.",
        production,
    ]
