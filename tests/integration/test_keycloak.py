"""A real Keycloak with authpipe's provider (issue 47) against the real broker and a real
``authpipe edge serve``: the listener's records pass the worker's ingest, the edge-check
authenticator refuses (429), demands a CAPTCHA and notes a step-up, the step-up asks a
user's one-time code, and a user with no second factor and no e-mail address meets a clean
403, never a 500 (the e-mailed code: test_keycloak_email.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import http.cookiejar
import json
import re
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from pipeline.settings import Settings
from pipeline.stream.ingest import Ingest, Record
from pipeline.wiring import load_policy
from tests.integration.edge_process import AUTH
from tests.plugins.waiting import wait_until
from tests.plugins.worker import produce, read_topic
from tests.unit.test_edge_support import DIGEST_KEY, message, source_key

if TYPE_CHECKING:
    from tests.plugins.keycloak import KeycloakStack

pytestmark = pytest.mark.integration

CLIENT = "authpipe-demo"
REDIRECT = "http://127.0.0.1/cb"
OTP_SECRET = b"authpipe-demo-otp-secret"  # alice's, in integrations/keycloak/realm
PASSWORDS = {
    "alice": "alice-correct-horse",
    "bob": "bob-correct-horse",
    "carol": "carol-correct-horse",
    "dave": "dave-correct-horse",
}
HOUR_MS = 3_600_000


def totp(step_offset: int = 0) -> str:
    """Alice's one-time code for the 30 s step ``step_offset`` away from now."""
    return _code(int(time.time()) // 30 + step_offset)


_USED_STEPS: set[int] = set()


def fresh_totp() -> str:
    """A code of a step (now, next or previous: Keycloak takes one step either side) no test
    of this session has used: Keycloak takes each code once."""
    now = int(time.time()) // 30
    step = next(s for s in (now, now + 1, now - 1) if s not in _USED_STEPS)
    _USED_STEPS.add(step)
    return _code(step)


def _code(counter: int) -> str:
    digest = hmac.new(OTP_SECRET, struct.pack(">Q", counter), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    code = (struct.unpack(">I", digest[offset : offset + 4])[0] & 0x7FFFFFFF) % 1_000_000
    return f"{code:06d}"


def _request(
    url: str,
    data: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    opener: urllib.request.OpenerDirector | None = None,
) -> tuple[int, dict[str, str], str]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with (opener or _NO_REDIRECT).open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode(errors="replace")


class _Stay(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is answered as is: the test reads its Location


_NO_REDIRECT = urllib.request.build_opener(_Stay())


def grant(
    stack: KeycloakStack, username: str, password: str, source: str, **extra: str
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """The direct grant from client address ``source`` (X-Forwarded-For; the edge trusts
    loopback as a proxy)."""
    form = {
        "grant_type": "password",
        "client_id": CLIENT,
        "username": username,
        "password": password,
    }
    status, headers, text = _request(
        stack.token_url, {**form, **extra}, {"X-Forwarded-For": source}
    )
    return status, headers, json.loads(text) if text.startswith("{") else {"raw": text}


def records_from(stack: KeycloakStack, source: str, count: int) -> list[dict[str, Any]]:
    """The ``count`` records with client address ``source``, in order, once they are there;
    every record on the topic must pass the worker's ingest (no dead letter)."""

    def ready() -> list[dict[str, Any]] | None:
        messages = read_topic(stack.bootstrap, stack.attempts_topic)
        ingest = Ingest.from_settings(
            Settings(identity={"digest_key": DIGEST_KEY}), load_policy(None)
        )
        raw = [
            Record(stack.attempts_topic, m.partition, m.offset, m.key, m.value) for m in messages
        ]
        result = ingest.process(raw, int(time.time() * 1000))
        assert [(d.reason, d.detail) for d in result.dead] == []
        ours = [
            json.loads(m.value)
            for m in messages
            if json.loads(m.value)["forwarded_for"] == [source]
        ]
        return ours if len(ours) >= count else None

    found = wait_until(ready, 20.0, interval_s=0.3, description=f"{count} records from {source}")
    assert found is not None and len(found) == count, found
    return found


def summary(record: dict[str, Any]) -> tuple[Any, ...]:
    return (
        record["account"],
        record["flow"],
        record["outcome"],
        record.get("failure_reason"),
        record.get("challenge"),
    )


def decide(stack: KeycloakStack, source: str, **kw: Any) -> None:
    """Publish a decision on ``source`` for tenant authpipe; wait until the edge applies it."""
    now = int(time.time() * 1000)
    key = source_key(source, tenant="authpipe")
    produce(
        stack.bootstrap, stack.decisions_topic, [message(key, now + HOUR_MS, issued_ms=now, **kw)]
    )
    query = urllib.parse.urlencode(
        {"tenant": "authpipe", "account": "probe", "ip": "127.0.0.1", "forwarded_for": source}
    )

    def applied() -> bool:
        _, _, text = _request(f"{stack.edge_url}/v1/check?{query}", headers=AUTH)
        answer = json.loads(text)
        return answer["allowed"] is False or answer["challenge"] == "captcha"

    wait_until(
        applied, 20.0, interval_s=0.2, description=f"the edge to apply the decision on {source}"
    )


def test_records_reach_the_broker_and_pass_ingest(keycloak_stack: KeycloakStack) -> None:
    """A wrong password, an unknown name and a right password met by the edge's step-up are
    published as bad_password, unknown_account and step_up, valid for the worker."""
    source = "203.0.113.10"
    assert grant(keycloak_stack, "carol", "guess", source)[0] == 401
    assert grant(keycloak_stack, "mallory@example.com", "guess", source)[0] == 401
    status, _, body = grant(keycloak_stack, "alice", PASSWORDS["alice"], source)
    assert (status, body["error"]) == (401, "step_up_required")
    records = records_from(keycloak_stack, source, 3)
    assert [summary(r) for r in records] == [
        ("carol", "login", "failure", "bad_password", None),
        ("mallory@example.com", "login", "failure", "unknown_account", None),
        ("alice", "login", "step_up", None, None),
    ]
    first = records[0]
    assert (first["tenant"], first["service"], first["peer_ip"]) == (
        "authpipe",
        "keycloak",
        "127.0.0.1",
    )
    assert first["device_trusted"] is False


def test_step_up_with_a_one_time_code(keycloak_stack: KeycloakStack) -> None:
    """Alice's right password and code sign her in, reported step_up, mfa, then the success
    with challenge step_up; a wrong code is a bad_second_factor and no token."""
    source = "203.0.113.11"
    status, _, body = grant(keycloak_stack, "alice", PASSWORDS["alice"], source, otp="000000")
    assert (status, body["error"]) == (401, "invalid_grant")
    status, _, body = grant(keycloak_stack, "alice", PASSWORDS["alice"], source, otp=fresh_totp())
    assert status == 200 and "access_token" in body
    assert [summary(r) for r in records_from(keycloak_stack, source, 5)] == [
        ("alice", "login", "step_up", None, None),
        ("alice", "mfa", "failure", "bad_second_factor", None),
        ("alice", "login", "step_up", None, None),
        ("alice", "mfa", "success", None, None),
        ("alice", "login", "success", None, "step_up"),
    ]


def test_no_second_factor_is_a_clean_refusal(keycloak_stack: KeycloakStack) -> None:
    """Dave has no second factor and no e-mail address: his right password meets a 403
    (grant and browser), never a 500 and never a page to enrol one."""
    source = "203.0.113.12"
    status, _, body = grant(keycloak_stack, "dave", PASSWORDS["dave"], source)
    assert (status, body["error"]) == (403, "access_denied")
    browser = Browser(keycloak_stack, source)
    page = browser.start()
    page = browser.submit(page, {"username": "dave"})
    status, page = browser.submit_status(page, {"password": PASSWORDS["dave"]})
    assert status == 403
    assert "none is set up on this account" in page
    assert "totp" not in page.lower() and "authenticator" not in page.lower()
    assert [summary(r) for r in records_from(keycloak_stack, source, 2)] == [
        ("dave", "login", "step_up", None, None),
        ("dave", "login", "step_up", None, None),
    ]


def test_a_blocked_source_is_refused_with_429(keycloak_stack: KeycloakStack) -> None:
    """A source the edge blocks gets HTTP 429 with Retry-After before any password check,
    reported as refused."""
    source = "203.0.113.13"
    decide(keycloak_stack, source, action="block")
    status, headers, body = grant(keycloak_stack, "carol", PASSWORDS["carol"], source)
    assert (status, body["error"]) == (429, "too_many_requests")
    retry_s = int(headers["Retry-After"])
    assert 3500 <= retry_s <= 3600 and body["retry_after_ms"] > 3_500_000
    browser = Browser(keycloak_stack, source)
    status, page = browser.submit_status(browser.start(), {"username": "carol"})
    assert status == 429 and "Too many sign-in attempts" in page
    assert [summary(r) for r in records_from(keycloak_stack, source, 2)] == [
        ("carol", "login", "failure", "refused", None),
        ("carol", "login", "failure", "refused", None),
    ]


def test_a_captcha_is_demanded_before_the_password(keycloak_stack: KeycloakStack) -> None:
    """Under a CAPTCHA decision the grant asks for one (401 captcha_required), a bad answer
    is reported as a failed challenge and stops there; the browser shows the CAPTCHA page."""
    source = "203.0.113.14"
    decide(keycloak_stack, source, action="challenge", challenge="captcha")
    status, _, body = grant(keycloak_stack, "carol", "guess", source)
    assert (status, body["error"]) == (401, "captcha_required")
    status, _, body = grant(keycloak_stack, "carol", "guess", source, **{"authpipe-captcha": "bad"})
    assert (status, body["error"]) == (401, "invalid_grant")
    browser = Browser(keycloak_stack, source)
    page = browser.submit(browser.start(), {"username": "carol"})
    assert "kc-authpipe-captcha-form" in page
    assert [summary(r) for r in records_from(keycloak_stack, source, 1)] == [
        ("carol", "challenge", "failure", "other", "captcha"),
    ]


def test_an_unreachable_edge_fails_open_or_closed(keycloak_stack: KeycloakStack) -> None:
    """With the edge unreachable, a client whose flow fails closed is refused (429, reported
    refused) and one that fails open has its password tried (bad_password), both at once."""
    source = "203.0.113.17"
    started = time.monotonic()
    status, headers, body = grant(
        keycloak_stack, "carol", "guess", source, client_id="authpipe-fail-closed"
    )
    assert (status, body["error"], headers["Retry-After"]) == (429, "too_many_requests", "1")
    status, _, body = grant(
        keycloak_stack, "carol", "guess", source, client_id="authpipe-fail-open"
    )
    assert (status, body["error"]) == (401, "invalid_grant")
    assert time.monotonic() - started < 3.0
    assert [summary(r) for r in records_from(keycloak_stack, source, 2)] == [
        ("carol", "login", "failure", "refused", None),
        ("carol", "login", "failure", "bad_password", None),
    ]


def solve(challenge: dict[str, Any]) -> str:
    """What the ALTCHA widget posts for ``challenge`` (the proof of work, done here)."""
    import altcha

    parsed = altcha.Challenge.from_dict(challenge)
    solution = altcha.solve_challenge(parsed)
    assert solution is not None
    return str(altcha.Payload(parsed, solution).to_base64())


def test_a_solved_captcha_lets_the_password_be_tried(keycloak_stack: KeycloakStack) -> None:
    """The grant's 401 carries a challenge; its solution lets the password be checked (then
    the edge's step-up); the browser's page solved the same way leads to the password page;
    a solution used twice is refused. Each answer is reported as a captcha challenge."""
    source = "203.0.113.16"
    decide(keycloak_stack, source, action="challenge", challenge="captcha")
    status, _, body = grant(keycloak_stack, "carol", "guess", source)
    assert (status, body["error"]) == (401, "captcha_required")
    payload = solve(body["captcha_challenge"])
    status, _, body = grant(
        keycloak_stack, "carol", "guess", source, **{"authpipe-captcha": payload}
    )
    assert (status, body["error"]) == (401, "invalid_grant")
    status, _, body = grant(
        keycloak_stack, "carol", "guess", source, **{"authpipe-captcha": payload}
    )
    assert (status, body["error_description"]) == (401, "the CAPTCHA answer was not accepted")
    browser = Browser(keycloak_stack, source)
    page = browser.submit(browser.start(), {"username": "carol"})
    match = re.search(r'<altcha-widget[^>]*challenge="([^"]+)"', page)
    assert match, page[:2000]
    page = browser.submit(
        page, {"authpipe-captcha": solve(json.loads(html.unescape(match.group(1))))}
    )
    assert 'name="password"' in page
    assert [summary(r) for r in records_from(keycloak_stack, source, 4)] == [
        ("carol", "challenge", "success", None, "captcha"),
        ("carol", "login", "failure", "bad_password", None),
        ("carol", "challenge", "failure", "other", "captcha"),
        ("carol", "challenge", "success", None, "captcha"),
    ]


def test_browser_step_up_with_a_one_time_code(keycloak_stack: KeycloakStack) -> None:
    """The browser flow: username page, the edge's check, password page, the code page;
    the sign-in ends at the client with a code, reported step_up, mfa, success."""
    source = "203.0.113.15"
    browser = Browser(keycloak_stack, source)
    page = browser.submit(browser.start(), {"username": "alice"})
    assert 'name="password"' in page
    page = browser.submit(page, {"password": PASSWORDS["alice"]})
    assert 'name="otp"' in page
    location = browser.submit_redirect(page, {"otp": fresh_totp()})
    assert location.startswith(REDIRECT) and "code=" in location
    records = records_from(keycloak_stack, source, 3)
    assert [summary(r) for r in records] == [
        ("alice", "login", "step_up", None, None),
        ("alice", "mfa", "success", None, None),
        ("alice", "login", "success", None, "step_up"),
    ]
    assert records[0]["device_id"] == records[2]["device_id"] and len(records[0]["device_id"]) == 32
    assert [r["device_trusted"] for r in records] == [False, False, False]
    # The same browser again (its session forgotten): the device passed a step-up, so it is
    # trusted: no code asked, the sign-in reported from a trusted device.
    browser.forget_session()
    page = browser.submit(browser.start(), {"username": "alice"})
    location = browser.submit_redirect(page, {"password": PASSWORDS["alice"]})
    assert location.startswith(REDIRECT) and "code=" in location
    again = records_from(keycloak_stack, source, 4)[3]
    assert summary(again) == ("alice", "login", "success", None, None)
    assert (again["device_id"], again["device_trusted"]) == (records[0]["device_id"], True)


def session_of(stack: KeycloakStack, location: str) -> str:
    """The user session id (``sid``) of the sign-in whose redirect is ``location``: its code
    exchanged at the token endpoint, the access token's claim read."""
    code = urllib.parse.parse_qs(urllib.parse.urlparse(location).query)["code"][0]
    form = {
        "grant_type": "authorization_code",
        "client_id": CLIENT,
        "code": code,
        "redirect_uri": REDIRECT,
    }
    status, _, text = _request(stack.token_url, form)
    assert status == 200, text[:500]
    payload = json.loads(text)["access_token"].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims["sid"])


def test_a_forced_re_authentication_is_uia(keycloak_stack: KeycloakStack) -> None:
    """A signed-in browser sent back with prompt=login types its password again: the
    sign-in is published as flow uia carrying the user session's id."""
    source = "203.0.113.18"
    browser = Browser(keycloak_stack, source)
    page = browser.submit(browser.start(), {"username": "alice"})
    page = browser.submit(page, {"password": PASSWORDS["alice"]})
    location = browser.submit_redirect(page, {"otp": fresh_totp()})
    signed_in = session_of(keycloak_stack, location)
    page = browser.start(prompt="login")
    if 'name="username"' in page:
        page = browser.submit(page, {"username": "alice"})
    location = browser.submit_redirect(page, {"password": PASSWORDS["alice"]})
    assert location.startswith(REDIRECT) and "code=" in location
    records = records_from(keycloak_stack, source, 4)
    assert [summary(r) for r in records] == [
        ("alice", "login", "step_up", None, None),
        ("alice", "mfa", "success", None, None),
        ("alice", "login", "success", None, "step_up"),
        ("alice", "uia", "success", None, None),
    ]
    assert "session_id" not in records[2]
    assert records[3]["session_id"] == signed_in == session_of(keycloak_stack, location)
    assert records[3]["device_trusted"] is True


def reset_link(stack: KeycloakStack, browser: Browser, user: str) -> str:
    """The reset link Keycloak mails ``user`` after its "forgot password" form."""
    page = browser.submit(browser.start(), {"username": user})
    match = re.search(r'href="([^"]*login-actions/reset-credentials[^"]*)"', page)
    assert match, page[:2000]
    status, page = browser.get(urllib.parse.urljoin(stack.url, html.unescape(match.group(1))))
    assert status == 200, page[:2000]
    since = len(stack.mail.messages)
    browser.submit(page, {"username": user})
    mail = stack.mail.wait_for(f"{user}@example.com", since)
    found = re.search(r"(http://\S+/login-actions/action-token\?\S+)", mail.text)
    assert found, mail.text
    return html.unescape(found.group(1))


def test_reset_links_forged_used_and_completed(keycloak_stack: KeycloakStack) -> None:
    """Keycloak's mailed reset link with its signature forged is refused (400), a reset
    failure for the account it names; the real link resets the password (a reset success);
    the same link again is refused as used (400), a reset failure."""
    source = "203.0.113.19"
    browser = Browser(keycloak_stack, source)
    link = reset_link(keycloak_stack, browser, "carol")
    key = urllib.parse.parse_qs(urllib.parse.urlparse(link).query)["key"][0]
    header, payload, signature = key.split(".")
    flipped = ("B" if signature[0] == "A" else "A") + signature[1:]
    forged = link.replace(key, f"{header}.{payload}.{flipped}")
    status, page = Browser(keycloak_stack, source).get(forged)
    assert status == 400 and "kc-error-message" in page, page[:2000]
    status, headers, _ = _request(link, headers=browser.headers, opener=browser.opener)
    assert status == 302, status
    status, page = browser.get(urllib.parse.urljoin(link, headers["Location"]))
    assert status == 200 and 'name="password-new"' in page, page[:2000]
    same = PASSWORDS["carol"]  # the same password: the realm keeps its users for later sessions
    location = browser.submit_redirect(page, {"password-new": same, "password-confirm": same})
    assert location.startswith(REDIRECT) and "code=" in location
    status, page = browser.get(link)
    assert status == 400 and "Action expired" in page, page[:2000]
    assert [summary(r) for r in records_from(keycloak_stack, source, 3)] == [
        ("carol", "reset", "failure", "other", None),
        ("carol", "reset", "success", None, None),
        ("carol", "reset", "failure", "other", None),
    ]


class _LoopbackIsSecure(http.cookiejar.DefaultCookiePolicy):
    """Browsers treat http://127.0.0.1 as a secure context and send it Secure cookies
    (Keycloak marks its SameSite=None cookies Secure); the standard jar does not."""

    def return_ok_secure(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return True


class Browser:
    """Keycloak's login pages driven with a cookie jar (no JavaScript)."""

    def __init__(self, stack: KeycloakStack, source: str) -> None:
        self.stack = stack
        self.headers = {"X-Forwarded-For": source}
        self.jar = http.cookiejar.CookieJar(_LoopbackIsSecure())
        self.opener = urllib.request.build_opener(
            _Stay(), urllib.request.HTTPCookieProcessor(self.jar)
        )

    def forget_session(self) -> None:
        """Drop every cookie but the device's (a new visit of the same browser)."""
        for cookie in list(self.jar):
            if cookie.name != "AUTHPIPE_DEVICE":
                self.jar.clear(cookie.domain, cookie.path, cookie.name)

    def start(self, **extra: str) -> str:
        query = urllib.parse.urlencode(
            {
                "client_id": CLIENT,
                "redirect_uri": REDIRECT,
                "response_type": "code",
                "scope": "openid",
                **extra,
            }
        )
        url = f"{self.stack.url}/realms/authpipe/protocol/openid-connect/auth?{query}"
        status, _, page = _request(url, headers=self.headers, opener=self.opener)
        assert status == 200, page[:500]
        return page

    def get(self, url: str) -> tuple[int, str]:
        status, _, page = _request(url, headers=self.headers, opener=self.opener)
        return status, page

    def _post(self, page: str, fields: dict[str, str]) -> tuple[int, dict[str, str], str]:
        match = re.search(r'<form[^>]*action="([^"]+)"', page)
        assert match, page[:2000]
        return _request(html.unescape(match.group(1)), fields, self.headers, self.opener)

    def submit_status(self, page: str, fields: dict[str, str]) -> tuple[int, str]:
        status, _, text = self._post(page, fields)
        return status, text

    def submit(self, page: str, fields: dict[str, str]) -> str:
        status, text = self.submit_status(page, fields)
        assert status == 200, (status, text[:2000])
        return text

    def submit_redirect(self, page: str, fields: dict[str, str]) -> str:
        status, headers, text = self._post(page, fields)
        assert status == 302, (status, text[:2000])
        return headers["Location"]
