"""The ordinary people of the held-out shapes (issue 24), who look like the attacks of
``pipeline.sim.holdout``: a few identifiers that do not exist, shared addresses, resets.
Arrivals are so many per hour, over the first 90 % of the run.

Legitimate people (role ``legit``, cohort named in brackets; ``reset`` is the contract's
password reset through a mailed link):

* ``identifier_tryers`` (``identifier_tryer``, 240/h): two or three identifiers that do not
  exist here (an old e-mail, a work e-mail, the identifier without its dot), then the right
  one; 30 % then fail the password, reset it, sign in with the new one and their phone app
  signs in from the same address;
* ``stale_usernames`` (``stale_username``, 150/h): the password manager fills an old
  identifier once or twice, then the right one succeeds; 40 % on their own trusted laptop
  (the stale attempt carries its cookie untrusted: the cookie is not trusted for an
  identifier that does not exist);
* ``library`` (``library_patron``): 60 patrons over the run on the shared computers behind
  192.0.2.30, untrusted browsers, a second factor after each sign-in; one patron types two
  identifiers that do not exist first;
* ``forgot_password`` (``forgot_password``, 90/h): five wrong passwords, the reset, the
  sign-in with the new password; half on their trusted laptop;
* ``office_guest_wifi`` (``office_colleague``, ``guest_visitor``): 50 colleagues on trusted
  laptops behind 192.0.2.20, three sign-ins each per hour; at a fifth of the run a visitor on
  the guest Wi-Fi types two identifiers that do not exist;
* ``signs_in_again`` (``signs_in_again``, 60/h; group ``adaptive``, not ``holdout``): from a
  new browser at home, a sign-in and its second factor (a fifth mistype the password first:
  what a wave would challenge), then again from the same browser 2-10 minutes later.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

from pipeline.sim.attacks import paced, word
from pipeline.sim.drafts import (
    BROWSER_UAS,
    HOUR_MS,
    MAIN_TENANT,
    MINUTE_MS,
    Draft,
    Label,
    SimConfig,
)
from pipeline.sim.holdout import RESIDENTIAL_UAS, attempt, window
from pipeline.sim.population import User, make_user, v6_address

LIBRARY_ADDRESS = "192.0.2.30"
LIBRARY_PATRONS = 60
OFFICE_ADDRESS = "192.0.2.20"
OFFICE_COLLEAGUES = 50
PER_HOUR = {
    "identifier_tryers": 240,
    "stale_usernames": 150,
    "forgot_password": 90,
    "office_guest_wifi": 3,  # per colleague
    "signs_in_again": 60,
}


def per_run(cfg: SimConfig, per_hour: float) -> int:
    return max(1, round(per_hour * cfg.duration_ms / HOUR_MS))


class _Visit:
    """One person's attempts from one browser at one address."""

    def __init__(
        self, scenario: str, user: User, ip: str, browser: tuple[str, str, bool], service: str
    ) -> None:
        device_id, ua, self.trusted = browser
        self.user = user
        self.label = Label(scenario, "legit", user.actor, user.cohort)
        self.base = {"service": service, "device_id": device_id}
        self.ip, self.ua = ip, ua
        self.out: list[Draft] = []

    def add(
        self,
        t: int,
        reason: str | None = None,
        *,
        account: str | None = None,
        flow: str = "login",
        trusted: bool | None = None,
    ) -> None:
        fields = attempt(account or self.user.account, self.ip, self.ua, reason, **self.base)
        fields["flow"] = flow
        fields["device_trusted"] = self.trusted if trusted is None else trusted
        self.out.append(Draft(t, fields, self.label))

    def unknown(self, t: int, rng: random.Random, accounts: list[str]) -> int:
        """Identifiers that do not exist here (a cookie is never trusted for them)."""
        for account in accounts:
            self.add(t, "unknown_account", account=account, trusted=False)
            t += rng.randrange(5_000, 25_000)
        return t

    def sign_in(self, t: int, rng: random.Random) -> int:
        """A success, then the second factor from an untrusted browser."""
        self.add(t)
        if not self.trusted:
            t += rng.randrange(5_000, 25_000)
            self.add(t, flow="mfa")
        return t


def person(cfg: SimConfig, cohort: str, index: int) -> User:
    user = make_user(cfg.seed, MAIN_TENANT, cohort, index)
    names = random.Random(f"{cfg.seed}/{cohort}/{index}")
    account = f"{word(names)}.{word(names)}{index:04d}@example.com"
    return replace(user, account=account, actor=f"{cohort}:{index}", cohort=cohort)


def _wrong_identifiers(account: str) -> list[str]:
    """An old e-mail, a work e-mail and the identifier without its dot: none exists here."""
    local = account.split("@")[0]
    first, last = local.split(".")
    return [
        f"{local}@oldmail.example",
        f"{first[0]}{last}@work.example",
        f"{first}{last}@example.com",
    ]


def home_of(user: User, rng: random.Random) -> str:
    return v6_address(user.v6_prefix, rng) if user.v6_prefix else user.home_v4


def _browser(user: User, rng: random.Random, trusted_share: float) -> tuple[str, str, bool]:
    """(device id, user agent, trusted): the person's laptop, or a new browser."""
    if rng.random() < trusted_share:
        return user.devices[0].device_id, user.devices[0].user_agent, True
    return f"dev-new-{rng.getrandbits(48):012x}", rng.choice(BROWSER_UAS), False


Story = Callable[["_Visit", int, random.Random], None]
"""What one person does from ``t`` on, written into their visit."""


def _at_home(
    cfg: SimConfig, rng: random.Random, name: str, cohort: str, trusted_share: float, story: Story
) -> list[Draft]:
    """Each person of a cohort, arriving over the first 90 % of the run, at home on their
    trusted laptop (``trusted_share`` of them) or a new browser."""
    t0, t1 = window(cfg, 0.0, 0.9, cfg.duration_ms)
    out = []
    for i, t in enumerate(paced(rng, t0, t1, per_run(cfg, PER_HOUR[name]))):
        user = person(cfg, cohort, i)
        visit = _Visit(
            name, user, home_of(user, rng), _browser(user, rng, trusted_share), "web-login"
        )
        story(visit, t, rng)
        out.extend(visit.out)
    return out


def _identifier_tryer(visit: _Visit, t: int, rng: random.Random) -> None:
    user = visit.user
    wrong = _wrong_identifiers(user.account)
    rng.shuffle(wrong)
    t = visit.unknown(t, rng, wrong[: 2 + rng.randrange(2)])
    if rng.random() < 0.3:  # the right identifier, but which password?
        visit.add(t, "bad_password")
        t += rng.randrange(60_000, 240_000)
        visit.add(t, flow="reset")
        t = visit.sign_in(t + rng.randrange(10_000, 40_000), rng)
        phones = [d for d in user.devices if d.kind == "phone"]
        if phones:  # the phone app on the same Wi-Fi asks for the new password
            phone = (phones[0].device_id, phones[0].user_agent, True)
            app = _Visit(visit.label.scenario, user, visit.ip, phone, "mobile-api")
            app.add(t + rng.randrange(30_000, 300_000))
            visit.out.extend(app.out)
    else:
        visit.sign_in(t, rng)


def identifier_tryers(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    return _at_home(cfg, rng, "identifier_tryers", "identifier_tryer", 0.6, _identifier_tryer)


def _stale_username(visit: _Visit, t: int, rng: random.Random) -> None:
    stale = rng.choice(_wrong_identifiers(visit.user.account)[::2])
    t = visit.unknown(t, rng, [stale] * (1 + (rng.random() < 0.3)))
    visit.sign_in(t, rng)


def stale_usernames(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    return _at_home(cfg, rng, "stale_usernames", "stale_username", 0.4, _stale_username)


def library(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    out = []
    t0, t1 = window(cfg, 0.02, 0.95, cfg.duration_ms)
    for i, t in enumerate(paced(rng, t0, t1, LIBRARY_PATRONS)):
        user = person(cfg, "library_patron", i)
        browser = (f"dev-lib-{rng.getrandbits(48):012x}", BROWSER_UAS[i % 3], False)
        visit = _Visit("library", user, LIBRARY_ADDRESS, browser, "web-login")
        if i == LIBRARY_PATRONS // 4:
            t = visit.unknown(t, rng, _wrong_identifiers(user.account)[:2])
        if rng.random() < 0.08:
            visit.add(t, "bad_password")
            t += rng.randrange(4_000, 15_000)
        visit.sign_in(t, rng)
        out.extend(visit.out)
    return out


def _forgot_password(visit: _Visit, t: int, rng: random.Random) -> None:
    for _ in range(5):
        visit.add(t, "bad_password")
        t += rng.randrange(8_000, 30_000)
    t += rng.randrange(60_000, 240_000)  # reads the mail, follows the link
    visit.add(t, flow="reset")
    visit.sign_in(t + rng.randrange(10_000, 40_000), rng)


def forgot_password(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    return _at_home(cfg, rng, "forgot_password", "forgot_password", 0.5, _forgot_password)


def office_guest_wifi(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    name = "office_guest_wifi"
    out = []
    for i in range(OFFICE_COLLEAGUES):
        user = person(cfg, "office_colleague", i)
        laptop = user.devices[0]
        for t in paced(rng, cfg.start_ms, cfg.end_ms, per_run(cfg, PER_HOUR[name])):
            visit = _Visit(
                name, user, OFFICE_ADDRESS, (laptop.device_id, laptop.user_agent, True), "web-login"
            )
            if rng.random() < 0.03:
                visit.add(t, "bad_password")
                t += rng.randrange(4_000, 12_000)
            visit.sign_in(t, rng)
            out.extend(visit.out)
    guest = person(cfg, "guest_visitor", 0)  # their identifiers are another service's
    browser = (f"dev-new-{rng.getrandbits(48):012x}", RESIDENTIAL_UAS[-5], False)
    visit = _Visit(name, guest, OFFICE_ADDRESS, browser, "web-login")
    visit.unknown(window(cfg, 0.2, 1.0, 0)[0], rng, _wrong_identifiers(guest.account)[:2])
    return out + visit.out


def _signs_in_again(visit: _Visit, t: int, rng: random.Random) -> None:
    if rng.random() < 0.2:
        visit.add(t, "bad_password")
        t += rng.randrange(4_000, 15_000)
    t = visit.sign_in(t, rng)
    visit.sign_in(t + rng.randrange(2 * MINUTE_MS, 10 * MINUTE_MS), rng)


def signs_in_again(cfg: SimConfig, rng: random.Random) -> list[Draft]:
    return _at_home(cfg, rng, "signs_in_again", "signs_in_again", 0.0, _signs_in_again)


HOLDOUT_PEOPLE: dict[str, Callable[[SimConfig, random.Random], list[Draft]]] = {
    "identifier_tryers": identifier_tryers,
    "stale_usernames": stale_usernames,
    "library": library,
    "forgot_password": forgot_password,
    "office_guest_wifi": office_guest_wifi,
}
