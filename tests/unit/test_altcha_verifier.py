"""The example login service's ALTCHA CAPTCHA (issue 47 item 2), without a browser: the
server-side check's exact verdicts (valid, wrong key, expired, replayed, malformed, never
an exception), the key's and the widget file's errors, the page, and the login page's
POST: a solved payload signs in, a missing, forged or spent one does not."""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import altcha
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pipeline.contracts.codec import decode_attempt, dumps
from tests.unit.test_edge_examples import PASSWORD, login_service

KEY = "unit-test-altcha-hmac-key-0123456789abcdef"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def solve(challenge: dict[str, Any]) -> str:
    """What the widget posts for ``challenge``: base64 of the challenge and its solution."""
    parsed = altcha.Challenge.from_dict(challenge)
    solution = altcha.solve_challenge(parsed)
    assert solution is not None
    return altcha.Payload(parsed, solution).to_base64()


def reencode(payload: str, change: Any) -> str:
    data = json.loads(base64.b64decode(payload))
    change(data)
    return base64.b64encode(json.dumps(data).encode()).decode()


@pytest.fixture(scope="module")
def made() -> tuple[Any, str, str]:
    """One verifier's challenge solved (at T0), and one signed with another key."""
    issuer = login_service.AltchaCaptcha(KEY, clock=lambda: T0)
    other = login_service.AltchaCaptcha("x" * 32, clock=lambda: T0)
    return issuer, solve(issuer.challenge()), solve(other.challenge())


def test_a_solved_challenge_passes_once(made: tuple[Any, str, str]) -> None:
    """The widget's payload is ok once; the same payload again, and again, is replayed."""
    _, payload, _ = made
    verifier = login_service.AltchaCaptcha(KEY, clock=Clock())
    assert [verifier.check(payload) for _ in range(3)] == ["ok", "replayed", "replayed"]


def test_the_exact_refusals(made: tuple[Any, str, str]) -> None:
    """Another key's challenge, a lowered cost, a wrong counter, an altered key: each its
    reason, and none of them uses the challenge up (the right payload passes after)."""
    _, payload, foreign = made
    verifier = login_service.AltchaCaptcha(KEY, clock=Clock())

    def cost(d: dict[str, Any]) -> None:
        d["challenge"]["parameters"]["cost"] = 1

    def counter(d: dict[str, Any]) -> None:
        d["solution"]["counter"] += 1

    def derived(d: dict[str, Any]) -> None:
        d["solution"]["derivedKey"] = "00" * 32

    assert [
        verifier.check(foreign),
        verifier.check(reencode(payload, cost)),
        verifier.check(reencode(payload, counter)),
        verifier.check(reencode(payload, derived)),
        verifier.check(payload),
    ] == ["bad_signature", "bad_signature", "bad_solution", "bad_solution", "ok"]


def test_a_challenge_expires_after_its_ttl(made: tuple[Any, str, str]) -> None:
    """Issued at T0 for 600 s: ok at T0 + 599.9, expired at T0 + 600 (and after)."""
    _, payload, _ = made
    clock = Clock()
    clock.now = T0 + 600
    late = login_service.AltchaCaptcha(KEY, clock=clock)
    assert late.check(payload) == "expired"
    clock.now = T0 + 599.9
    assert late.check(payload) == "ok"
    assert login_service.ALTCHA_TTL_S == 600


def test_the_replay_memory_ends_with_the_challenge_and_is_bounded() -> None:
    """An accepted challenge is forgotten once it has expired (it is refused as expired
    from then on), and at most max_entries are kept, the oldest dropped first."""
    clock = Clock()
    verifier = login_service.AltchaCaptcha(KEY, clock=clock, ttl_s=60, max_entries=2)
    payloads = [solve(verifier.challenge()) for _ in range(3)]
    assert [verifier.check(p) for p in payloads] == ["ok", "ok", "ok"]
    assert len(verifier._used) == 2
    assert verifier.check(payloads[0]) == "ok"  # dropped: the bound's price, documented
    clock.now += 60
    assert verifier.check(payloads[1]) == "expired"
    assert verifier.check(solve(verifier.challenge())) == "ok"
    assert len(verifier._used) == 1  # the expired ones went


@pytest.mark.parametrize(
    "payload",
    [
        None,
        17,
        "",
        "!!!!",
        "e30",  # "{}" without its padding
        base64.b64encode(b"{}").decode(),
        base64.b64encode(b"[]").decode(),
        base64.b64encode(b'{"challenge": {}, "solution": {}}').decode(),
        base64.b64encode(b'{"challenge": null, "solution": null, "test": true}').decode(),
        base64.b64encode(b"\xff\xfe").decode(),
        base64.b64encode(b"[" * 5000).decode(),
        "A" * 5000,
    ],
)
def test_malformed_payloads_are_refused_without_an_exception(payload: Any) -> None:
    """Not base64, not JSON, not an object, missing parts, the widget's test mode, bad
    UTF-8, deep nesting, over 4,096 characters: each malformed, nothing raised."""
    assert login_service.AltchaCaptcha(KEY).check(payload) == "malformed"


def test_a_missing_or_short_key_is_refused_with_what_to_do() -> None:
    """No AUTHPIPE_ALTCHA_HMAC_KEY, or one under 32 bytes, is a CaptchaConfigError naming
    the variable, the length and how to make one; 32 bytes will do."""
    with pytest.raises(login_service.CaptchaConfigError) as missing:
        login_service.AltchaCaptcha.from_env({})
    assert "AUTHPIPE_ALTCHA_HMAC_KEY is not set" in str(missing.value)
    assert "at least 32 bytes" in str(missing.value) and "token_urlsafe" in str(missing.value)
    with pytest.raises(login_service.CaptchaConfigError) as short:
        login_service.AltchaCaptcha.from_env({"AUTHPIPE_ALTCHA_HMAC_KEY": "k" * 31})
    assert "is 31 bytes" in str(short.value) and "at least 32 random bytes" in str(short.value)
    assert login_service.AltchaCaptcha.from_env({"AUTHPIPE_ALTCHA_HMAC_KEY": "k" * 32}).key == (
        b"k" * 32
    )


def test_a_missing_widget_file_says_to_vendor_it(tmp_path: Path) -> None:
    """The widget's script missing is a CaptchaConfigError naming scripts/altcha-widget."""
    env = {"AUTHPIPE_ALTCHA_WIDGET_JS": str(tmp_path / "altcha.min.js")}
    with pytest.raises(login_service.CaptchaConfigError, match="run scripts/altcha-widget"):
        login_service.altcha_widget_js(env)


def test_the_page_embeds_the_challenge_escaped() -> None:
    """The widget's challenge attribute reads back as the challenge's JSON; the script comes
    from the service itself; no widget without a challenge."""
    challenge = login_service.AltchaCaptcha(KEY).challenge_json()
    page = login_service.login_page('bob"><script>', challenge)
    attribute = re.search(r'challenge="([^"]*)"', page)
    assert attribute is not None and json.loads(html.unescape(attribute[1])) == json.loads(
        challenge
    )
    assert '<script type="module" src="/altcha/altcha.min.js"></script>' in page
    assert 'value="bob&quot;&gt;&lt;script&gt;"' in page
    assert "altcha" not in login_service.login_page("bob")


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], list[Any]]]:
    """The login page in front of a stub edge that asks every attempt for a CAPTCHA."""

    async def check(request: web.Request) -> web.Response:
        answer = {"allowed": True, "retry_after_ms": 0, "challenge": "captcha"}
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    edge_app = web.Application()
    edge_app.router.add_post("/v1/check", check)
    edge = TestServer(edge_app)
    await edge.start_server()
    widget = tmp_path / "altcha.min.js"
    widget.write_text("/* the widget */")
    events: list[Any] = []

    async def report(event: dict[str, Any]) -> None:
        events.append(decode_attempt(dumps(event)))

    users = {"bob": login_service.hash_password(PASSWORD)}
    captcha = login_service.AltchaCaptcha(KEY)
    app = login_service.login_app(str(edge.make_url("")), users, captcha, report, None, widget)
    async with TestClient(TestServer(app)) as http:
        yield http, events
    await edge.close()


async def test_the_login_page_signs_in_only_with_a_fresh_solution(
    client: tuple[TestClient[Any, Any], list[Any]],
) -> None:
    """No payload: 401 and the widget, nothing reported. The page's challenge solved: signed
    in (a challenge success, then the login). The same payload again: 403, a challenge
    failure, the password never checked. The widget's file is served as is."""
    http, events = client
    form = {"account": "bob", "password": PASSWORD}
    first = await http.post("/login", data=form)
    page = await first.text()
    assert (first.status, "<altcha-widget" in page, events) == (401, True, [])
    attribute = re.search(r'challenge="([^"]*)"', page)
    assert attribute is not None
    payload = solve(json.loads(html.unescape(attribute[1])))
    signed_in = await http.post("/login", data={**form, "altcha": payload})
    assert (signed_in.status, 'data-result="signed-in"' in await signed_in.text()) == (200, True)
    again = await http.post("/login", data={**form, "altcha": payload})
    assert (again.status, "did not pass" in await again.text()) == (403, True)
    assert [(e.flow, e.challenge, e.outcome, e.failure_reason) for e in events] == [
        ("challenge", "captcha", "success", None),
        ("login", None, "success", None),
        ("challenge", "captcha", "failure", "other"),
    ]
    script = await http.get("/altcha/altcha.min.js")
    assert (script.status, script.content_type, await script.text()) == (
        200,
        "text/javascript",
        "/* the widget */",
    )
