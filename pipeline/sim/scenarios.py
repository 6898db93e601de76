"""Deterministic scenario generators: ordinary users and seven attacks, with ground truth.

Everything is derived from the seed: each stream has its own ``random.Random`` seeded
with ``"<seed>/<stream>"`` (string seeds are hashed with SHA-512, so stable across
processes), and per-user attributes come from a BLAKE2b digest of (seed, tenant, user).
The same ``SimConfig`` always yields the same events, ids and labels.

Time is simulated event time: ``occurred_ms`` runs from ``start_ms`` for ``duration_ms``.
``rate_per_s`` is the events per simulated second of ordinary traffic in the main tenant;
the office, the small tenant and the attacks come on top at their own fixed sizes.

The simulator models no gateway enforcement (see ``pipeline.sim``): every attempt
reaches the login service, and nothing is ever ``failure_reason = "refused"``.

Address plan (all synthetic): home IPv4 in 198.18.0.0/15, mobile carrier NAT in
172.16.0.0/12, home IPv6 in 2001:db8::/32 (one /64 per household, a new interface id
per login), the office NAT 192.0.2.10, single attackers in 203.0.113.0/24, botnets and
proxies in 100.64.0.0/10.

Scenarios (sizes fixed, placed on the timeline by ``PLACEMENT`` as fractions of the run):

* ``baseline``: tenant ``default`` users (a few logins per user per hour) with one to
  three trusted devices, a new untrusted browser in 10 % of sessions (then a second
  factor), typos (6 % of logins; after a third failure the user resets the password via
  the ``recovery`` flow), mistyped usernames (1 %), capitalised identifiers from phone
  keyboards, 30 % of households on IPv6 rotating within their /64, re-auth prompts
  (``uia``) inside live sessions, and after half of the resets a phone app that keeps the old
  password and retries it (``token`` flow, changing carrier addresses, every 40-90 s for
  10-30 min: under the ceiling of 50, over a ceiling of 10); 300 colleagues behind one office NAT address; and a
  small tenant ``acme`` (3,000 users) with the same habits;
* ``brute_force``: one address, one account, 240 guesses;
* ``distributed_brute_force``: 1,200 addresses, one account, one to three guesses each,
  while the owner keeps signing in from a trusted device;
* ``spray``: one address, 3,000 accounts (10 % unknown), two passwords;
* ``low_and_slow_spray``: 150 addresses, 1,500 accounts of tenant ``acme``, two
  passwords; at most 20 attempts and 20 accounts per address and two attempts per
  account: under every per-source and per-account threshold, for ``spray_tenant``;
* ``credential_stuffing``: 60 proxy addresses, 4,200 leaked pairs, 88 % of them for
  accounts that do not exist (``unknown_account``), 3 % of the rest succeed;
* ``lockout_dos``: a stranger fails 400 times against a victim who keeps signing in
  from a trusted device (with one typo there), and as often against a second owner who
  has no trusted device: the seed 002 lock refuses that owner too (capped at an hour;
  cohort ``owner_without_trusted_device``, classed "refused by design"), and the notice
  topic
  carries the owner's way out (seed 001's unlock mail);
* ``low_and_slow_bruteforce``: one address, one account, one guess every 4 minutes for
  the whole run (360 in 24 h): under every window;
* ``low_and_slow_bruteforce_rotating``: another account, 13 rotating addresses, one
  guess every 20 s for the whole run (4,320 in 24 h), each address under every window.
* ``uia_bruteforce``: a thief holding the victim's laptop session guesses 60 times via
  re-auth while the owner keeps working on the phone.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.contracts.models import format_utc_ms, ms_to_datetime
from pipeline.errors import AuthpipeError

Role = Literal["attacker", "owner", "legit"]

BASELINE = "baseline"
ATTACKS = (
    "brute_force",
    "distributed_brute_force",
    "spray",
    "low_and_slow_spray",
    "credential_stuffing",
    "lockout_dos",
    "uia_bruteforce",
)
SLOW_ATTACKS = ("low_and_slow_bruteforce", "low_and_slow_bruteforce_rotating")
"""Paced in absolute time (a guess every 4 min, every 20 s), so they mean something only
in runs of hours (``--duration-s 86400``): named explicitly, not part of ``mixed``."""
MIXED_SCENARIOS = (BASELINE, *ATTACKS)
SCENARIOS = (*MIXED_SCENARIOS, *SLOW_ATTACKS)
MIXED = "mixed"

MAIN_TENANT = "default"
SMALL_TENANT = "acme"

SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS

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
SLOW_SINGLE_EVERY_MS = 4 * 60 * 1000
SLOW_ROTATING_EVERY_MS = 20 * 1000
SLOW_ROTATING_SOURCES = 13
"""(start, end) of each attack as fractions of the run."""

BROWSER_UAS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15",
    "Mozilla/5.0 (X11; Linux x86_64; rv:127.0) Gecko/20100101 Firefox/127.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:127.0) Gecko/20100101 Firefox/127.0",
)
PHONE_UAS = (
    "ExampleApp/8.4 (iPhone; iOS 17.5)",
    "ExampleApp/8.4 (Android 14; Pixel 8)",
)


class ScenarioError(AuthpipeError):
    """An unknown scenario name or an impossible simulation config."""


@dataclass(frozen=True, slots=True)
class Label:
    """Ground truth of one event: who sent it and why."""

    scenario: str
    role: Role
    actor: str
    cohort: str


@dataclass(frozen=True, slots=True)
class Draft:
    """An event before it gets its id: wire fields minus ``event_id`` and ``occurred_at``."""

    occurred_ms: int
    fields: dict[str, Any]
    label: Label


@dataclass(frozen=True, slots=True)
class SimEvent:
    """One simulated event: the wire object (schema ``login_attempt`` v1) and its label."""

    event_id: str
    occurred_ms: int
    wire: dict[str, Any]
    label: Label

    def truth_row(self) -> dict[str, Any]:
        """The ground-truth line: labels plus the event itself (the scorecard needs both)."""
        return {
            "event_id": self.event_id,
            "scenario": self.label.scenario,
            "role": self.label.role,
            "actor": self.label.actor,
            "cohort": self.label.cohort,
            "tenant": self.wire["tenant"],
            "account": self.wire["account"],
            "event": self.wire,
        }


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What to simulate. ``scenarios`` are names from ``SCENARIOS``."""

    scenarios: tuple[str, ...]
    rate_per_s: float
    duration_ms: int
    seed: int
    start_ms: int

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.duration_ms


def parse_scenarios(text: str) -> tuple[str, ...]:
    """``mixed`` (baseline and every attack but the slow ones) or a comma-separated list."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if names == [MIXED]:
        return MIXED_SCENARIOS
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown or not names:
        raise ScenarioError(
            f"unknown scenario {', '.join(unknown) or repr(text)}; choose {MIXED} or a "
            f"comma-separated list of: {', '.join(SCENARIOS)}"
        )
    return tuple(name for name in SCENARIOS if name in names)


# -- addresses and identities ------------------------------------------------------------


def _ipv4(value: int) -> str:
    return f"{value >> 24 & 255}.{value >> 16 & 255}.{value >> 8 & 255}.{value & 255}"


HOME_V4_BASE = (198 << 24) | (18 << 16)  # 198.18.0.0/15
HOME_V4_SIZE = 1 << 17
MOBILE_V4_BASE = (172 << 24) | (16 << 16)  # 172.16.0.0/12
MOBILE_V4_SIZE = 1 << 20
BOTNET_V4_BASE = (100 << 24) | (64 << 16)  # 100.64.0.0/10, split in three /12 pools
POOL_SIZE = 1 << 20
OFFICE_NAT = "192.0.2.10"


def _digest(*parts: object) -> bytes:
    text = "\x1f".join(str(part) for part in parts)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _v6_address(prefix: str, rng: random.Random) -> str:
    iid = rng.getrandbits(64)
    groups = [(iid >> shift) & 0xFFFF for shift in (48, 32, 16, 0)]
    return prefix + ":" + ":".join(f"{g:x}" for g in groups)


def _pool_addresses(pool: int, count: int, rng: random.Random) -> list[str]:
    """``count`` distinct addresses from one of the three botnet pools."""
    base = BOTNET_V4_BASE + pool * POOL_SIZE
    return [_ipv4(base + offset) for offset in rng.sample(range(1, POOL_SIZE), count)]


@dataclass(frozen=True, slots=True)
class Device:
    device_id: str
    kind: str  # laptop | phone | tablet
    user_agent: str


@dataclass(frozen=True, slots=True)
class User:
    """A person with an account, a home network and trusted devices (from a digest)."""

    tenant: str
    account: str
    actor: str
    cohort: str
    home_v4: str
    v6_prefix: str | None
    devices: tuple[Device, ...]
    behind_nat: str | None = None


def default_account(index: int) -> str:
    return f"user{index:07d}@example.com"


def acme_account(index: int) -> str:
    return f"emp{index:05d}@acme.example"


def make_user(seed: int, tenant: str, population: str, index: int) -> User:
    """The user ``index`` of a population, identical for every call with the same seed."""
    d = _digest(seed, tenant, population, index)
    if population == "office":
        account, actor, cohort = f"staff{index:03d}@example.com", f"office:{index}", "nat_office"
    elif tenant == SMALL_TENANT:
        account, actor, cohort = acme_account(index), f"acme:{index}", "ordinary"
    else:
        account, actor, cohort = default_account(index), f"user:{index}", "ordinary"
    home_v4 = _ipv4(HOME_V4_BASE + int.from_bytes(d[0:4], "big") % HOME_V4_SIZE)
    v6_prefix = None
    if population != "office" and d[4] < 77:  # 30 %
        v6_prefix = f"2001:db8:{int.from_bytes(d[5:7], 'big'):x}:{int.from_bytes(d[7:9], 'big'):x}"
        cohort = "ipv6_rotating"
    devices = [Device(f"dev-{d[9:13].hex()}-0", "laptop", BROWSER_UAS[d[13] % len(BROWSER_UAS)])]
    if population != "office" and d[14] < 179:  # 70 % also use a phone
        devices.append(Device(f"dev-{d[9:13].hex()}-1", "phone", PHONE_UAS[d[15] % 2]))
    if population != "office" and d[15] < 38:  # 15 % a tablet
        devices.append(Device(f"dev-{d[9:13].hex()}-2", "tablet", BROWSER_UAS[1]))
    return User(
        tenant=tenant, account=account, actor=actor, cohort=cohort, home_v4=home_v4,
        v6_prefix=v6_prefix, devices=tuple(devices),
        behind_nat=OFFICE_NAT if population == "office" else None,
    )  # fmt: skip


# -- baseline -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BaselineShape:
    """Habits of ordinary users (probabilities per session unless named otherwise)."""

    logins_per_user_hour: float = 3.0
    events_per_session: float = 1.33  # measured mean of the session model below
    typo: float = 0.06
    another_typo: float = 0.3  # after a typo, chance the next try is wrong too
    resets_after_failures: int = 3
    username_typo: float = 0.01
    forgot_password: float = 0.004
    new_device: float = 0.10
    capitalised: float = 0.05
    second_factor_typo: float = 0.03
    uia_prompt: float = 0.12
    uia_typo: float = 0.05
    stale_app_after_reset: float = 0.5
    office_users: int = 300
    office_logins_per_user_hour: float = 4.0
    small_tenant_users: int = 3000


SHAPE = BaselineShape()


def main_population(rate_per_s: float, shape: BaselineShape = SHAPE) -> int:
    """Users of the main tenant: enough that each logs in a few times per hour."""
    sessions_per_hour = rate_per_s / shape.events_per_session * 3600
    return max(1000, round(sessions_per_hour / shape.logins_per_user_hour))


class _SessionWriter:
    """Builds the events of one user's session with one rng (order of draws is fixed)."""

    def __init__(self, rng: random.Random, shape: BaselineShape, end_ms: int) -> None:
        self.rng = rng
        self.shape = shape
        self.end_ms = end_ms

    def session(self, user: User, t: int, label: Label) -> list[Draft]:
        rng, shape = self.rng, self.shape
        device, trusted = self._device(user)
        base: dict[str, Any] = {
            "tenant": user.tenant,
            "service": "mobile-api" if device and device.kind == "phone" else "web-login",
            "peer_ip": self._address(user, device),
            "device_trusted": trusted,
            "user_agent": device.user_agent if device else BROWSER_UAS[rng.randrange(4)],
        }
        if device is not None:
            base["device_id"] = device.device_id
        typed = user.account
        if rng.random() < shape.capitalised:
            typed = typed[0].upper() + typed[1:]
        out: list[Draft] = []

        def emit(at: int, **fields: Any) -> None:
            out.append(Draft(at, {**base, "account": typed, **fields}, label))

        if rng.random() < shape.username_typo:
            out.append(Draft(t, {**base, "account": _mistype(typed, rng), "flow": "login",
                                 "outcome": "failure", "failure_reason": "unknown_account"}, label))  # fmt: skip
            t += rng.randrange(4_000, 12_000)
        failures = 0
        if rng.random() < shape.forgot_password:
            failures = 1 + rng.randrange(2)
            reset = True
        else:
            if rng.random() < shape.typo:
                failures = 1
                while failures < shape.resets_after_failures and rng.random() < shape.another_typo:
                    failures += 1
            reset = failures >= shape.resets_after_failures
        for _ in range(failures):
            emit(t, flow="login", outcome="failure", failure_reason="bad_password")
            t += rng.randrange(3_000, 15_000)
        if reset:
            t += rng.randrange(60_000, 240_000)  # reads the e-mail, follows the link
            emit(t, flow="recovery", outcome="success")
            out.extend(self._stale_app(user, t, label))
            t += rng.randrange(10_000, 40_000)
        session_id = f"sess-{rng.getrandbits(64):016x}"
        emit(t, flow="login", outcome="success")
        if not trusted:
            t += rng.randrange(5_000, 25_000)
            if rng.random() < shape.second_factor_typo:
                emit(t, flow="mfa", outcome="failure", failure_reason="bad_second_factor")
                t += rng.randrange(5_000, 20_000)
            emit(t, flow="mfa", outcome="success")
        if rng.random() < shape.uia_prompt:
            t += rng.randrange(120_000, 1_500_000)
            if rng.random() < shape.uia_typo:
                emit(
                    t,
                    flow="uia",
                    session_id=session_id,
                    outcome="failure",
                    failure_reason="bad_password",
                )
                t += rng.randrange(4_000, 12_000)
            emit(t, flow="uia", session_id=session_id, outcome="success")
        return [draft for draft in out if draft.occurred_ms < self.end_ms]

    def _stale_app(self, user: User, t: int, label: Label) -> list[Draft]:
        """After a reset, the phone's mail app may keep the old password: it retries via the
        token flow from changing carrier addresses every 40-90 s for 10-30 min, until the
        user types the new one. Its install id is not a trusted device cookie."""
        rng, shape = self.rng, self.shape
        phones = [d for d in user.devices if d.kind == "phone"]
        if not phones or rng.random() >= shape.stale_app_after_reset:
            return []
        app = phones[0]
        base = {"tenant": user.tenant, "service": "mobile-api", "flow": "token",
                "account": user.account, "device_id": f"{app.device_id}-app",
                "device_trusted": False, "user_agent": app.user_agent}  # fmt: skip
        label = Label(label.scenario, label.role, label.actor, "stale_app")
        out = []
        t += rng.randrange(30_000, 120_000)
        until = t + rng.randrange(600_000, 1_800_000)
        while t < until:
            ip = _ipv4(MOBILE_V4_BASE + rng.randrange(MOBILE_V4_SIZE))
            out.append(Draft(t, {**base, "peer_ip": ip, "outcome": "failure",
                                 "failure_reason": "bad_password"}, label))  # fmt: skip
            t += rng.randrange(40_000, 90_000)
        ip = _ipv4(MOBILE_V4_BASE + rng.randrange(MOBILE_V4_SIZE))
        out.append(Draft(t, {**base, "peer_ip": ip, "outcome": "success"}, label))
        return out

    def _device(self, user: User) -> tuple[Device | None, bool]:
        rng = self.rng
        if rng.random() < self.shape.new_device:
            if rng.random() < 0.5:
                return Device(
                    f"dev-new-{rng.getrandbits(48):012x}", "laptop", BROWSER_UAS[0]
                ), False
            return None, False
        return user.devices[rng.randrange(len(user.devices))], True

    def _address(self, user: User, device: Device | None) -> str:
        rng = self.rng
        if user.behind_nat:
            return user.behind_nat
        if device is not None and device.kind == "phone":
            return _ipv4(MOBILE_V4_BASE + rng.randrange(MOBILE_V4_SIZE))
        if user.v6_prefix:
            return _v6_address(user.v6_prefix, rng)
        return user.home_v4


def _mistype(account: str, rng: random.Random) -> str:
    """A mistyped identifier: one character dropped or two swapped."""
    at = account.index("@")
    i = rng.randrange(1, max(2, at - 1))
    if rng.random() < 0.5:
        return account[:i] + account[i + 1 :]
    return account[: i - 1] + account[i] + account[i - 1] + account[i + 1 :]


def _arrivals(rng: random.Random, start_ms: int, end_ms: int, per_s: float) -> Iterator[int]:
    """Poisson arrivals (exponential gaps) at ``per_s`` per simulated second."""
    if per_s <= 0:
        return
    per_ms = per_s / 1000
    t = start_ms + rng.expovariate(per_ms)
    while t < end_ms:
        yield int(t)
        t += rng.expovariate(per_ms)


def _population_sessions(
    cfg: SimConfig, name: str, tenant: str, users: int, sessions_per_s: float
) -> Iterator[tuple[int, int, str, str]]:
    """(start_ms, user index, tenant, population) of one population's sessions."""
    rng = random.Random(f"{cfg.seed}/baseline/{name}/arrivals")
    for t in _arrivals(rng, cfg.start_ms, cfg.end_ms, sessions_per_s):
        yield t, rng.randrange(users), tenant, name


def baseline(cfg: SimConfig, shape: BaselineShape = SHAPE) -> Iterator[Draft]:
    """Ordinary users of both tenants and the office NAT, in time order."""
    per_session = shape.events_per_session
    populations = [
        ("main", MAIN_TENANT, main_population(cfg.rate_per_s, shape), cfg.rate_per_s / per_session),
        ("office", MAIN_TENANT, shape.office_users,
         shape.office_users * shape.office_logins_per_user_hour / 3600),
        ("acme", SMALL_TENANT, shape.small_tenant_users,
         shape.small_tenant_users * shape.logins_per_user_hour / 3600),
    ]  # fmt: skip
    starts = heapq.merge(*(_population_sessions(cfg, *p) for p in populations))
    writer = _SessionWriter(random.Random(f"{cfg.seed}/baseline/sessions"), shape, cfg.end_ms)
    users: dict[tuple[str, int], User] = {}
    pending: list[tuple[int, int, Draft]] = []
    counter = 0
    for t, index, tenant, population in starts:
        while pending and pending[0][0] <= t:
            yield heapq.heappop(pending)[2]
        user = users.get((population, index))
        if user is None:
            user = make_user(cfg.seed, tenant, population, index)
            users[(population, index)] = user
        for draft in writer.session(user, t, Label(BASELINE, "legit", user.actor, user.cohort)):
            heapq.heappush(pending, (draft.occurred_ms, counter, draft))
            counter += 1
    while pending:
        yield heapq.heappop(pending)[2]


# -- attacks ------------------------------------------------------------------------------


def _span(cfg: SimConfig, name: str) -> tuple[int, int]:
    first, last = PLACEMENT[name]
    return cfg.start_ms + int(cfg.duration_ms * first), cfg.start_ms + int(cfg.duration_ms * last)


def _paced(rng: random.Random, t0: int, t1: int, n: int) -> list[int]:
    """``n`` times evenly paced over [t0, t1) with jitter, in order."""
    step = (t1 - t0) / max(n, 1)
    return [int(t0 + (i + rng.random()) * step) for i in range(n)]


def _failure(tenant: str, account: str, ip: str, ua: str, reason: str = "bad_password",
             **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {"tenant": tenant, "service": "web-login", "flow": "login", "account": account,
            "peer_ip": ip, "outcome": "failure", "failure_reason": reason, "user_agent": ua,
            **extra}  # fmt: skip


def _owner_logins(
    scenario: str, user: User, device: Device, times: Iterable[int], *, typo_at: int = -1
) -> list[Draft]:
    """The victim signing in from a trusted device (one typo before login ``typo_at``)."""
    label = Label(scenario, "owner", f"owner:{scenario}", "owner_trusted_device")
    base = {"tenant": user.tenant, "service": "web-login", "flow": "login",
            "account": user.account, "peer_ip": user.home_v4, "device_id": device.device_id,
            "device_trusted": True, "user_agent": device.user_agent}  # fmt: skip
    out: list[Draft] = []
    for i, t in enumerate(times):
        if i == typo_at:
            out.append(Draft(t - 9_000, {**base, "outcome": "failure",
                                         "failure_reason": "bad_password"}, label))  # fmt: skip
        out.append(Draft(t, {**base, "outcome": "success"}, label))
    return out


def _victim(cfg: SimConfig, scenario: str) -> User:
    user = make_user(cfg.seed, MAIN_TENANT, f"victim-{scenario}", 0)
    return User(
        tenant=user.tenant, account=f"victim.{scenario}@example.com", actor=f"owner:{scenario}",
        cohort="owner_trusted_device", home_v4=user.home_v4, v6_prefix=None,
        devices=user.devices,
    )  # fmt: skip


def brute_force(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "brute_force")
    account = "victim.brute_force@example.com"
    label = Label("brute_force", "attacker", "attacker:brute_force", "attacker")
    fields = _failure(MAIN_TENANT, account, "203.0.113.7", "python-requests/2.31.0")
    return [Draft(t, fields, label) for t in _paced(rng, t0, t1, 240)]


def distributed_brute_force(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "distributed_brute_force")
    victim = _victim(cfg, "distributed_brute_force")
    tries = [(ip, k) for ip in _pool_addresses(0, 1200, rng) for k in range(1 + rng.randrange(3))]
    rng.shuffle(tries)
    out = []
    for t, (ip, _) in zip(_paced(rng, t0, t1, len(tries)), tries, strict=True):
        label = Label("distributed_brute_force", "attacker", f"bot:{ip}", "attacker")
        out.append(
            Draft(t, _failure(MAIN_TENANT, victim.account, ip, BROWSER_UAS[len(ip) % 4]), label)
        )
    out.extend(
        _owner_logins("distributed_brute_force", victim, victim.devices[0], _paced(rng, t0, t1, 6))
    )
    return out


def _spray_targets(rng: random.Random, population: int, count: int,
                   account: Callable[[int], str], unknown_share: float, domain: str,
                   ) -> list[tuple[str, str]]:  # fmt: skip
    """(account, failure reason): a harvested list, partly of accounts that do not exist."""
    known = min(round(count * (1 - unknown_share)), population)
    targets = [(account(i), "bad_password") for i in rng.sample(range(population), known)]
    targets += [
        (f"{_word(rng)}.{_word(rng)}{rng.randrange(100)}@{domain}", "unknown_account")
        for _ in range(count - known)
    ]
    rng.shuffle(targets)
    return targets


_SYLLABLES = ("an", "bel", "cor", "da", "el", "fin", "gar", "hol", "in", "jo", "ka", "lin",
              "mar", "no", "or", "pet", "ra", "sam", "tor", "ul", "vin", "wes", "yan", "zo")  # fmt: skip


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(2 + rng.randrange(2)))


def spray(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "spray")
    population = main_population(cfg.rate_per_s)
    targets = _spray_targets(rng, population, 3000, default_account, 0.10, "example.com")
    label = Label("spray", "attacker", "attacker:spray", "attacker")
    attempts = [target for _ in range(2) for target in targets]  # two passwords, in passes
    out = []
    for t, (account, reason) in zip(_paced(rng, t0, t1, len(attempts)), attempts, strict=True):
        out.append(
            Draft(t, _failure(MAIN_TENANT, account, "203.0.113.50", BROWSER_UAS[2], reason), label)
        )
    return out


def low_and_slow_spray(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "low_and_slow_spray")
    targets = _spray_targets(
        rng, SHAPE.small_tenant_users, 1500, acme_account, 0.15, "acme.example"
    )
    sources = _pool_addresses(1, 150, rng)
    plan: list[tuple[str, str, str]] = []
    for shift in (0, len(sources) // 2):  # two passwords; each address gets 10 per pass
        order = targets[:]
        rng.shuffle(order)
        plan.extend(
            (sources[(j + shift) % len(sources)], *target) for j, target in enumerate(order)
        )
    out = []
    for t, (ip, account, reason) in zip(_paced(rng, t0, t1, len(plan)), plan, strict=True):
        label = Label("low_and_slow_spray", "attacker", f"bot:{ip}", "attacker")
        out.append(Draft(t, _failure(SMALL_TENANT, account, ip, BROWSER_UAS[0], reason), label))
    return out


def credential_stuffing(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "credential_stuffing")
    population = main_population(cfg.rate_per_s)
    sources = _pool_addresses(2, 60, rng)
    out = []
    for i, t in enumerate(_paced(rng, t0, t1, 4200)):
        ip = sources[i % len(sources)]
        label = Label("credential_stuffing", "attacker", f"proxy:{ip}", "attacker")
        ua = BROWSER_UAS[rng.randrange(4)]
        if rng.random() < 0.88:
            account = f"{_word(rng)}{rng.randrange(10_000)}@mail.example"
            fields = _failure(MAIN_TENANT, account, ip, ua, "unknown_account")
        else:
            fields = _failure(MAIN_TENANT, default_account(rng.randrange(population)), ip, ua)
            if rng.random() < 0.03:  # a reused password: the pair is valid here too
                fields = {**fields, "outcome": "success"}
                del fields["failure_reason"]
        out.append(Draft(t, fields, label))
    return out


def lockout_dos(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "lockout_dos")
    victim = _victim(cfg, "lockout_dos")
    label = Label("lockout_dos", "attacker", "attacker:lockout_dos", "attacker")
    fields = _failure(MAIN_TENANT, victim.account, "203.0.113.66", "curl/8.5.0")
    out = [Draft(t, fields, label) for t in _paced(rng, t0, t1, 400)]
    out.extend(
        _owner_logins("lockout_dos", victim, victim.devices[0], _paced(rng, t0, t1, 10), typo_at=4)
    )
    # A second owner with no trusted device: the lock holds them too (seed 002's cost,
    # capped at an hour); the notice topic mails them the way out (seed 001).
    other = make_user(cfg.seed, MAIN_TENANT, "victim-lockout_dos-untrusted", 0)
    account = "victim.lockout_dos.untrusted@example.com"
    fields = _failure(MAIN_TENANT, account, "203.0.113.67", "curl/8.5.0")
    out.extend(Draft(t, fields, label) for t in _paced(rng, t0, t1, 400))
    owner = Label(
        "lockout_dos", "owner", "owner:lockout_dos:untrusted", "owner_without_trusted_device"
    )
    base = {"tenant": MAIN_TENANT, "service": "web-login", "flow": "login", "account": account,
            "peer_ip": other.home_v4, "user_agent": BROWSER_UAS[1], "outcome": "success"}  # fmt: skip
    out.extend(Draft(t, base, owner) for t in _paced(rng, t0, t1, 10))
    return out


def _every(t0: int, t1: int, every_ms: int) -> range:
    return range(t0 + every_ms // 2, t1, every_ms)


def low_and_slow_bruteforce(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    """One address guessing one account every 4 minutes: under every window's threshold."""
    t0, t1 = _span(cfg, "low_and_slow_bruteforce")
    account = "victim.low_and_slow_bruteforce@example.com"
    label = Label("low_and_slow_bruteforce", "attacker", "attacker:low_and_slow_bruteforce", "attacker")
    fields = _failure(MAIN_TENANT, account, "203.0.113.24", "python-requests/2.31.0")
    return [Draft(t, fields, label) for t in _every(t0, t1, SLOW_SINGLE_EVERY_MS)]


def low_and_slow_bruteforce_rotating(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    """13 addresses taking turns on one account, one guess every 20 s in all."""
    name = "low_and_slow_bruteforce_rotating"
    t0, t1 = _span(cfg, name)
    account = f"victim.{name}@example.com"
    sources = _pool_addresses(3, SLOW_ROTATING_SOURCES, rng)
    out = []
    for i, t in enumerate(_every(t0, t1, SLOW_ROTATING_EVERY_MS)):
        ip = sources[i % len(sources)]
        label = Label(name, "attacker", f"bot:{ip}", "attacker")
        out.append(Draft(t, _failure(MAIN_TENANT, account, ip, BROWSER_UAS[3]), label))
    return out


def uia_bruteforce(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    t0, t1 = _span(cfg, "uia_bruteforce")
    victim = _victim(cfg, "uia_bruteforce")
    laptop = victim.devices[0]
    stolen = f"sess-{rng.getrandbits(64):016x}"
    thief = Label("uia_bruteforce", "attacker", "attacker:uia_bruteforce", "attacker")
    out = [
        Draft(t, {"tenant": MAIN_TENANT, "service": "web-login", "flow": "uia",
                  "account": victim.account, "peer_ip": "203.0.113.99", "device_id": laptop.device_id,
                  "device_trusted": True, "session_id": stolen, "outcome": "failure",
                  "failure_reason": "bad_password", "user_agent": laptop.user_agent}, thief)
        for t in _paced(rng, t0, t1, 60)
    ]  # fmt: skip
    phone = Device(f"{laptop.device_id[:-2]}-1", "phone", PHONE_UAS[0])
    owner = Label("uia_bruteforce", "owner", "owner:uia_bruteforce", "owner_trusted_device")
    own_session = f"sess-{rng.getrandbits(64):016x}"
    base = {"tenant": MAIN_TENANT, "service": "mobile-api", "account": victim.account,
            "peer_ip": _ipv4(MOBILE_V4_BASE + rng.randrange(MOBILE_V4_SIZE)),
            "device_id": phone.device_id, "device_trusted": True, "user_agent": phone.user_agent}  # fmt: skip
    out.append(Draft(t0, {**base, "flow": "login", "outcome": "success"}, owner))
    for t in _paced(rng, t0 + 1, t1, 8):
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


# -- the merged stream --------------------------------------------------------------------


def _attack_stream(cfg: SimConfig, name: str) -> Iterator[Draft]:
    drafts = ATTACK_BUILDERS[name](cfg, random.Random(f"{cfg.seed}/{name}"))
    drafts.sort(key=lambda d: d.occurred_ms)
    return iter(drafts)


def check_config(cfg: SimConfig) -> None:
    if cfg.rate_per_s <= 0:
        raise ScenarioError(f"rate {cfg.rate_per_s} events/s must be above 0")
    if cfg.duration_ms < SECOND_MS:
        raise ScenarioError(f"duration {cfg.duration_ms} ms is too short; simulate at least 1 s")
    for name in cfg.scenarios:
        if name not in SCENARIOS:
            raise ScenarioError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")


@functools.lru_cache(maxsize=4096)
def _second_text(epoch_s: int) -> str:
    return format_utc_ms(ms_to_datetime(epoch_s * 1000))[:-5]


def stamp(epoch_ms: int) -> str:
    """RFC 3339 UTC with milliseconds (``format_utc_ms``), the second's text cached."""
    return f"{_second_text(epoch_ms // 1000)}.{epoch_ms % 1000:03d}Z"


def generate(cfg: SimConfig) -> Iterator[SimEvent]:
    """Every event of the run in time order (ties in a fixed stream order), with ids."""
    check_config(cfg)
    streams: list[Iterator[Draft]] = []
    if BASELINE in cfg.scenarios:
        streams.append(baseline(cfg))
    streams.extend(_attack_stream(cfg, name) for name in SCENARIOS[1:] if name in cfg.scenarios)
    prefix = f"sim-{cfg.seed}-{cfg.start_ms:x}-"
    index = 0
    for draft in heapq.merge(*streams, key=lambda d: d.occurred_ms):
        if not cfg.start_ms <= draft.occurred_ms < cfg.end_ms:
            continue
        event_id = f"{prefix}{index:08d}"
        wire = {
            "event_id": event_id,
            "occurred_at": stamp(draft.occurred_ms),
            **draft.fields,
        }
        yield SimEvent(event_id, draft.occurred_ms, wire, draft.label)
        index += 1
