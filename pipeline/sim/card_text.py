"""The scorecard as a plain-text table (what ``authpipe scorecard`` prints)."""

from __future__ import annotations

from pipeline.sim.card import Scorecard


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def render(card: Scorecard) -> str:
    """The scorecard as a plain-text table."""
    head = (
        f"{'attack':<32} {'tenant':<8} {'attempts':>8} {'responded':>9}  {'by':<26}"
        f"{'through':>7} {'refused':>8} {'allowed':>8} {'g/acct/24h':>10} {'ATO':>4}  status"
    )
    lines = [
        f"scorecard: {card.origin}, policy {card.policy_version or '-'}, {card.events:,} events",
        head,
    ]
    for a in card.attacks:
        response = a.response_ms
        took = None if response is None else response - a.start_ms
        lines.append(
            f"{a.attack:<32} {a.tenant:<8} {a.attempts:>8} {_duration(took):>9}  "
            f"{a.response_by or '-':<26}{a.allowed_before_response:>7} {a.refused:>8} "
            f"{a.allowed:>8} {a.guesses_per_account_24h:>10} {a.successes_allowed:>4}  {a.status.replace('_', ' ')}"
            + ("  <- ACCOUNTS TAKEN OVER" if a.successes_allowed else "")
        )
    cohorts = ", ".join(
        f"{c} {card.legit_refused.get(c, 0)}/{n}" for c, n in sorted(card.legit_attempts.items())
    )
    lines.append(f"legitimate attempts refused: {card.legit_refused_total} ({cohorts})")
    challenged = ", ".join(
        f"{c} {card.legit_challenged.get(c, 0)}/{n}"
        for c, n in sorted(card.legit_attempts.items())
        if card.legit_challenged.get(c, 0)
    )
    lines.append(
        f"legitimate attempts challenged: {sum(card.legit_challenged.values())}"
        + (f" ({challenged})" if challenged else "")
        + f"; untrusted password attempts during waves: {card.legit_challenged_in_wave}"
        f" of {card.legit_untrusted_in_wave} challenged"
        f"; challenged while no attack ran: {card.legit_challenged_outside_attacks}"
        f" ({card.legit_challenged_away_from_attacks} away from attacks)"
        f"; sessions stepped up after sign-in: {card.legit_stepped_up_after_sign_in}"
        f" ({card.legit_stepped_up_outside_attacks} signed in while no attack ran,"
        f" {card.legit_stepped_up_away_from_attacks} away from attacks)"
    )
    lines.append(
        f"legitimate sign-ins at an unfamiliar place and client stepped up: {card.legit_verified}"
        "; legitimate people challenged at least once: "
        f"{card.legit_people_challenged}"
        f" of {card.legit_people} ({_percent(card.legit_people_challenged, card.legit_people)});"
        f" of those who signed in during the history: {card.legit_known_people_challenged}"
        f" of {card.legit_known_people}"
        f" ({_percent(card.legit_known_people_challenged, card.legit_known_people)})"
    )
    verified = ", ".join(
        f"{a.attack} {a.valid_captcha_only}/{a.valid_confirmed_by_step_up}"
        f"/{a.takeovers_if_captcha_bought}"
        for a in card.attacks
        if a.valid_captcha_only or a.valid_confirmed_by_step_up or a.takeovers_if_captcha_bought
    )
    if verified:
        lines.append(
            "valid credentials that met only a CAPTCHA / were confirmed by a step-up / "
            f"accounts taken over if CAPTCHAs are bought: {verified}"
        )
    reviewed = ", ".join(
        f"{a.attack} {a.stepped_up_after_sign_in}"
        for a in card.attacks
        if a.stepped_up_after_sign_in
    )
    if reviewed:
        lines.append(f"attacker sign-ins stepped up after the fact (a wave's lead-in): {reviewed}")
    answered = ", ".join(
        f"{w['attack']}/{w['cohort']} "
        + ("never" if w["challenged_after_s"] is None else f"{w['challenged_after_s']:.1f} s")
        for w in card.wave_answers
    )
    if answered:
        lines.append(f"waves challenged after (from each attacker's first attempt): {answered}")
    for cohort, n in sorted(card.legit_by_design.items()):
        lines.append(
            f"  refused by design: {cohort} {n}: {'; '.join(card.legit_by_design_why.get(cohort, []))}"
        )
    for ex in card.legit_examples:
        lines.append(
            f"  {ex['at']} {ex['cohort']} {ex['actor']} {ex['flow']} refused by {ex['refused_by']}"
        )
    lines.append(
        f"decisions: {card.blocks} blocks, {card.observes} observe, {card.tombstones} tombstones; "
        f"blocks matching no attack: {len(card.unmatched_blocks)} "
        f"(and {card.seed_holds_matching_no_attack} seed holds that refused nobody wrongly)"
    )
    types = ", ".join(f"{t} {n}" for t, n in sorted(card.alerts_by_type.items()))
    lines.append(
        f"alerts: {sum(card.alerts_by_type.values())} ({types or 'none'}); "
        f"matching no attack: {len(card.unmatched_alerts)}"
    )
    for un in card.unmatched_alerts:
        subject = un["source"] or un["account_digest"] or un["tenant"]
        lines.append(f"  {un['type']} {subject} at {un['at']} ({un['count']}): {un['note']}")
    lines.append(
        "responded: time from the attack's first attempt to its first block or alert; "
        "through: its attempts allowed until then; g/acct/24h: the most guesses let through "
        "against one account in any 24 h; ATO: its successes allowed (account "
        "takeovers); status: stopped (refused, no takeover, <= 10 % through after the response), "
        "slowed (refused, but more through or a takeover), detected only (nothing refused), missed"
    )
    if card.missing_decision_records:
        lines.append(
            f"WARNING: {card.missing_decision_records} records of the decision topic were compacted "
            "away before this read: decisions superseded or lifted by then are missing, so "
            "refusals and first blocks are under-counted (score a fresher read, or files)"
        )
    lines.append(card.closing_line())
    return "\n".join(lines)
