"""The scorecard's figures, per attack and overall, and their JSON.

Status of an attack: ``stopped`` = blocks refused its attempts, no account was taken over,
and at most 10 % of its attempts after the first response got through; ``slowed`` = blocks
refused some attempts but more got through, or an account was taken over;
``detected_only`` = an alert or a decision (block or observe) matched it but nothing was
refused; else ``missed``. The closing line never says more than that.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipeline.contracts.models import format_utc_ms, ms_to_datetime

STOPPED, SLOWED, DETECTED_ONLY, MISSED = "stopped", "slowed", "detected_only", "missed"
STATUSES = (STOPPED, SLOWED, DETECTED_ONLY, MISSED)
# "stopped" allows at most this share of the attempts after the first response through.
STOPPED_LEAK_PERCENT = 10


@dataclass(kw_only=True)
class Tally:
    """Attempts a gateway let through and refused, and the successes it let through."""

    allowed: int = 0
    refused: int = 0
    successes_allowed: int = 0

    def add(self, allowed: bool, success: bool) -> None:
        """Count one attempt: refused, or let through (and a success let through)."""
        if not allowed:
            self.refused += 1
            return
        self.allowed += 1
        if success:
            self.successes_allowed += 1


@dataclass
class AttackScore(Tally):
    """One attack's figures (``Tally``: its attempts let through and refused)."""

    attack: str
    tenant: str
    attempts: int
    start_ms: int
    end_ms: int
    first_block_ms: int | None = None
    first_block_rule: str | None = None
    first_alert_ms: int | None = None
    first_alert_type: str | None = None
    allowed_before_response: int = 0
    alerts: Counter[str] = field(default_factory=Counter)
    blocks: Counter[str] = field(default_factory=Counter)
    observes: Counter[str] = field(default_factory=Counter)
    guesses_per_account_24h: int = 0
    account_takeovers: int = 0
    challenged: int = 0
    """Attempts that met a challenge (counted in ``refused``: bots fail challenges)."""
    stepped_up_after_sign_in: int = 0
    """Sign-ins let through unchallenged whose session a review stepped up later (a
    wave's lead-in covered them: ``pipeline.sim.replay.replay_sessions``); counted in
    ``refused``, not as takeovers."""
    valid_captcha_only: int = 0
    """Valid credentials (an attacker's right password on another's account) that met a
    CAPTCHA and no possession check: each a takeover for an attacker who buys CAPTCHA
    solving (issue 44: a CAPTCHA is a cost, not a verification)."""
    valid_confirmed_by_step_up: int = 0
    """Valid credentials answered by a step-up: not a session, but the attacker learns
    the password is right."""
    takeovers_if_captcha_bought: int = 0
    """Accounts taken over if the attacker passes every CAPTCHA (``account_takeovers``
    plus the accounts of ``valid_captcha_only``)."""

    @property
    def response_ms(self) -> int | None:
        times = [t for t in (self.first_block_ms, self.first_alert_ms) if t is not None]
        return min(times) if times else None

    @property
    def response_by(self) -> str | None:
        response = self.response_ms
        if response is None:
            return None
        if response == self.first_block_ms:
            return f"block:{self.first_block_rule}"
        return f"alert:{self.first_alert_type}"

    @property
    def allowed_after_response(self) -> int:
        return self.allowed - self.allowed_before_response

    @property
    def status(self) -> str:
        if self.refused:
            after = self.allowed_after_response
            leaked = after * 100 > STOPPED_LEAK_PERCENT * (after + self.refused)
            return SLOWED if self.successes_allowed or leaked else STOPPED
        if self.response_ms is not None or self.observes:
            return DETECTED_ONLY
        return MISSED

    def as_json(self) -> dict[str, Any]:
        response = self.response_ms
        return {
            "attack": self.attack,
            "tenant": self.tenant,
            "status": self.status,
            "attempts": self.attempts,
            "start": ts(self.start_ms),
            "end": ts(self.end_ms),
            "first_block": ts(self.first_block_ms),
            "first_block_rule": self.first_block_rule,
            "first_alert": ts(self.first_alert_ms),
            "first_alert_type": self.first_alert_type,
            "response": ts(response),
            "response_by": self.response_by,
            "time_to_response_ms": None if response is None else response - self.start_ms,
            "allowed_before_response": self.allowed_before_response,
            "refused": self.refused,
            "allowed": self.allowed,
            "successes_allowed": self.successes_allowed,
            "guesses_per_account_24h": self.guesses_per_account_24h,
            "account_takeovers": self.account_takeovers,
            "challenged": self.challenged,
            "stepped_up_after_sign_in": self.stepped_up_after_sign_in,
            "valid_captcha_only": self.valid_captcha_only,
            "valid_confirmed_by_step_up": self.valid_confirmed_by_step_up,
            "takeovers_if_captcha_bought": self.takeovers_if_captcha_bought,
            "alerts": dict(sorted(self.alerts.items())),
            "blocks": dict(sorted(self.blocks.items())),
            "observes": dict(sorted(self.observes.items())),
        }


def ts(ms: int | None) -> str | None:
    return None if ms is None else format_utc_ms(ms_to_datetime(ms))


@dataclass
class Scorecard:
    origin: str
    policy_version: str | None
    events: int
    attacks: list[AttackScore]
    legit_attempts: Counter[str]
    legit_refused: Counter[str]
    legit_examples: list[dict[str, Any]]
    alerts_by_type: Counter[str]
    unmatched_alerts: list[dict[str, Any]]
    blocks: int
    observes: int
    tombstones: int
    unmatched_blocks: list[dict[str, Any]]
    missing_decision_records: int = 0
    seed_holds_matching_no_attack: int = 0
    legit_by_design: Counter[str] = field(default_factory=Counter)
    legit_by_design_why: dict[str, list[str]] = field(default_factory=dict)
    legit_challenged: Counter[str] = field(default_factory=Counter)
    legit_untrusted_in_wave: int = 0
    """Legitimate untrusted password attempts while a wave challenge was in force."""
    legit_challenged_in_wave: int = 0
    legit_challenged_outside_attacks: int = 0
    """Legitimate attempts challenged while no attack's password attempts ran (the truth),
    a wave's hold after an attack included; [verify]'s own step-ups left out."""
    legit_challenged_away_from_attacks: int = 0
    """Those of them away from every attack (``pipeline.sim.waves.near_attacks``): beyond
    the wave's lead-in and first window before its first attempt and its paced sum and
    hold after its last (70 s and 2 min under the default policy)."""
    legit_stepped_up_after_sign_in: int = 0
    """Legitimate sessions a review stepped up after their sign-in (they pass it)."""
    legit_stepped_up_outside_attacks: int = 0
    """Those of them signed in while no attack's password attempts ran."""
    legit_stepped_up_away_from_attacks: int = 0
    """Those of them signed in away from every attack."""
    legit_verified: int = 0
    """Legitimate right passwords at an unfamiliar place and client asked a step-up by
    ``[verify]`` alone (no wave): asked whether or not an attack runs, so not in the
    ``challenged_outside_attacks`` figures, which look for waves ordinary traffic raised."""
    legit_people: int = 0
    """Distinct legitimate actors (people) with an attempt in the run (its history, the
    warm start's past, left out)."""
    legit_people_challenged: int = 0
    """Those of them who met a challenge in the run (a CAPTCHA, or a step-up after a
    right password) at least once: friction counted per person, not per attempt."""
    legit_known_people: int = 0
    """The run's people who signed in during its history (known to the deployment)."""
    legit_known_people_challenged: int = 0
    """Those of them challenged at least once in the run."""
    wave_answers: list[dict[str, Any]] = field(default_factory=list)
    """Per attacker (scenario, cohort, tenant): seconds from its first attempt until a wave
    challenge was in force (``pipeline.sim.waves.answers``)."""

    @property
    def all_caught(self) -> bool:
        """No attack missed (each was at least detected); says nothing about stopping it."""
        return all(a.status != MISSED for a in self.attacks)

    @property
    def takeovers(self) -> int:
        return sum(a.successes_allowed for a in self.attacks)

    def closing_line(self) -> str:
        """One honest sentence: how many attacks were stopped, slowed, only detected, missed."""
        counts = Counter(a.status for a in self.attacks)
        total = len(self.attacks)
        allowed = sum(a.allowed for a in self.attacks)
        if counts[STOPPED] == total and not self.takeovers:
            head = f"{total} of {total} attacks stopped, no account taken over"
        else:
            parts = [f"{counts[s]} {s.replace('_', ' ')}" for s in STATUSES if counts[s]]
            head = f"{counts[STOPPED]} of {total} attacks stopped ({', '.join(parts)})"
            if self.takeovers:
                by = ", ".join(
                    f"{a.attack} {a.successes_allowed}" for a in self.attacks if a.successes_allowed
                )
                head += f"; {self.takeovers} ACCOUNT TAKEOVERS ({by})"
        return (
            f"{head}; {allowed:,} attacker attempts allowed; "
            f"{self.legit_refused_total} legitimate attempts refused"
        )

    @property
    def legit_refused_total(self) -> int:
        return sum(self.legit_refused.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "policy_version": self.policy_version,
            "events": self.events,
            "all_attacks_caught": self.all_caught,
            "status_counts": {s: sum(a.status == s for a in self.attacks) for s in STATUSES},
            "account_takeovers": self.takeovers,
            "summary": self.closing_line(),
            "attacks": [a.as_json() for a in self.attacks],
            "wave_answers": self.wave_answers,
            "legitimate": {
                "attempts": sum(self.legit_attempts.values()),
                "refused": self.legit_refused_total,
                "challenged": sum(self.legit_challenged.values()),
                "stepped_up_unfamiliar": self.legit_verified,
                "people": self.legit_people,
                "people_challenged": self.legit_people_challenged,
                "known_people": self.legit_known_people,
                "known_people_challenged": self.legit_known_people_challenged,
                "untrusted_during_waves": self.legit_untrusted_in_wave,
                "challenged_during_waves": self.legit_challenged_in_wave,
                "challenged_outside_attacks": self.legit_challenged_outside_attacks,
                "challenged_away_from_attacks": self.legit_challenged_away_from_attacks,
                "sessions_stepped_up_after_sign_in": self.legit_stepped_up_after_sign_in,
                "sessions_stepped_up_outside_attacks": self.legit_stepped_up_outside_attacks,
                "sessions_stepped_up_away_from_attacks": self.legit_stepped_up_away_from_attacks,
                "refused_by_design": {
                    cohort: {"refused": n, "why": self.legit_by_design_why.get(cohort, [])}
                    for cohort, n in sorted(self.legit_by_design.items())
                },
                "by_cohort": {
                    cohort: {
                        "attempts": n,
                        "refused": self.legit_refused.get(cohort, 0),
                        "challenged": self.legit_challenged.get(cohort, 0),
                    }
                    for cohort, n in sorted(self.legit_attempts.items())
                },
                "examples": self.legit_examples,
            },
            "decisions": {
                "blocks": self.blocks,
                "observes": self.observes,
                "tombstones": self.tombstones,
                "records_compacted_away": self.missing_decision_records,
            },
            "blocks_matching_no_attack": self.unmatched_blocks,
            "seed_holds_matching_no_attack": self.seed_holds_matching_no_attack,
            "alerts": {
                "total": sum(self.alerts_by_type.values()),
                "by_type": dict(sorted(self.alerts_by_type.items())),
            },
            "alerts_matching_no_attack": self.unmatched_alerts,
        }
