"""Keycloak alone against Keycloak with authpipe, side by side (issue 47 item 4).

The same scripted attacks go through a real Keycloak's token endpoint and login pages
twice: first with Keycloak's own brute-force detection on (its defaults) and its default
flows; then with detection off and authpipe deciding (the provider publishes every attempt,
a real ``authpipe worker`` counts them, the edge answers the provider's checks). Each run
has its own users and addresses. Scenarios (small: Keycloak does 20-30 failed logins a
second here):

* lockout DoS: 2 wrong passwords a second at the owner for 20 s from one address, while the
  owner signs in from their own browser every 4 s (with authpipe: a browser that passed a
  step-up once, so trusted);
* spray: one address tries one common password on 30 accounts, one of which has it;
* stuffing: 20 leaked pairs through 20 addresses, 3 of them valid;
* ordinary people: 10 users sign in once each from their own address, 5 of them with a
  one-time code set up, the others with only a verified e-mail address: they read the
  step-up's mailed code from the mail sink that is the realm's SMTP server (no history:
  every place is new to authpipe).

* slow guesser (``slow_s`` of wall time, 0: left out): one address guesses one account's
  password every ``slow_every_s`` (15 s: over a second apart, Keycloak's quick-login check,
  and 24 in 6 minutes, under its failure factor of 30), while the owner signs in from their
  trusted browser every ``slow_owner_every_s``; a guess reached the password check when
  Keycloak alone had not locked the account just before (its attack-detection API) and the
  answer was a wrong password, not a refusal (429) or a CAPTCHA.

``python -m bench.keycloak_side_by_side`` (after ``bash scripts/keycloak-setup``) prints
the table and writes ``bench/results/keycloak_side_by_side.json``; about 14 minutes on 2
cores (the slow guesser 6 minutes a side). The table and what it says: docs/keycloak.md. ``run`` takes a ``Scale``:
tests/integration/test_keycloak_side_by_side.py runs it small.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.dev.keycloak import LocalKeycloak, ProviderConfig
from pipeline.dev.mailsink import MailSink
from pipeline.dev.stack import LocalKafka
from tests.integration.edge_process import AUTH, TOKEN
from tests.integration.test_keycloak import REDIRECT, Browser, _request, solve, totp
from tests.plugins.kafka import REPO_ROOT, SHARED_LIBS_DIR, free_ports
from tests.plugins.waiting import wait_until

DIGEST_KEY = "keycloak-side-by-side-digest-key-0123456789"
OTP_SECRET = '{"value":"authpipe-demo-otp-secret"}'
OTP_DATA = '{"subType":"totp","digits":6,"counter":0,"period":30,"algorithm":"HmacSHA1"}'
SPRAYED = "Winter2026!"
OUT = REPO_ROOT / "bench" / "results" / "keycloak_side_by_side.json"


@dataclass(frozen=True)
class Scale:
    """How big each scripted attack is; ``net`` picks the runs' addresses (alone: net,
    with authpipe: net + 10) and ``tag`` the users' names, so runs never meet."""

    dos_s: float = 20.0
    owner_every_s: float = 4.0
    spray_accounts: int = 30
    stuffing_pairs: int = 20
    stuffing_valid: tuple[int, ...] = (3, 11, 17)
    people: int = 10
    people_with_otp: int = 5
    net: int = 10
    tag: str = ""
    slow_s: float = 0.0
    slow_every_s: float = 15.0
    slow_owner_every_s: float = 120.0


FULL = Scale(slow_s=360.0)


def user(name: str, password: str, otp: bool = False) -> dict[str, Any]:
    creds: list[dict[str, Any]] = [{"type": "password", "value": password, "temporary": False}]
    if otp:
        creds.append({"type": "otp", "secretData": OTP_SECRET, "credentialData": OTP_DATA})
    return {
        "username": name,
        "enabled": True,
        "email": f"{name}@example.com",
        "emailVerified": True,
        "firstName": name,
        "lastName": "Bench",
        "credentials": creds,
    }


class Realm:
    """The realm ``authpipe`` on ``keycloak``, switched between the two set-ups."""

    def __init__(self, keycloak: LocalKeycloak) -> None:
        self.keycloak = keycloak
        self.url = keycloak.url

    def mode(self, alone: bool) -> None:
        """Keycloak alone: its brute-force detection on, its default flows; else authpipe's."""
        self.keycloak.admin(
            "PUT",
            "",
            {
                "bruteForceProtected": alone,
                "browserFlow": "browser" if alone else "authpipe browser",
                "directGrantFlow": "direct grant" if alone else "authpipe direct grant",
            },
        )

    def users(self, users: list[dict[str, Any]]) -> None:
        self.keycloak.admin("POST", "/partialImport", {"ifResourceExists": "SKIP", "users": users})

    def locked(self, username: str) -> bool:
        """Whether Keycloak's brute-force detection holds ``username`` now."""
        found = self.keycloak.admin("GET", f"/users?username={username}&exact=true")
        assert isinstance(found, list) and found, f"no user {username}"
        state = self.keycloak.admin("GET", f"/attack-detection/brute-force/users/{found[0]['id']}")
        return bool(isinstance(state, dict) and state.get("disabled"))


def grant(url: str, username: str, password: str, source: str, **extra: str) -> int:
    return answer(url, username, password, source, **extra)[0]


def answer(
    url: str, username: str, password: str, source: str, **extra: str
) -> tuple[int, dict[str, Any]]:
    form = {
        "grant_type": "password",
        "client_id": "authpipe-demo",
        "username": username,
        "password": password,
        **extra,
    }
    status, _, text = _request(
        f"{url}/realms/authpipe/protocol/openid-connect/token", form, {"X-Forwarded-For": source}
    )
    return status, json.loads(text) if text.startswith("{") else {}


def mailed_code(mail: MailSink, username: str, since: int) -> str:
    """The code in the first mail to ``username`` from message ``since`` on (a person
    reads their mail)."""
    found = re.search(r": (\d{6})\b", mail.wait_for(f"{username}@example.com", since).text)
    assert found, f"no code in the mail to {username}"
    return found.group(1)


def person(url: str, mail: MailSink, username: str, password: str, source: str, otp: bool) -> str:
    """A person's direct grant, answering what a person can: a CAPTCHA (solved; a solution
    answers the one challenge it was made for, so a CAPTCHA asked again is solved again),
    their code when they have one, the code mailed to them. ``signed_in``,
    ``signed_in_challenged`` or the refusal's error."""
    extra: dict[str, str] = {}
    challenged = False
    since = len(mail.messages)
    for _ in range(5):
        status, body = answer(url, username, password, source, **extra)
        extra.pop("authpipe-captcha", None)  # spent
        if status == 200:
            return "signed_in_challenged" if challenged else "signed_in"
        error = str(body.get("error"))
        if error == "captcha_required" and "captcha_challenge" in body:
            extra["authpipe-captcha"] = solve(body["captcha_challenge"])
        elif error == "step_up_required" and body.get("step_up_method") == "email":
            extra["otp"] = mailed_code(mail, username, since)
        elif otp and error in ("step_up_required", "invalid_grant") and "otp" not in extra:
            extra["otp"] = totp(0)
        else:
            return error
        challenged = challenged or error == "captcha_required" or error == "step_up_required"
    return "gave_up"


def browser_signs_in(browser: Browser, username: str, password: str, step: int) -> bool:
    """The login pages as a person fills them in (code when asked); True at the client."""
    browser.forget_session()
    page = browser.start()
    fields = {"username": username}
    if 'name="password"' in page:
        fields["password"] = password
    status, headers, page = browser._post(page, fields)
    captcha = re.search(r'<altcha-widget[^>]*challenge="([^"]+)"', page)
    if status == 200 and captcha:  # a person solves the CAPTCHA
        payload = solve(json.loads(html.unescape(captcha.group(1))))
        status, headers, page = browser._post(page, {"authpipe-captcha": payload})
    if status == 200 and 'name="password"' in page:
        status, headers, page = browser._post(page, {"password": password})
    if status == 200 and 'name="otp"' in page:
        status, headers, page = browser._post(page, {"otp": totp(step)})
    return status == 302 and headers.get("Location", "").startswith(REDIRECT)


def slow_guesser(url: str, realm: Realm, s: str, net: int, scale: Scale) -> dict[str, Any]:
    """One address guesses ``slow-{s}``'s password every ``slow_every_s`` for ``slow_s``
    while the owner signs in from their trusted browser every ``slow_owner_every_s``."""
    name, password = f"slow-{s}", "slow-owner-correct-horse"
    owner = Browser(type("S", (), {"url": url})(), f"203.0.113.{net + 1}")
    warm = browser_signs_in(owner, name, password, -1)
    answers: dict[str, int] = {}
    reached = 0
    stop = time.monotonic() + scale.slow_s

    def guesses() -> None:
        nonlocal reached
        i = 0
        while time.monotonic() < stop:
            held = realm.locked(name)
            status, body = answer(url, name, f"slow-guess-{i}", f"198.51.100.{net + 2}")
            key = f"{status} {body.get('error')}" + (" (keycloak lock)" if held else "")
            answers[key] = answers.get(key, 0) + 1
            reached += status == 401 and body.get("error") == "invalid_grant" and not held
            i += 1
            time.sleep(scale.slow_every_s)

    attacker = threading.Thread(target=guesses)
    attacker.start()
    tries = refused = 0
    while time.monotonic() < stop:
        time.sleep(min(scale.slow_owner_every_s, max(0.0, stop - time.monotonic())))
        tries += 1
        refused += not browser_signs_in(owner, name, password, 0)
    attacker.join()
    return {
        "wall_s": scale.slow_s,
        "guess_every_s": scale.slow_every_s,
        "guesses": sum(answers.values()),
        "reached_password_check": reached,
        "answers": answers,
        "owner_warm_sign_in": warm,
        "owner_every_s": scale.slow_owner_every_s,
        "owner_tries": tries,
        "owner_refused": refused,
    }


def run(url: str, realm: Realm, mail: MailSink, alone: bool, scale: Scale = FULL) -> dict[str, Any]:
    s = ("a" if alone else "b") + scale.tag
    net = scale.net if alone else scale.net + 10
    targets = [
        user(f"t{i:02d}-{s}", f"strong-{i}-{os.urandom(6).hex()}")
        for i in range(scale.spray_accounts - 1)
    ]
    pairs = {f"p{i:02d}-{s}": f"pw-{i}-{s}" for i in range(scale.stuffing_pairs)}
    legit = {f"l{i:02d}-{s}": f"legit-{i}-{s}" for i in range(scale.people)}
    realm.users(
        [
            user(f"owner-{s}", "owner-correct-horse", otp=not alone),
            user(f"slow-{s}", "slow-owner-correct-horse", otp=not alone),
            user(f"weak-{s}", SPRAYED),
            *targets,
            *(user(n, p) for n, p in pairs.items()),
            *(user(n, p, otp=i < scale.people_with_otp) for i, (n, p) in enumerate(legit.items())),
        ]
    )
    realm.mode(alone)
    result: dict[str, Any] = {}
    if scale.slow_s:  # first: no wave yet from the other attacks
        result["slow_guesser"] = slow_guesser(url, realm, s, net, scale)

    # Lockout DoS: the attacker at 2 a second, the owner every few seconds from their browser.
    owner = Browser(type("S", (), {"url": url})(), f"203.0.113.{net}")
    warm = browser_signs_in(owner, f"owner-{s}", "owner-correct-horse", -1)
    stop = time.monotonic() + scale.dos_s

    def guesses() -> None:
        for i in range(int(scale.dos_s * 2)):
            if time.monotonic() >= stop:
                return
            grant(url, f"owner-{s}", f"guess-{i}", f"198.51.100.{net}")
            time.sleep(0.5)

    attacker = threading.Thread(target=guesses)
    attacker.start()
    tries = refused = 0
    while time.monotonic() < stop:
        tries += 1
        refused += not browser_signs_in(owner, f"owner-{s}", "owner-correct-horse", 0)
        time.sleep(scale.owner_every_s)
    attacker.join()
    result["lockout_dos"] = {
        "owner_warm_sign_in": warm,
        "owner_tries": tries,
        "owner_refused": refused,
    }

    # Spray: one address, one password, every account (the weak one among them).
    names = [t["username"] for t in targets]
    names.insert(len(names) * 2 // 3, f"weak-{s}")
    taken = [n for n in names if grant(url, n, SPRAYED, f"198.51.100.{net + 1}") == 200]
    result["spray"] = {"attempts": len(names), "takeovers": len(taken)}

    # Stuffing: leaked pairs through as many addresses, a few valid.
    got = 0
    for i, (name, password) in enumerate(pairs.items()):
        guess = password if i in scale.stuffing_valid else f"leaked-{i}"
        got += grant(url, name, guess, f"198.18.{net}.{i + 1}") == 200
        time.sleep(0.2)
    result["stuffing"] = {
        "attempts": len(pairs),
        "valid_pairs": len(scale.stuffing_valid),
        "takeovers": got,
    }

    # Ordinary people, once each from their own address.
    with_otp = scale.people_with_otp
    outcomes = [
        person(url, mail, n, p, f"192.0.2.{net + i}", i < with_otp)
        for i, (n, p) in enumerate(legit.items())
    ]
    turned_away = [o for o in outcomes if not o.startswith("signed_in")]
    result["people"] = {
        "people": len(outcomes),
        "refused": len(turned_away),
        "refused_with_a_code": len(
            [o for o in outcomes[:with_otp] if not o.startswith("signed_in")]
        ),
        "refused_without_one": len(
            [o for o in outcomes[with_otp:] if not o.startswith("signed_in")]
        ),
        "challenged": outcomes.count("signed_in_challenged"),
        "outcomes": outcomes,
    }
    return result


def answers(url: str, headers: dict[str, str] | None = None) -> bool:
    try:
        return _request(url, headers=headers)[0] == 200
    except OSError:
        return False


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="authpipe-kc-bench-"))
    kafka_port, controller, edge_port, web_port, kc_port = free_ports(5)
    kafka = LocalKafka(base / "kafka", kafka_port, controller, libs_dir=SHARED_LIBS_DIR)
    config = base / "authpipe.toml"
    config.write_text(
        f'state_dir = "{base / "state"}"\n[kafka]\nbootstrap_servers = "{kafka.bootstrap}"\n'
        f'partitions = 2\n[identity]\ndigest_key = "{DIGEST_KEY}"\n'
        '[ingest]\ntrusted_proxies = ["127.0.0.0/8"]\n'
        f'[worker]\nweb_port = {web_port}\n[edge]\ntoken = "{TOKEN}"\n[log]\nformat = "json"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTHPIPE_")}
    env["AUTHPIPE_CONFIG"] = str(config)
    procs: list[subprocess.Popen[bytes]] = []
    mail = MailSink()
    keycloak = LocalKeycloak(
        base / "keycloak",
        kc_port,
        ProviderConfig(
            kafka.bootstrap,
            f"http://127.0.0.1:{edge_port}",
            edge_token=TOKEN,
            timeout_ms=500,
            captcha_key=os.urandom(24).hex(),
        ),
    )
    try:
        kafka.up()
        for args, name in (
            (["worker"], "worker"),
            (["edge", "serve", "--port", str(edge_port)], "edge"),
        ):
            with (base / f"{name}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "pipeline.cli", *args],
                        cwd=REPO_ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        wait_until(
            lambda: answers(f"http://127.0.0.1:{web_port}/readyz"),
            120,
            interval_s=0.5,
            description="the worker",
        )
        wait_until(
            lambda: answers(f"http://127.0.0.1:{edge_port}/readyz", AUTH),
            60,
            interval_s=0.3,
            description="the edge",
        )
        keycloak.up()
        mail.start()
        keycloak.point_smtp_at(mail.port)
        realm = Realm(keycloak)
        rows = {"keycloak alone": run(keycloak.url, realm, mail, alone=True)}
        rows["keycloak + authpipe"] = run(keycloak.url, realm, mail, alone=False)
    finally:
        keycloak.down()
        mail.stop()
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        kafka.down()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(rows, indent=2) + "\n")
    print(
        f"{'':22} {'owner refused':>14} {'spray takeovers':>16} {'stuffing takeovers':>19} "
        f"{'people refused':>15}"
    )
    for name, r in rows.items():
        print(
            f"{name:22} {r['lockout_dos']['owner_refused']:>6} of {r['lockout_dos']['owner_tries']:<6} "
            f"{r['spray']['takeovers']:>9} of {r['spray']['attempts']:<4} "
            f"{r['stuffing']['takeovers']:>12} of {r['stuffing']['valid_pairs']:<4} "
            f"{r['people']['refused']:>8} of {r['people']['people']}"
        )
    for name, r in rows.items():
        if "slow_guesser" in r:
            g = r["slow_guesser"]
            print(
                f"{name:22} slow guesser: {g['reached_password_check']} of {g['guesses']} guesses"
                f" reached the password check; owner refused {g['owner_refused']}"
                f" of {g['owner_tries']}; {g['answers']}"
            )
    print(f"details: {OUT}; logs: {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
