"""The attacks: one generator per scenario, each a fixed-size list of drafts placed on the
run's timeline by ``PLACEMENT`` (see ``pipeline.sim.scenarios`` for what each does)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

from pipeline.sim.drafts import (
    BROWSER_UAS,
    MAIN_TENANT,
    PHONE_UAS,
    SMALL_TENANT,
    Draft,
    Label,
    SimConfig,
)
from pipeline.sim.population import (
    MOBILE_V4_BASE,
    MOBILE_V4_SIZE,
    SHAPE,
    Device,
    User,
    acme_account,
    default_account,
    ipv4,
    main_population,
    make_user,
    pool_addresses,
)

PLACEMENT: dict[str, tuple[float, float]] = {
    "brute_force": (0.05, 0.35),
    "distributed_brute_force": (0.10, 0.55),
    "spray": (0.20, 0.55),
    "low_and_slow_spray": (0.05, 0.95),
    "credential_stuffing": (0.35, 0.70),
    "lockout_dos": (0.45, 0.90),
    "uia_bruteforce": (0.55, 0.90),
    "low_and_slow_bruteforce": (0.0, 1.0),
    "low_and_slow_bruteforce_rotating": (0.0, 1.0),
}
"""(start, end) of each attack as fractions of the run."""
SLOW_SINGLE_EVERY_MS = 4 * 60 * 1000
SLOW_ROTATING_EVERY_MS = 20 * 1000
SLOW_ROTATING_SOURCES = 13

# -- attacks ------------------------------------------------------------------------------


def _span(cfg: SimConfig, name: str) -> tuple[int, int]:
    first, last = PLACEMENT[name]
    return cfg.start_ms + int(cfg.duration_ms * first), cfg.start_ms + int(cfg.duration_ms * last)


def paced(rng: random.Random, t0: int, t1: int, n: int) -> list[int]:
    """``n`` times evenly paced over [t0, t1) with jitter, in order."""
    step = (t1 - t0) / max(n, 1)
    return [int(t0 + (i + rng.random()) * step) for i in range(n)]


def failure(
    tenant: str, account: str, ip: str, ua: str, reason: str = "bad_password", **extra: Any
) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "service": "web-login",
        "flow": "login",
        "account": account,
        "peer_ip": ip,
        "outcome": "failure",
        "failure_reason": reason,
        "user_agent": ua,
        **extra,
    }


def _owner_logins(
    scenario: str, user: User, device: Device, times: Iterable[int], *, typo_at: int = -1
) -> list[Draft]:
    """The victim signing in from a trusted device (one typo before login ``typo_at``)."""
    label = Label(scenario, "owner", f"owner:{scenario}", "owner_trusted_device")
    base = {
        "tenant": user.tenant,
        "service": "web-login",
        "flow": "login",
        "account": user.account,
        "peer_ip": user.home_v4,
        "device_id": device.device_id,
        "device_trusted": True,
        "user_agent": device.user_agent,
    }
    out: list[Draft] = []
    for i, t in enumerate(times):
        if i == typo_at:
            out.append(
                Draft(
                    t - 9_000,
                    {**base, "outcome": "failure", "failure_reason": "bad_password"},
                    label,
                )
            )
        out.append(Draft(t, {**base, "outcome": "success"}, label))
    return out


def _victim(cfg: SimConfig, scenario: str) -> User:
    user = make_user(cfg.seed, MAIN_TENANT, f"victim-{scenario}", 0)
    return User(
        tenant=user.tenant,
        account=f"victim.{scenario}@example.com",
        actor=f"owner:{scenario}",
        cohort="owner_trusted_device",
        home_v4=user.home_v4,
        v6_prefix=None,
        devices=user.devices,
    )


def brute_force(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "brute_force")
    account = "victim.brute_force@example.com"
    label = Label("brute_force", "attacker", "attacker:brute_force", "attacker")
    fields = failure(MAIN_TENANT, account, "203.0.113.7", "python-requests/2.31.0")
    return [Draft(t, fields, label) for t in paced(rng, t0, t1, 240)]


def distributed_brute_force(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "distributed_brute_force")
    victim = _victim(cfg, "distributed_brute_force")
    tries = [(ip, k) for ip in pool_addresses(0, 1200, rng) for k in range(1 + rng.randrange(3))]
    rng.shuffle(tries)
    out = []
    for t, (ip, _) in zip(paced(rng, t0, t1, len(tries)), tries, strict=True):
        label = Label("distributed_brute_force", "attacker", f"bot:{ip}", "attacker")
        out.append(
            Draft(t, failure(MAIN_TENANT, victim.account, ip, BROWSER_UAS[len(ip) % 4]), label)
        )
    out.extend(
        _owner_logins("distributed_brute_force", victim, victim.devices[0], paced(rng, t0, t1, 6))
    )
    return out


def spray_targets(
    rng: random.Random,
    population: int,
    count: int,
    account: Callable[[int], str],
    unknown_share: float,
    domain: str,
) -> list[tuple[str, str]]:
    """(account, failure reason): a harvested list, partly of accounts that do not exist."""
    known = min(round(count * (1 - unknown_share)), population)
    targets = [(account(i), "bad_password") for i in rng.sample(range(population), known)]
    targets += [
        (f"{word(rng)}.{word(rng)}{rng.randrange(100)}@{domain}", "unknown_account")
        for _ in range(count - known)
    ]
    rng.shuffle(targets)
    return targets


_SYLLABLES = (
    "an",
    "bel",
    "cor",
    "da",
    "el",
    "fin",
    "gar",
    "hol",
    "in",
    "jo",
    "ka",
    "lin",
    "mar",
    "no",
    "or",
    "pet",
    "ra",
    "sam",
    "tor",
    "ul",
    "vin",
    "wes",
    "yan",
    "zo",
)


def word(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(2 + rng.randrange(2)))


def spray(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "spray")
    population = main_population(cfg.rate_per_s)
    targets = spray_targets(rng, population, 3000, default_account, 0.10, "example.com")
    label = Label("spray", "attacker", "attacker:spray", "attacker")
    attempts = [target for _ in range(2) for target in targets]  # two passwords, in passes
    out = []
    for t, (account, reason) in zip(paced(rng, t0, t1, len(attempts)), attempts, strict=True):
        out.append(
            Draft(t, failure(MAIN_TENANT, account, "203.0.113.50", BROWSER_UAS[2], reason), label)
        )
    return out


def low_and_slow_spray(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "low_and_slow_spray")
    targets = spray_targets(rng, SHAPE.small_tenant_users, 1500, acme_account, 0.15, "acme.example")
    sources = pool_addresses(1, 150, rng)
    plan: list[tuple[str, str, str]] = []
    for shift in (0, len(sources) // 2):  # two passwords; each address gets 10 per pass
        order = targets[:]
        rng.shuffle(order)
        plan.extend(
            (sources[(j + shift) % len(sources)], *target) for j, target in enumerate(order)
        )
    out = []
    for t, (ip, account, reason) in zip(paced(rng, t0, t1, len(plan)), plan, strict=True):
        label = Label("low_and_slow_spray", "attacker", f"bot:{ip}", "attacker")
        out.append(Draft(t, failure(SMALL_TENANT, account, ip, BROWSER_UAS[0], reason), label))
    return out


def credential_stuffing(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "credential_stuffing")
    population = main_population(cfg.rate_per_s)
    sources = pool_addresses(2, 60, rng)
    out = []
    for i, t in enumerate(paced(rng, t0, t1, 4200)):
        ip = sources[i % len(sources)]
        label = Label("credential_stuffing", "attacker", f"proxy:{ip}", "attacker")
        ua = BROWSER_UAS[rng.randrange(4)]
        if rng.random() < 0.88:
            account = f"{word(rng)}{rng.randrange(10_000)}@mail.example"
            fields = failure(MAIN_TENANT, account, ip, ua, "unknown_account")
        else:
            fields = failure(MAIN_TENANT, default_account(rng.randrange(population)), ip, ua)
            if rng.random() < 0.03:  # a reused password: the pair is valid here too
                fields = {**fields, "outcome": "success"}
                del fields["failure_reason"]
        out.append(Draft(t, fields, label))
    return out


def lockout_dos(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "lockout_dos")
    victim = _victim(cfg, "lockout_dos")
    label = Label("lockout_dos", "attacker", "attacker:lockout_dos", "attacker")
    fields = failure(MAIN_TENANT, victim.account, "203.0.113.66", "curl/8.5.0")
    out = [Draft(t, fields, label) for t in paced(rng, t0, t1, 400)]
    out.extend(
        _owner_logins("lockout_dos", victim, victim.devices[0], paced(rng, t0, t1, 10), typo_at=4)
    )
    # A second owner with no trusted device: the lock holds them too (seed 002's cost,
    # capped at an hour); the notice topic mails them the way out (seed 001).
    other = make_user(cfg.seed, MAIN_TENANT, "victim-lockout_dos-untrusted", 0)
    account = "victim.lockout_dos.untrusted@example.com"
    fields = failure(MAIN_TENANT, account, "203.0.113.67", "curl/8.5.0")
    out.extend(Draft(t, fields, label) for t in paced(rng, t0, t1, 400))
    owner = Label(
        "lockout_dos", "owner", "owner:lockout_dos:untrusted", "owner_without_trusted_device"
    )
    base = {
        "tenant": MAIN_TENANT,
        "service": "web-login",
        "flow": "login",
        "account": account,
        "peer_ip": other.home_v4,
        "user_agent": BROWSER_UAS[1],
        "outcome": "success",
    }
    out.extend(Draft(t, base, owner) for t in paced(rng, t0, t1, 10))
    return out


def _every(t0: int, t1: int, every_ms: int) -> range:
    return range(t0 + every_ms // 2, t1, every_ms)


def low_and_slow_bruteforce(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    """One address guessing one account every 4 minutes: under every window's threshold."""
    t0, t1 = _span(cfg, "low_and_slow_bruteforce")
    account = "victim.low_and_slow_bruteforce@example.com"
    label = Label(
        "low_and_slow_bruteforce", "attacker", "attacker:low_and_slow_bruteforce", "attacker"
    )
    fields = failure(MAIN_TENANT, account, "203.0.113.24", "python-requests/2.31.0")
    return [Draft(t, fields, label) for t in _every(t0, t1, SLOW_SINGLE_EVERY_MS)]


def low_and_slow_bruteforce_rotating(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    """13 addresses taking turns on one account, one guess every 20 s in all."""
    name = "low_and_slow_bruteforce_rotating"
    t0, t1 = _span(cfg, name)
    account = f"victim.{name}@example.com"
    sources = pool_addresses(3, SLOW_ROTATING_SOURCES, rng)
    out = []
    for i, t in enumerate(_every(t0, t1, SLOW_ROTATING_EVERY_MS)):
        ip = sources[i % len(sources)]
        label = Label(name, "attacker", f"bot:{ip}", "attacker")
        out.append(Draft(t, failure(MAIN_TENANT, account, ip, BROWSER_UAS[3]), label))
    return out


def uia_bruteforce(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "uia_bruteforce")
    victim = _victim(cfg, "uia_bruteforce")
    laptop = victim.devices[0]
    stolen = f"sess-{rng.getrandbits(64):016x}"
    thief = Label("uia_bruteforce", "attacker", "attacker:uia_bruteforce", "attacker")
    out = [
        Draft(
            t,
            {
                "tenant": MAIN_TENANT,
                "service": "web-login",
                "flow": "uia",
                "account": victim.account,
                "peer_ip": "203.0.113.99",
                "device_id": laptop.device_id,
                "device_trusted": True,
                "session_id": stolen,
                "outcome": "failure",
                "failure_reason": "bad_password",
                "user_agent": laptop.user_agent,
            },
            thief,
        )
        for t in paced(rng, t0, t1, 60)
    ]
    phone = Device(f"{laptop.device_id[:-2]}-1", "phone", PHONE_UAS[0])
    owner = Label("uia_bruteforce", "owner", "owner:uia_bruteforce", "owner_trusted_device")
    own_session = f"sess-{rng.getrandbits(64):016x}"
    base = {
        "tenant": MAIN_TENANT,
        "service": "mobile-api",
        "account": victim.account,
        "peer_ip": ipv4(MOBILE_V4_BASE + rng.randrange(MOBILE_V4_SIZE)),
        "device_id": phone.device_id,
        "device_trusted": True,
        "user_agent": phone.user_agent,
    }
    out.append(Draft(t0, {**base, "flow": "login", "outcome": "success"}, owner))
    for t in paced(rng, t0 + 1, t1, 8):
        out.append(
            Draft(
                t, {**base, "flow": "uia", "session_id": own_session, "outcome": "success"}, owner
            )
        )
    return out


ATTACK_BUILDERS: dict[str, Callable[[SimConfig, random.Random], list[Draft]]] = {
    "brute_force": brute_force,
    "distributed_brute_force": distributed_brute_force,
    "spray": spray,
    "low_and_slow_spray": low_and_slow_spray,
    "credential_stuffing": credential_stuffing,
    "lockout_dos": lockout_dos,
    "uia_bruteforce": uia_bruteforce,
    "low_and_slow_bruteforce": low_and_slow_bruteforce,
    "low_and_slow_bruteforce_rotating": low_and_slow_bruteforce_rotating,
}
