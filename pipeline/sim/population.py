"""The legitimate populations: addresses, identities and the baseline sessions of ordinary
users (both tenants and the office NAT), derived from the seed (see ``pipeline.sim.scenarios``
for the whole picture). The attacks reuse the address pools and identities."""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.sim.drafts import (
    BASELINE,
    BROWSER_UAS,
    MAIN_TENANT,
    PHONE_UAS,
    SMALL_TENANT,
    Draft,
    Label,
    SimConfig,
)

# -- addresses and identities ------------------------------------------------------------


def ipv4(value: int) -> str:
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


def v6_address(prefix: str, rng: random.Random) -> str:
    iid = rng.getrandbits(64)
    groups = [(iid >> shift) & 0xFFFF for shift in (48, 32, 16, 0)]
    return prefix + ":" + ":".join(f"{g:x}" for g in groups)


def pool_addresses(pool: int, count: int, rng: random.Random) -> list[str]:
    """``count`` distinct addresses from one of the three botnet pools."""
    base = BOTNET_V4_BASE + pool * POOL_SIZE
    return [ipv4(base + offset) for offset in rng.sample(range(1, POOL_SIZE), count)]


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
    home_v4 = ipv4(HOME_V4_BASE + int.from_bytes(d[0:4], "big") % HOME_V4_SIZE)
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
        tenant=tenant,
        account=account,
        actor=actor,
        cohort=cohort,
        home_v4=home_v4,
        v6_prefix=v6_prefix,
        devices=tuple(devices),
        behind_nat=OFFICE_NAT if population == "office" else None,
    )


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
            out.append(
                Draft(
                    t,
                    {
                        **base,
                        "account": _mistype(typed, rng),
                        "flow": "login",
                        "outcome": "failure",
                        "failure_reason": "unknown_account",
                    },
                    label,
                )
            )
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
        base = {
            "tenant": user.tenant,
            "service": "mobile-api",
            "flow": "token",
            "account": user.account,
            "device_id": f"{app.device_id}-app",
            "device_trusted": False,
            "user_agent": app.user_agent,
        }
        label = Label(label.scenario, label.role, label.actor, "stale_app")
        out = []
        t += rng.randrange(30_000, 120_000)
        until = t + rng.randrange(600_000, 1_800_000)
        while t < until:
            ip = ipv4(MOBILE_V4_BASE + rng.randrange(MOBILE_V4_SIZE))
            out.append(
                Draft(
                    t,
                    {**base, "peer_ip": ip, "outcome": "failure", "failure_reason": "bad_password"},
                    label,
                )
            )
            t += rng.randrange(40_000, 90_000)
        ip = ipv4(MOBILE_V4_BASE + rng.randrange(MOBILE_V4_SIZE))
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
            return ipv4(MOBILE_V4_BASE + rng.randrange(MOBILE_V4_SIZE))
        if user.v6_prefix:
            return v6_address(user.v6_prefix, rng)
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
    cfg: SimConfig, stream: str, name: str, tenant: str, users: int, sessions_per_s: float
) -> Iterator[tuple[int, int, str, str]]:
    """(start_ms, user index, tenant, population) of one population's sessions."""
    rng = random.Random(f"{cfg.seed}/{stream}/{name}/arrivals")
    for t in _arrivals(rng, cfg.start_ms, cfg.end_ms, sessions_per_s):
        yield t, rng.randrange(users), tenant, name


def baseline(
    cfg: SimConfig, shape: BaselineShape = SHAPE, stream: str = "baseline"
) -> Iterator[Draft]:
    """Ordinary users of both tenants and the office NAT, in time order; ``stream`` names
    the random streams (the same users, other days: ``pipeline.sim.history``)."""
    per_session = shape.events_per_session
    populations = [
        ("main", MAIN_TENANT, main_population(cfg.rate_per_s, shape), cfg.rate_per_s / per_session),
        (
            "office",
            MAIN_TENANT,
            shape.office_users,
            shape.office_users * shape.office_logins_per_user_hour / 3600,
        ),
        (
            "acme",
            SMALL_TENANT,
            shape.small_tenant_users,
            shape.small_tenant_users * shape.logins_per_user_hour / 3600,
        ),
    ]
    starts = heapq.merge(*(_population_sessions(cfg, stream, *p) for p in populations))
    writer = _SessionWriter(random.Random(f"{cfg.seed}/{stream}/sessions"), shape, cfg.end_ms)
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
