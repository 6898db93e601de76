"""The adaptive attackers of issue 44 (item 8): each walks around a tenant-wide count it
knows. None is in ``mixed``; ``--scenario adaptive`` selects them and the people of
``pipeline.sim.holdout_people.signs_in_again``.

Exits are residential proxies (``pipeline.sim.holdout.residential_addresses``), each with
one browser user agent; guesses come from a combo list with 2.5 % valid pairs for real
accounts of the main population (``pipeline.sim.holdout.combo_list``), unless said otherwise.
An attacker's own account is one it created (an identifier nobody else uses); its sign-ins
there are cohort ``attacker_own_account`` (no takeover). Attackers are role ``attacker``,
cohort ``attacker`` unless named, each labelled with its own scenario:

* ``static_exits``: 3 exits reused for the whole run (at most 3 h), 0.5 guesses/s in all;
* ``known_exits``: 10 exits, each first made a known place by one sign-in to the attacker's
  own account (in the 5 minutes before), then 0.55 guesses/s over them in turn, from 10 % to
  90 % of the run for at most 90 minutes; ``known_exits_fast`` the same at 3 guesses/s;
* ``campaign_long``: 20 proxies for the whole run (a 4 h or 24 h run makes a 4 h or 24 h
  campaign), 0.5 guesses/s; each proxy signs in to the attacker's own account before its
  first guess and after every ``CAMPAIGN_OWN_EVERY`` guesses;
* ``paced_under_floors``: each exit used once, for the whole run, at a pace drawn for each
  10 minutes between 0.02 and 0.07 guesses/s (under the 240 an hour the tenant-wide floors
  leave unanswered, docs/policy.md);
* ``junk_waves``: 10 exits made known like ``known_exits``, then 2.5 failures/s for made-up
  identifiers (``unknown_account``: no valid credential, the answer must be
  existence-blind) from 35 % of the run for at most 30 minutes: junk to raise a wave that
  falls on real people;
* ``captcha_cafe``: at 45 % of the run an attacker at a café's shared address (192.0.2.40)
  fails five CAPTCHAs on purpose (``flow = "challenge"``, ``challenge = "captcha"``); the
  café's people (role ``legit``) sign in there: regulars on their trusted laptops before and
  within the hour after it (cohort ``cafe_regular``), newcomers on new browsers within the
  hour after it, then a second factor (``cafe_newcomer``; the first mistypes once);
* ``retry_after_hit``: each exit used once, 2 guesses/s from 25 % of the run for at most
  30 minutes; after each valid hit the bot signs in to the account again from the same exit
  20 s later.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pipeline.sim.attacks import paced, word
from pipeline.sim.drafts import BROWSER_UAS, HOUR_MS, MINUTE_MS, Draft, Label, SimConfig
from pipeline.sim.holdout import (
    LEAK_DOMAINS,
    RESIDENTIAL_UAS,
    attempt,
    combo_list,
    residential_addresses,
    window,
)
from pipeline.sim.holdout_people import person, signs_in_again
from pipeline.sim.population import main_population

STATIC_EXITS = 3
STATIC_PER_S = 0.5
STATIC_LONGEST_MS = 3 * HOUR_MS
KNOWN_EXITS = 10
KNOWN_PER_S = 0.55
KNOWN_FAST_PER_S = 3.0
KNOWN_LONGEST_MS = 90 * MINUTE_MS
KNOWN_LEAD_MS = 5 * MINUTE_MS
"""How long before its guesses an attacker makes its exits known."""
CAMPAIGN_PROXIES = 20
CAMPAIGN_PER_S = 0.5
CAMPAIGN_OWN_EVERY = 5
UNDER_FLOORS_PER_S = (0.02, 0.07)
UNDER_FLOORS_STEP_MS = 10 * MINUTE_MS
JUNK_EXITS = 10
JUNK_PER_S = 2.5
JUNK_LONGEST_MS = 30 * MINUTE_MS
CAFE_ADDRESS = "192.0.2.40"
CAFE_CAPTCHAS = 5
CAFE_REGULARS = 6
CAFE_NEWCOMERS = 6
RETRY_PER_S = 2.0
RETRY_LONGEST_MS = 30 * MINUTE_MS
RETRY_AFTER_MS = 20_000

OWN = "attacker_own_account"
"""The cohort of an attacker's sign-ins to its own account (no takeover)."""
Exit = tuple[str, str]
"""(address, user agent): one proxy exit and the browser the bot shows there."""

# -- shared pieces -------------------------------------------------------------------------


def _exits(rng: random.Random, count: int) -> list[Exit]:
    return [(ip, rng.choice(RESIDENTIAL_UAS)) for ip in residential_addresses(rng, count)]


def _count(span: tuple[int, int], per_s: float) -> int:
    return max(1, round((span[1] - span[0]) * per_s / 1000))


def _own_account(rng: random.Random) -> str:
    """An account the attacker created: an identifier no population uses."""
    return f"{word(rng)}.{word(rng)}{rng.randrange(10**6):06d}.own@example.com"


def _sent(
    name: str, t: int, exit_: Exit, account: str, reason: str | None, cohort: str = "attacker"
) -> Draft:
    """An attacker's attempt from one exit: a guess, or ``attacker_own_account``'s sign-in."""
    ip, ua = exit_
    return Draft(
        t, attempt(account, ip, ua, reason), Label(name, "attacker", f"proxy:{ip}", cohort)
    )


def _in_turn(
    cfg: SimConfig, rng: random.Random, name: str, exits: list[Exit], times: list[int]
) -> list[Draft]:
    """One combo-list guess at each time, the exits taken in turn."""
    combos = combo_list(rng, main_population(cfg.rate_per_s), len(times))
    return [
        _sent(name, t, exits[k % len(exits)], *combo)
        for k, (t, combo) in enumerate(zip(times, combos, strict=True))
    ]


def _made_known(
    cfg: SimConfig, rng: random.Random, name: str, exits: list[Exit], t0: int
) -> list[Draft]:
    """One sign-in to the attacker's own account per exit, in the lead before ``t0``."""
    own = _own_account(rng)
    lead = min(KNOWN_LEAD_MS, t0 - cfg.start_ms)
    times = paced(rng, t0 - lead, t0, len(exits))
    return [_sent(name, t, e, own, None, OWN) for t, e in zip(times, exits, strict=True)]


def _known_exits(cfg: SimConfig, rng: random.Random, name: str, per_s: float) -> list[Draft]:
    span = window(cfg, 0.10, 0.90, KNOWN_LONGEST_MS)
    exits = _exits(rng, KNOWN_EXITS)
    known = _made_known(cfg, rng, name, exits, span[0])
    return known + _in_turn(cfg, rng, name, exits, paced(rng, *span, _count(span, per_s)))


# -- attackers -----------------------------------------------------------------------------


def static_exits(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    span = window(cfg, 0.0, 1.0, STATIC_LONGEST_MS)
    times = paced(rng, *span, _count(span, STATIC_PER_S))
    return _in_turn(cfg, rng, "static_exits", _exits(rng, STATIC_EXITS), times)


def known_exits(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    return _known_exits(cfg, rng, "known_exits", KNOWN_PER_S)


def known_exits_fast(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    return _known_exits(cfg, rng, "known_exits_fast", KNOWN_FAST_PER_S)


def campaign_long(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    name = "campaign_long"
    span = window(cfg, 0.0, 1.0, cfg.duration_ms)
    exits = _exits(rng, CAMPAIGN_PROXIES)
    own = _own_account(rng)
    guesses = _in_turn(cfg, rng, name, exits, paced(rng, *span, _count(span, CAMPAIGN_PER_S)))
    out = []
    for k, guess in enumerate(guesses):
        if k // CAMPAIGN_PROXIES % CAMPAIGN_OWN_EVERY == 0:  # its own account, then the guess
            out.append(_sent(name, guess.occurred_ms, exits[k % CAMPAIGN_PROXIES], own, None, OWN))
            guess = Draft(
                guess.occurred_ms + rng.randrange(1_000, 4_000), guess.fields, guess.label
            )
        out.append(guess)
    return out


def paced_under_floors(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    times: list[int] = []
    for t0 in range(cfg.start_ms, cfg.end_ms, UNDER_FLOORS_STEP_MS):
        step = (t0, min(t0 + UNDER_FLOORS_STEP_MS, cfg.end_ms))
        times += paced(rng, *step, round((step[1] - t0) * rng.uniform(*UNDER_FLOORS_PER_S) / 1000))
    return _in_turn(cfg, rng, "paced_under_floors", _exits(rng, len(times)), times)


def junk_waves(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    name = "junk_waves"
    span = window(cfg, 0.35, 0.85, JUNK_LONGEST_MS)
    exits = _exits(rng, JUNK_EXITS)
    out = _made_known(cfg, rng, name, exits, span[0])
    for k, t in enumerate(paced(rng, *span, _count(span, JUNK_PER_S))):
        junk = f"{word(rng)}{rng.choice('._')}{word(rng)}{rng.randrange(10_000)}"
        combo = (f"{junk}@{rng.choice(LEAK_DOMAINS)}", "unknown_account")
        out.append(_sent(name, t, exits[k % JUNK_EXITS], *combo))
    return out


def _cafe_visit(
    cfg: SimConfig, cohort: str, i: int, t: int, browser: tuple[str, str, bool]
) -> list[Draft]:
    """A café person's sign-in at ``t`` (then a second factor on an untrusted browser)."""
    user = person(cfg, cohort, i)
    device_id, ua, trusted = browser
    label = Label("captcha_cafe", "legit", user.actor, cohort)
    fields = attempt(
        user.account, CAFE_ADDRESS, ua, None, device_id=device_id, device_trusted=trusted
    )
    out = [Draft(t, fields, label)]
    if not trusted:
        out.append(Draft(t + 15_000, {**fields, "flow": "mfa"}, label))
    return out


def captcha_cafe(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    name = "captcha_cafe"
    t_attack = window(cfg, 0.45, 1.0, 0)[0]
    before = (window(cfg, 0.05, 1.0, 0)[0], t_attack)
    after = (
        t_attack + MINUTE_MS,
        max(min(cfg.end_ms, t_attack + HOUR_MS), t_attack + MINUTE_MS + 1),
    )
    label = Label(name, "attacker", f"attacker:{name}", "attacker")
    cookie = {"device_id": f"dev-{rng.getrandbits(48):012x}", "device_trusted": False}
    out = []
    t = t_attack
    for _ in range(CAFE_CAPTCHAS):
        account = f"{word(rng)}.{word(rng)}{rng.randrange(100)}@example.com"
        fields = attempt(
            account,
            CAFE_ADDRESS,
            BROWSER_UAS[1],
            "other",
            flow="challenge",
            challenge="captcha",
            **cookie,
        )
        out.append(Draft(t, fields, label))
        t += rng.randrange(15_000, 60_000)
    for i in range(CAFE_REGULARS):
        laptop = person(cfg, "cafe_regular", i).devices[0]
        browser = (laptop.device_id, laptop.user_agent, True)
        for t in (rng.randrange(*before), rng.randrange(*after)):
            out += _cafe_visit(cfg, "cafe_regular", i, t, browser)
    for i, t in enumerate(paced(rng, *after, CAFE_NEWCOMERS)):
        browser = (f"dev-new-{rng.getrandbits(48):012x}", rng.choice(BROWSER_UAS), False)
        visit = _cafe_visit(cfg, "cafe_newcomer", i, t, browser)
        if i == 0:  # a typo first
            typo = {**visit[0].fields, "outcome": "failure", "failure_reason": "bad_password"}
            out.append(Draft(t - rng.randrange(5_000, 15_000), typo, visit[0].label))
        out += visit
    return out


def retry_after_hit(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    name = "retry_after_hit"
    span = window(cfg, 0.25, 0.75, RETRY_LONGEST_MS)
    times = paced(rng, *span, _count(span, RETRY_PER_S))
    guesses = _in_turn(cfg, rng, name, _exits(rng, len(times)), times)
    retries = [
        Draft(g.occurred_ms + RETRY_AFTER_MS, g.fields, g.label)
        for g in guesses
        if g.fields["outcome"] == "success"
    ]
    return guesses + retries


ADAPTIVE_ATTACKS: dict[str, Callable[[SimConfig, random.Random], list[Draft]]] = {
    "static_exits": static_exits,
    "known_exits": known_exits,
    "known_exits_fast": known_exits_fast,
    "campaign_long": campaign_long,
    "paced_under_floors": paced_under_floors,
    "junk_waves": junk_waves,
    "captcha_cafe": captcha_cafe,
    "retry_after_hit": retry_after_hit,
}
ADAPTIVE_BUILDERS = {**ADAPTIVE_ATTACKS, "signs_in_again": signs_in_again}
"""The group ``adaptive``: the attacks above and the people who sign in again."""
