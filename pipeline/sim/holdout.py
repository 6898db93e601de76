"""The held-out shapes of issue 24, attackers: stuffing and spray through residential proxy
pools, an attacker with its own account, code guessing. None is in ``mixed``;
``--scenario holdout`` selects them and the people of ``pipeline.sim.holdout_people``.

Sizes are rates, not totals, so a short run stays small: the stuffing waves send
``STUFFING_PER_S`` attempts for at most 20 minutes (fewer in a shorter placement).
Proxy exits are residential: IPv4 in 240.0.0.0/4 (reserved, so no exit is ever an address
of another population) and IPv6 in 3fff::/20 (RFC 9637), each IPv6 exit in a /64 of its own;
a third of them IPv6, each with a browser user agent. Combo lists hold ``VALID_SHARE`` valid
pairs for real accounts of the main population (``success``), ``WRONG_SHARE`` real accounts
with another site's password (``bad_password``) and identifiers of other sites
(``unknown_account``).

Attackers (role ``attacker``; cohort ``attacker`` unless named):

* ``stuffing_pool_once``: each exit used once, 7 attempts/s for 20 minutes;
* ``stuffing_pool_twice``: the same, two tries per exit, seconds apart;
* ``stuffing_bursts``: the same pool and combo list, each exit used once, sent by an
  attacker who knows the wave's 1-minute hold (``[wave] hold_ms``): bursts of
  ``BURST_S`` seconds at ``STUFFING_PER_S`` attempts/s, each followed by a pause of
  ``PAUSE_S`` seconds, until it has sent as many attempts as ``stuffing_pool_once``
  (from 5 % to 95 % of the run, so fewer in a short one);
* ``stuffing_paced``: the same pool and combo list, each exit used once, paced at
  ``PACED_PER_S`` attempts/s (a third of rule 8's paced sum, 40 accounts a minute) from
  10 % to 90 % of the run for at most ``PACED_LONGEST_MS``: under every per-window count,
  so only the strangers tier (exits nobody signs in from after) answers it;
* ``spray_pool``: 300 exits, 1,500 harvested accounts (15 % unknown), two passwords, each
  exit trying each account at most once; 1.2 % of the real accounts per pass have the
  sprayed password (``success``, not tried again);
* ``stuffing_own_account``: 300 exits, each three rounds of three guesses then a sign-in
  to the stuffer's own real account (cohort ``attacker_own_account``), the first after a
  failure on it, to "redeem" the exit;
* ``second_wave``: a stuffing wave (cohort ``first_wave``), then 70-80 minutes after it a
  spray (``spray_wave``) and a second stuffing wave (``second_wave``); planned on 3 hours
  and compressed into shorter runs;
* ``mfa_code_guessing``: three accounts whose password the attacker has; each guess of a
  one-time code is a fresh sign-in (cohort ``attacker_first_factor``) with a fresh device
  cookie, then the code (``flow = "mfa"``, ``bad_second_factor``), 540 per account-hour
  from 24 rotating exits; each owner signs in four times from a trusted laptop.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable
from typing import Any

from pipeline.sim.attacks import failure, paced, spray_targets, word
from pipeline.sim.drafts import (
    BROWSER_UAS,
    HOUR_MS,
    MAIN_TENANT,
    MINUTE_MS,
    Draft,
    Label,
    SimConfig,
)
from pipeline.sim.population import (
    default_account,
    ipv4,
    main_population,
    make_user,
)

RESIDENTIAL_V4_BASE = 240 << 24  # 240.0.0.0/4
RESIDENTIAL_V4_SIZE = 1 << 28
RESIDENTIAL_V6 = 0x3FFF << 112  # 3fff::/20; a /64 is 44 bits below it
RESIDENTIAL_V6_SHARE = 0.35
RESIDENTIAL_UAS = (
    *BROWSER_UAS,
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/127.0 Safari/537.36 Edg/127.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/125.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/127.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 14; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Mobile Safari/537.36",
    "Mozilla/5.0 (Linux; Android 13; Pixel 7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/127.0 Mobile Safari/537.36",
    "Mozilla/5.0 (X11; Ubuntu; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14.5; rv:127.0) Gecko/20100101 Firefox/127.0",
)
LEAK_DOMAINS = ("mail.example", "post.example", "inbox.example", "webmail.example")

STUFFING_PER_S = 7
PACED_PER_S = 0.25
PACED_LONGEST_MS = 2 * HOUR_MS
STUFFING_LONGEST_MS = 20 * MINUTE_MS
BURST_S = (20, 40)
PAUSE_S = (90, 240)
"""``stuffing_bursts``: each burst's length and each pause's, seconds, uniform."""
VALID_SHARE = 0.025
WRONG_SHARE = 0.15
SPRAY_SOURCES = 300
SPRAY_ACCOUNTS = 1500
SPRAY_UNKNOWN_SHARE = 0.15
SPRAY_HIT_SHARE = 0.012
OWN_SOURCES = 300
OWN_ROUNDS = 3
OWN_GUESSES = 3
WAVE_PLAN_MS = 3 * HOUR_MS
WAVES_MIN = {"first": (10, 30), "spray": (100, 130), "second": (110, 130)}
"""The second wave's plan in minutes of a 3 h run, scaled down for shorter ones."""
MFA_ACCOUNTS = 3
MFA_GUESSES_PER_HOUR = 540
MFA_SOURCES = 24

# -- shared pieces -------------------------------------------------------------------------


def window(cfg: SimConfig, first: float, last: float, longest_ms: int) -> tuple[int, int]:
    """From ``first`` of the run to ``last`` of it, at most ``longest_ms``."""
    t0 = cfg.start_ms + int(cfg.duration_ms * first)
    return t0, min(cfg.start_ms + int(cfg.duration_ms * last), t0 + longest_ms)


def residential_addresses(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct proxy exits, a third IPv6 (each in a /64 of its own), shuffled."""
    v6 = round(count * RESIDENTIAL_V6_SHARE)
    offsets = rng.sample(range(1, RESIDENTIAL_V4_SIZE - 1), count - v6)  # not 255.255.255.255
    out = [ipv4(RESIDENTIAL_V4_BASE + offset) for offset in offsets]
    out += [
        str(ipaddress.IPv6Address(RESIDENTIAL_V6 | prefix << 64 | rng.getrandbits(64)))
        for prefix in rng.sample(range(1 << 44), v6)
    ]
    rng.shuffle(out)
    return out


def attempt(account: str, ip: str, ua: str, reason: str | None, **extra: Any) -> dict[str, Any]:
    """A main-tenant login: a failure for ``reason``, a success when it is None."""
    fields = failure(MAIN_TENANT, account, ip, ua, reason or "other", **extra)
    if reason is None:
        del fields["failure_reason"]
        fields["outcome"] = "success"
    return fields


def combo_list(rng: random.Random, population: int, count: int) -> list[tuple[str, str | None]]:
    """(identifier, failure reason or None for a valid pair), shuffled."""
    real = rng.sample(
        range(population), min(round(count * (VALID_SHARE + WRONG_SHARE)), population)
    )
    valid = round(count * VALID_SHARE)
    combos = [
        (default_account(i), None if k < valid else "bad_password") for k, i in enumerate(real)
    ]
    combos += [
        (
            f"{word(rng)}{rng.choice('._')}{word(rng)}{rng.randrange(10_000)}@{rng.choice(LEAK_DOMAINS)}",
            "unknown_account",
        )
        for _ in range(count - len(combos))
    ]
    rng.shuffle(combos)
    return combos


def _stuffing(
    cfg: SimConfig, rng: random.Random, name: str, cohort: str, span: tuple[int, int], tries: int
) -> list[Draft]:
    """``STUFFING_PER_S`` attempts over ``span``, ``tries`` per exit, seconds apart."""
    t0, t1 = span
    exits = max(1, (t1 - t0) * STUFFING_PER_S // 1000 // tries)
    combos = iter(combo_list(rng, main_population(cfg.rate_per_s), exits * tries))
    out = []
    for t, ip in zip(paced(rng, t0, t1, exits), residential_addresses(rng, exits), strict=True):
        label = Label(name, "attacker", f"proxy:{ip}", cohort)
        ua = rng.choice(RESIDENTIAL_UAS)
        for _ in range(tries):
            account, reason = next(combos)
            out.append(Draft(t, attempt(account, ip, ua, reason), label))
            t += rng.randrange(1_500, 6_000)
    return out


def _spray(
    cfg: SimConfig, rng: random.Random, name: str, cohort: str, span: tuple[int, int]
) -> list[Draft]:
    """Two passwords over a harvested list from ``SPRAY_SOURCES`` exits; hits not retried."""
    population = main_population(cfg.rate_per_s)
    targets = spray_targets(
        rng, population, SPRAY_ACCOUNTS, default_account, SPRAY_UNKNOWN_SHARE, "example.com"
    )
    per_pass = round(sum(r == "bad_password" for _, r in targets) * SPRAY_HIT_SHARE)
    hits = rng.sample([a for a, r in targets if r == "bad_password"], 2 * per_pass)
    sources = residential_addresses(rng, SPRAY_SOURCES)
    uas = {ip: rng.choice(RESIDENTIAL_UAS) for ip in sources}
    plan: list[tuple[str, str, str | None]] = []
    exit_of: dict[str, int] = {}  # the first pass's exit of each account
    for n in range(2):
        won, done = set(hits[n * per_pass : (n + 1) * per_pass]), set(hits[: n * per_pass])
        order = [(a, None if a in won else r) for a, r in targets if a not in done]
        rng.shuffle(order)
        for j, (account, reason) in enumerate(order):
            # the second pass meets each account at another exit, each exit as busy
            k = exit_of.setdefault(account, j % len(sources)) + n * len(sources) // 2
            plan.append((sources[k % len(sources)], account, reason))
    out = []
    for t, (ip, account, reason) in zip(paced(rng, *span, len(plan)), plan, strict=True):
        label = Label(name, "attacker", f"proxy:{ip}", cohort)
        out.append(Draft(t, attempt(account, ip, uas[ip], reason), label))
    return out


# -- attackers -----------------------------------------------------------------------------


def stuffing_pool_once(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    span = window(cfg, 0.30, 0.65, STUFFING_LONGEST_MS)
    return _stuffing(cfg, rng, "stuffing_pool_once", "attacker", span, 1)


def stuffing_pool_twice(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    span = window(cfg, 0.35, 0.70, STUFFING_LONGEST_MS)
    return _stuffing(cfg, rng, "stuffing_pool_twice", "attacker", span, 2)


def stuffing_bursts(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    name = "stuffing_bursts"
    t0, t1 = window(cfg, 0.30, 0.65, STUFFING_LONGEST_MS)
    total = (t1 - t0) * STUFFING_PER_S // 1000  # stuffing_pool_once's attempts
    start, end = window(cfg, 0.05, 0.95, cfg.duration_ms)
    times: list[int] = []
    while start < end and len(times) < total:
        n = min(rng.randint(*BURST_S) * STUFFING_PER_S, total - len(times))
        length = n * 1000 // STUFFING_PER_S  # the last burst may be shorter
        times += [t for t in paced(rng, start, start + length, n) if t < end]
        start += length + rng.randint(*PAUSE_S) * 1000
    combos = combo_list(rng, main_population(cfg.rate_per_s), len(times))
    out = []
    for t, ip, (account, reason) in zip(
        times, residential_addresses(rng, len(times)), combos, strict=True
    ):
        label = Label(name, "attacker", f"proxy:{ip}", "attacker")
        out.append(Draft(t, attempt(account, ip, rng.choice(RESIDENTIAL_UAS), reason), label))
    return out


def stuffing_paced(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = window(cfg, 0.10, 0.90, PACED_LONGEST_MS)
    total = max(1, int((t1 - t0) * PACED_PER_S) // 1000)
    combos = combo_list(rng, main_population(cfg.rate_per_s), total)
    out = []
    for t, ip, (account, reason) in zip(
        paced(rng, t0, t1, total), residential_addresses(rng, total), combos, strict=True
    ):
        label = Label("stuffing_paced", "attacker", f"proxy:{ip}", "attacker")
        out.append(Draft(t, attempt(account, ip, rng.choice(RESIDENTIAL_UAS), reason), label))
    return out


def spray_pool(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    return _spray(cfg, rng, "spray_pool", "attacker", window(cfg, 0.25, 0.75, 30 * MINUTE_MS))


def stuffing_own_account(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    name = "stuffing_own_account"
    t0, t1 = window(cfg, 0.40, 0.75, STUFFING_LONGEST_MS)
    own = f"{word(rng)}.{word(rng)}{rng.randrange(10**6):06d}@example.com"
    combos = iter(
        combo_list(rng, main_population(cfg.rate_per_s), OWN_SOURCES * OWN_ROUNDS * OWN_GUESSES)
    )
    out = []
    starts = paced(rng, t0, t1, OWN_SOURCES)
    for t, ip in zip(starts, residential_addresses(rng, OWN_SOURCES), strict=True):
        guess = Label(name, "attacker", f"proxy:{ip}", "attacker")
        mine = Label(name, "attacker", f"proxy:{ip}", "attacker_own_account")
        ua = rng.choice(RESIDENTIAL_UAS)
        for n in range(OWN_ROUNDS):
            for _ in range(OWN_GUESSES):
                account, reason = next(combos)
                out.append(Draft(t, attempt(account, ip, ua, reason), guess))
                t += rng.randrange(2_000, 6_000)
            if n == 0:  # fail-then-success on its own account
                out.append(Draft(t, attempt(own, ip, ua, "bad_password"), mine))
                t += rng.randrange(3_000, 8_000)
            out.append(Draft(t, attempt(own, ip, ua, None), mine))
            t += rng.randrange(2_000, 6_000)
    return out


def second_wave(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    name = "second_wave"
    scale = min(1.0, cfg.duration_ms / WAVE_PLAN_MS)

    def span(part: str) -> tuple[int, int]:
        first, last = WAVES_MIN[part]
        return cfg.start_ms + int(first * MINUTE_MS * scale), cfg.start_ms + int(
            last * MINUTE_MS * scale
        )

    return [
        *_stuffing(cfg, rng, name, "first_wave", span("first"), 1),
        *_spray(cfg, rng, name, "spray_wave", span("spray")),
        *_stuffing(cfg, rng, name, "second_wave", span("second"), 1),
    ]


def mfa_code_guessing(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    name = "mfa_code_guessing"
    t0, t1 = window(cfg, 0.15, 0.85, HOUR_MS)
    guesses = max(1, round((t1 - t0) / HOUR_MS * MFA_GUESSES_PER_HOUR))
    out = []
    for k in range(MFA_ACCOUNTS):
        owner = make_user(cfg.seed, MAIN_TENANT, f"victim-{name}-{k}", 0)
        account = f"victim.{name}.{k}@example.com"
        sources = residential_addresses(rng, MFA_SOURCES)
        first = Label(name, "attacker", f"attacker:{name}", "attacker_first_factor")
        code = Label(name, "attacker", f"attacker:{name}", "attacker")
        for j, t in enumerate(paced(rng, t0, t1, guesses)):
            cookie = f"dev-{rng.getrandbits(48):012x}"
            ip, ua = sources[j % MFA_SOURCES], RESIDENTIAL_UAS[j % len(RESIDENTIAL_UAS)]
            signed_in = attempt(account, ip, ua, None, device_id=cookie, device_trusted=False)
            out.append(Draft(t, signed_in, first))
            guess = {**signed_in, "flow": "mfa", "outcome": "failure"}
            guess["failure_reason"] = "bad_second_factor"
            out.append(Draft(t + rng.randrange(1_500, 4_000), guess, code))
        laptop = owner.devices[0]
        label = Label(name, "owner", f"owner:{name}:{k}", "owner_trusted_device")
        trusted = {"device_id": laptop.device_id, "device_trusted": True}
        out.extend(
            Draft(t, attempt(account, owner.home_v4, laptop.user_agent, None, **trusted), label)
            for t in paced(rng, t0, t1, 4)
        )
    return out


HOLDOUT_ATTACKS: dict[str, Callable[[SimConfig, random.Random], list[Draft]]] = {
    "stuffing_pool_once": stuffing_pool_once,
    "stuffing_pool_twice": stuffing_pool_twice,
    "stuffing_bursts": stuffing_bursts,
    "stuffing_paced": stuffing_paced,
    "spray_pool": spray_pool,
    "stuffing_own_account": stuffing_own_account,
    "second_wave": second_wave,
    "mfa_code_guessing": mfa_code_guessing,
}
