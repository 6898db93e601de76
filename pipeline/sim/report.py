"""``authpipe report``: one self-contained static HTML file with inline SVG charts.

The page holds its data as JSON in a ``<script type="application/json">`` element and a
small script of our own (``report_assets/report.js``, inlined) draws the charts: attempts
and failures over time (and would-be refusals, attacker attempts when labelled), the
decisions timeline (each block from issue to expiry, alerts as marks), top sources and
accounts by failures, alerts, and the scorecard. A Content-Security-Policy meta tag
forbids every fetch, so the file needs no network at view time.

Inputs are the files the other commands write (truth or events JSONL, decision and alert
JSONL, scorecard JSON), or the core ``Engine`` run here over the events. Accounts are
shown as digest prefixes unless ``plain_accounts`` is set or the events are the
simulator's labelled ground truth (synthetic identities; unlabelled events may hold real
ones, and a report is easily shared). Accounts an attacker got into (an attacker success
that was not refused) are listed and marked. The time axes (buckets, series, busy runs)
are ``report_spans``.
"""

from __future__ import annotations

import html
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from pipeline.contracts.models import datetime_to_ms, format_utc_ms, ms_to_datetime
from pipeline.core.decisions import Verdict
from pipeline.core.policy import Policy
from pipeline.errors import AuthpipeError
from pipeline.settings import Settings
from pipeline.sim.matching import match_alerts
from pipeline.sim.output_files import load_outputs
from pipeline.sim.outputs import Outputs, run_engine
from pipeline.sim.replay import replay_sessions
from pipeline.sim.report_spans import busy_spans, series
from pipeline.sim.scoring import score, takeover
from pipeline.sim.truth import ATTACKER, UNKNOWN, TruthEvent, load_truth
from pipeline.wiring import build_normaliser, grouping_check, load_policy

MAX_DECISIONS = 1500
MAX_ALERTS = 1000
TOP = 15
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


class ReportError(AuthpipeError):
    """The report has nothing to show or cannot be written."""


@dataclass(frozen=True, slots=True)
class ReportInputs:
    events: Sequence[TruthEvent]
    outputs: Outputs | None
    scorecard: dict[str, Any] | None
    title: str = "authpipe report"
    plain_accounts: bool = False
    policy: Policy | None = None
    """The policy that decided (its ``[verify]`` is part of every verdict)."""


def _zooms(
    events: Sequence[TruthEvent],
    refused: Sequence[bool] | None,
    decisions: Sequence[dict[str, Any]],
    alerts: Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    """A chart's data per busy run (``busy_spans``): its range, events and series, and the
    decisions in force and alerts raised in it (each list capped as the whole span's)."""
    times = [e.occurred_ms for e in events]
    out = []
    for lo, hi in busy_spans(times):
        i, j = bisect_left(times, lo), bisect_left(times, hi)
        inside = [d for d in decisions if d["until"] > lo and d["t"] < hi]
        drawn = inside[:MAX_DECISIONS]
        raised = [a for a in alerts if lo <= a["t"] < hi][:MAX_ALERTS]
        out.append(
            {
                "range": {"start_ms": lo, "end_ms": hi},
                "events": j - i,
                "series": series(events[i:j], refused[i:j] if refused is not None else None),
                "lanes": sorted({d["rule"] for d in drawn})
                + [f"alert: {t}" for t in sorted({a["type"] for a in raised})],
                "decisions": drawn,
                "decisions_truncated": max(0, len(inside) - MAX_DECISIONS),
                "alerts": raised,
            }
        )
    return out


def takeovers(
    events: Sequence[TruthEvent], verdicts: Sequence[Verdict], reviewed: Collection[int]
) -> Counter[tuple[str, str]]:
    """Takeovers per (tenant, account digest), counted as the scorecard counts them
    (``pipeline.sim.scoring.takeover``)."""
    out: Counter[tuple[str, str]] = Counter()
    for i, (e, verdict) in enumerate(zip(events, verdicts, strict=True)):
        if takeover(e, verdict, i in reviewed):
            out[(e.attempt.tenant, e.attempt.account)] += 1
    return out


def _majority_role(roles: Counter[str]) -> str:
    return roles.most_common(1)[0][0] if roles else UNKNOWN


def _top(
    events: Sequence[TruthEvent], plain: bool, taken: Counter[tuple[str, str]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Top sources and accounts by failures. Accounts are named by their typed identifier
    when asked (``plain``) or when the events are the simulator's labelled ground truth
    (synthetic identities), else by digest prefix; ``takeover`` marks accounts an attacker
    got into."""
    failures: dict[str, Counter[tuple[str, str]]] = {"source": Counter(), "account": Counter()}
    roles: dict[tuple[str, str, str], Counter[str]] = defaultdict(Counter)
    scenarios: dict[tuple[str, str, str], Counter[str]] = defaultdict(Counter)
    names = account_names(events)
    named = plain or any(e.role != UNKNOWN for e in events)
    for e in events:
        a = e.attempt
        if a.success:
            continue
        for kind, subject in (("source", a.source), ("account", a.account)):
            slot = (a.tenant, subject)
            failures[kind][slot] += 1
            roles[(kind, *slot)][e.role] += 1
            if e.role == ATTACKER:
                scenarios[(kind, *slot)][e.scenario] += 1

    def rows(kind: str) -> list[dict[str, Any]]:
        out = []
        for (tenant, subject), count in failures[kind].most_common(TOP):
            shown = subject
            if kind == "account":
                shown = names[(tenant, subject)] if named else subject[:12] + "\u2026"
            attack = scenarios[(kind, tenant, subject)].most_common(1)
            out.append(
                {
                    "label": f"{shown} ({tenant})" if tenant != "default" else shown,
                    "value": count,
                    "role": _majority_role(roles[(kind, tenant, subject)]),
                    "note": attack[0][0] if attack else None,
                    "takeover": kind == "account" and taken[(tenant, subject)] > 0,
                }
            )
        return out

    return rows("source"), rows("account")


def account_names(events: Sequence[TruthEvent]) -> dict[tuple[str, str], str]:
    """(tenant, account digest) -> the typed identifier, from the events."""
    return {(e.attempt.tenant, e.attempt.account): e.account_plain for e in events}


def _decisions(
    outputs: Outputs | None, end_ms: int, attacks: dict[str, str]
) -> list[dict[str, Any]]:
    """Every decision in time order (each chart draws the first ``MAX_DECISIONS``)."""
    if outputs is None:
        return []
    out: list[dict[str, Any]] = []
    for rec in outputs.decisions:
        d = rec.decision
        if d is None:
            continue
        issued = datetime_to_ms(d.issued_at)
        until = min(datetime_to_ms(d.expires_at), end_ms)
        out.append(
            {
                "t": issued,
                "until": until,
                "rule": d.rule,
                "action": d.action,
                "attack": attacks.get(rec.key),
            }
        )
    out.sort(key=lambda d: d["t"])
    return out


def _alerts(
    outputs: Outputs | None, events: Sequence[TruthEvent], named: bool
) -> list[dict[str, Any]]:
    if outputs is None:
        return []
    labelled = any(e.role != UNKNOWN for e in events)
    plain = account_names(events) if named or labelled else {}
    out: list[dict[str, Any]] = []
    for rec, (t, names, _) in zip(
        outputs.alerts, match_alerts(outputs.alerts, events), strict=True
    ):
        a = rec.alert
        account = None
        if a.account_digest:
            account = plain.get((a.tenant, a.account_digest), a.account_digest[:12] + "\u2026")
        subject = a.source or account or a.tenant
        matched = (", ".join(names) or "no attack") if labelled else None
        out.append(
            {"t": t, "type": a.type, "subject": subject, "count": a.count, "matched": matched}
        )
    out.sort(key=lambda a: a["t"])
    return out


def _attack_keys(events: Sequence[TruthEvent]) -> dict[str, str]:
    from pipeline.core.decision_keys import keys_for
    from pipeline.core.keys import format_key

    out: dict[str, str] = {}
    for e in events:
        if e.role == ATTACKER:
            for key in keys_for(e.attempt):
                out.setdefault(format_key(key), e.scenario)
    return out


def build_data(inputs: ReportInputs) -> dict[str, Any]:
    """Everything the page draws, aggregated here so the page stays small."""
    events = inputs.events
    if not events:
        raise ReportError(
            "no events to report on; give --truth or --events with at least one event"
        )
    refused = None
    taken: Counter[tuple[str, str]] = Counter()
    if inputs.outputs is not None:
        verdicts, reviewed = replay_sessions(events, inputs.outputs.decisions, inputs.policy)
        refused = [not v.allowed for v in verdicts]
        if any(e.role != UNKNOWN for e in events):
            taken = takeovers(events, verdicts, reviewed)
    start_ms, end_ms = events[0].occurred_ms, events[-1].occurred_ms + 1
    every_decision = _decisions(inputs.outputs, end_ms, _attack_keys(events))
    every_alert = _alerts(inputs.outputs, events, inputs.plain_accounts)
    decisions, truncated = every_decision[:MAX_DECISIONS], len(every_decision) - MAX_DECISIONS
    alerts = every_alert[:MAX_ALERTS]
    sources, accounts = _top(events, inputs.plain_accounts, taken)
    names = account_names(events)
    rules = sorted({d["rule"] for d in decisions})
    alert_types = sorted({a["type"] for a in alerts})
    return {
        "title": inputs.title,
        "subtitle": f"{len(events):,} events, {format_utc_ms(ms_to_datetime(start_ms))} to "
        f"{format_utc_ms(ms_to_datetime(end_ms))}",
        "range": {"start_ms": start_ms, "end_ms": end_ms},
        "series": series(events, refused),
        "zooms": _zooms(events, refused, every_decision, every_alert),
        "lanes": rules + [f"alert: {t}" for t in alert_types],
        "decisions": decisions,
        "decisions_truncated": max(0, truncated),
        "alerts": alerts,
        "alerts_by_type": dict(Counter(r.alert.type for r in inputs.outputs.alerts))
        if inputs.outputs
        else {},
        "top_sources": sources,
        "top_accounts": accounts,
        "takeovers": [
            {
                "account": names[slot] if slot in names else slot[1],
                "tenant": slot[0],
                "successes": n,
            }
            for slot, n in sorted(taken.items())
        ],
        "scorecard": inputs.scorecard,
    }


def _asset(name: str) -> str:
    return (
        resources.files("pipeline.sim").joinpath("report_assets", name).read_text(encoding="utf-8")
    )


def render_html(data: dict[str, Any]) -> str:
    """The page: data as JSON (``</`` escaped so it cannot close the script), CSS, script."""
    payload = orjson.dumps(data).decode().replace("</", "<\\/")
    title = html.escape(data["title"])
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{_asset("report.css")}
</style>
</head>
<body>
<header><h1>{title}</h1><p>{html.escape(data["subtitle"])}</p></header>
<main>
<div id="errors"></div>
<section class="wide"><h2>Attempts and failures over time</h2><div id="traffic"></div></section>
<section class="wide"><h2>Decisions and alerts</h2><div id="timeline"></div></section>
{_zoom_section(data)}<section><h2>Top sources by failures</h2><div id="sources"></div></section>
<section><h2>Top accounts by failures</h2><div id="accounts"></div></section>
<section class="wide"><h2>Alerts</h2><div id="alerts"></div></section>
<section class="wide"><h2>Scorecard</h2><div id="scorecard"></div></section>
</main>
<script type="application/json" id="report-data">{payload}</script>
<script>
{_asset("report.js")}
</script>
</body>
</html>
"""


def _zoom_section(data: dict[str, Any]) -> str:
    if not data.get("zooms"):
        return ""
    return (
        '<section class="wide" id="zooms"><h2>Busy stretches, each on its own time axis</h2>'
        "</section>\n"
    )


def write_report(inputs: ReportInputs, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(build_data(inputs)), encoding="utf-8")
    return path


def load_scorecard_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ReportError(
            f"scorecard file {path} does not exist; write one with authpipe scorecard --out"
        )
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ReportError(f"{path} is not JSON ({exc})") from None
    if not isinstance(data, dict) or "attacks" not in data:
        raise ReportError(f"{path} is not a scorecard (no 'attacks')")
    return data


def run_report_command(
    settings: Settings,
    *,
    out: Path,
    events: Path,
    decisions: Path | None,
    alerts: Path | None,
    engine: bool,
    policy: Path | None,
    scorecard: Path | None,
    title: str,
    plain_accounts: bool,
) -> int:
    """``authpipe report``: gather the inputs (computing what is missing) and write the page."""
    loaded = load_truth(events, build_normaliser(settings))
    decided_by = load_policy(policy or settings.policy_path)
    outputs = None
    if engine:
        outputs = run_engine(loaded, decided_by)
    elif decisions is not None:
        outputs = load_outputs(decisions, alerts, grouping_check(settings))
    card = load_scorecard_json(scorecard) if scorecard is not None else None
    if card is None and outputs is not None and any(e.role != UNKNOWN for e in loaded):
        card = score(loaded, outputs, decided_by).as_json()
    inputs = ReportInputs(loaded, outputs, card, title, plain_accounts, decided_by)
    path = write_report(inputs, out)
    print(f"report: {path} ({path.stat().st_size:,} bytes)")
    return 0
