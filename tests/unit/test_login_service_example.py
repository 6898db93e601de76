"""The example login service's trust boundaries (issue 26 item 15): the notice consumer's
Kafka options and digest are authpipe's own, unlock links are single-use, short-lived and
bound to account and device, one bad notice stops no mail, and the edge's ``challenge``
(captcha before the password, step_up after it) is honoured and reported."""

from __future__ import annotations

import sys
import types
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pipeline.contracts.codec import decode_attempt, dumps
from pipeline.core.keys import Digester
from pipeline.kafka_client import client_kwargs
from pipeline.settings import Settings, load_settings
from pipeline.wiring import build_normaliser
from tests.conftest import TEST_DIGEST_KEY
from tests.unit.test_edge_examples import PASSWORD, login_service

Events = list[dict[str, Any]]


def _notice(account_digest: str, notice_id: str = "n1", tenant: str = "default") -> bytes:
    return orjson.dumps(
        {
            "notice_id": notice_id,
            "tenant": tenant,
            "account_digest": account_digest,
            "reason": "consecutive_lock",
            "expires_at": "2026-12-02T03:00:00.000Z",
            "window_start": "2026-12-02T02:00:00.000Z",
            "window_end": "2026-12-02T03:00:00.000Z",
            "policy_version": "default-1",
        }
    )


# -- the notices --------------------------------------------------------------------------


def test_the_notice_consumer_uses_authpipes_kafka_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """notices_consumer passes the consumer exactly client_kwargs(settings.kafka): the
    bootstrap servers and the TLS/SASL options every authpipe client uses."""
    for name, value in {
        "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": "kafka-1.internal:9094",
        "AUTHPIPE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "AUTHPIPE_KAFKA_SASL_USERNAME": "login-service",
        "AUTHPIPE_KAFKA_SASL_PASSWORD": "s3cret-from-the-vault",
    }.items():
        monkeypatch.setenv(name, value)
    made: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    fake = types.ModuleType("aiokafka")
    fake.AIOKafkaConsumer = lambda *args, **kwargs: made.append((args, kwargs))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aiokafka", fake)
    login_service.notices_consumer()
    ((args, kwargs),) = made
    assert args == ("auth.account-notices",)
    expected = client_kwargs(load_settings().kafka)
    assert {k: kwargs[k] for k in expected} == expected
    assert (kwargs["security_protocol"], kwargs["sasl_plain_username"]) == (
        "SASL_PLAINTEXT",
        "login-service",
    )


@pytest.mark.parametrize(
    ("settings", "tenant", "typed", "registered"),
    [
        ({}, "default", "al\u00adice@example.com", "Alice@Example.com"),  # soft hyphen
        ({}, "default", "alice\u200b@example.com", "alice@example.com"),  # zero-width space
        ({"ingest": {"case_sensitive_tenants": ["acme"]}}, "acme", "Bob", "Bob"),
    ],
)
async def test_the_mailer_digests_as_the_worker_does(
    settings: dict[str, Any], tenant: str, typed: str, registered: str
) -> None:
    """A notice for the account as the attacker typed it reaches its owner: the digest
    strips ignorable characters and keeps case-sensitive tenants' case, as the worker."""
    config = Settings(identity={"digest_key": TEST_DIGEST_KEY}, **settings)
    normaliser = build_normaliser(config)
    digest = normaliser.account_digest(tenant, typed)  # what the worker's notice names
    sent: list[str] = []

    async def send(to: str, subject: str, body: str) -> None:
        sent.append(to)

    mailer = login_service.NoticeMailer.for_users(tenant, [registered], send, normaliser)
    assert await mailer.handle(orjson.loads(_notice(digest, tenant=tenant))) is True
    assert sent == [registered]
    if tenant == "acme":  # a case-folded digest would not be the worker's
        assert digest != Digester(TEST_DIGEST_KEY).account("acme", "bob")


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_an_unlock_link_is_single_use_short_lived_and_bound() -> None:
    """A link signs in its own account once, within 15 minutes, and trusts only the
    device that redeemed it; another account, a second use or a late use fail."""
    clock = _Clock()
    links = login_service.UnlockLinks(clock=clock)
    token = links.link("default", "alice@example.com").rsplit("t=", 1)[1]
    assert links.redeem(token, "default", "mallory@example.com", "dev-m") is False
    token = links.link("default", "alice@example.com").rsplit("t=", 1)[1]
    assert links.redeem(token, "default", "alice@example.com", "dev-a") is True
    assert links.redeem(token, "default", "alice@example.com", "dev-b") is False
    assert links.trusted == {("default", "alice@example.com", "dev-a")}
    late = links.link("default", "alice@example.com").rsplit("t=", 1)[1]
    clock.now += login_service.UNLOCK_TTL_S
    assert links.redeem(late, "default", "alice@example.com", "dev-a") is False
    assert login_service.UNLOCK_TTL_S == 900


class _Message:
    def __init__(self, offset: int, value: bytes | None) -> None:
        self.offset, self.value = offset, value


async def test_one_bad_notice_stops_no_mail() -> None:
    """Not JSON, not an object, missing fields, a null value and a mail that fails are
    each skipped; the good notices before and after them are all mailed."""
    normaliser = build_normaliser(Settings(identity={"digest_key": TEST_DIGEST_KEY}))
    users = ["alice@example.com", "bob@example.com", "carol@example.com"]
    digest = {user: normaliser.account_digest("default", user) for user in users}
    sent: list[str] = []

    async def send(to: str, subject: str, body: str) -> None:
        if to == "bob@example.com":
            raise OSError("mail server down")
        sent.append(to)

    values = [
        _notice(digest["alice@example.com"], "n1"),
        b"not json",
        b"[1, 2]",
        orjson.dumps({"notice_id": "n9", "tenant": "default"}),
        None,
        _notice(digest["bob@example.com"], "n2"),
        _notice(digest["carol@example.com"], "n3"),
    ]

    async def consumer() -> AsyncIterator[_Message]:
        for offset, value in enumerate(values):
            yield _Message(offset, value)

    mailer = login_service.NoticeMailer.for_users("default", users, send, normaliser)
    await login_service.consume_notices(consumer(), mailer)
    assert sent == ["alice@example.com", "carol@example.com"]


# -- the edge's challenge -------------------------------------------------------------------


@pytest.fixture
async def edge() -> AsyncIterator[tuple[str, list[Any]]]:
    """A stub edge answering each check with the next queued JSON body (the last repeats);
    the list it returns is the queue."""
    answers: list[Any] = []

    async def check(request: web.Request) -> web.Response:
        body = answers.pop(0) if len(answers) > 1 else answers[0]
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/check", check)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")), answers
    finally:
        await server.close()


async def _run(url: str, attempt: Any, **kw: Any) -> tuple[Any, Events, list[str]]:
    """One login; (result, events, hashes verified)."""
    events: Events = []
    verified: list[str] = []
    real = login_service.verify_password

    def counting(password: str, stored: str) -> bool:
        verified.append(stored)
        return bool(real(password, stored))

    async def report(event: dict[str, Any]) -> None:
        events.append(event)

    login_service.verify_password, saved = counting, login_service.verify_password
    try:
        async with aiohttp.ClientSession() as session:
            client = login_service.EdgeClient(session, url)
            result = await login_service.login(attempt, client, USERS, report, **kw)
    finally:
        login_service.verify_password = saved
    return result, events, verified


USERS = {"bob": login_service.hash_password(PASSWORD)}
CAPTCHA = {"allowed": True, "retry_after_ms": 0, "challenge": "captcha"}
STEP_UP = {"allowed": True, "retry_after_ms": 0, "challenge": "step_up"}


def _bob(**kw: Any) -> Any:
    return login_service.Attempt("bob", PASSWORD, "198.51.100.7", device_id="dev-1", **kw)


def _shape(events: Events) -> list[tuple[str, str | None, str, str | None]]:
    """(flow, challenge, outcome, failure_reason) of each event, each a valid login_attempt."""
    decoded = [decode_attempt(dumps(event)) for event in events]
    return [(e.flow, e.challenge, e.outcome, e.failure_reason) for e in decoded]


async def test_a_captcha_is_demanded_before_the_password(edge: tuple[str, list[Any]]) -> None:
    """challenge=captcha: without an answer the demand goes back (no hash, no event); a
    wrong answer is a challenge failure event and no hash; a right one a challenge success
    event, then the password is checked (one hash) and reported."""
    url, answers = edge
    answers.append(CAPTCHA)
    captcha = login_service.StubCaptcha()
    result, events, verified = await _run(url, _bob(), captcha=captcha)
    assert (result.ok, result.challenge, events, verified) == (False, "captcha", [], [])
    result, events, verified = await _run(url, _bob(captcha_response="forged"), captcha=captcha)
    assert (result.ok, result.challenge, verified) == (False, "captcha", [])
    assert _shape(events) == [("challenge", "captcha", "failure", "other")]
    solved = captcha.solved("198.51.100.7")
    result, events, verified = await _run(url, _bob(captcha_response=solved), captcha=captcha)
    assert (result.ok, result.challenge, verified) == (True, None, [USERS["bob"]])
    assert _shape(events) == [
        ("challenge", "captcha", "success", None),
        ("login", None, "success", None),
    ]


async def test_a_step_up_demands_a_second_factor_after_the_password(
    edge: tuple[str, list[Any]],
) -> None:
    """challenge=step_up, right password, untrusted device: not signed in yet, reported
    outcome=step_up (not a sign-in); a mailed code finishes it once (an mfa success,
    then the completed sign-in with challenge=step_up); the ticket's second use fails
    (bad_second_factor). A trusted device is signed in at once."""
    url, answers = edge
    answers.append(STEP_UP)
    codes: list[str] = []

    async def mail(to: str, subject: str, body: str) -> None:
        codes.append(body.rsplit(" ", 1)[1].rstrip("."))

    step_ups = login_service.StepUps(mail)
    result, events, _ = await _run(url, _bob(), step_ups=step_ups)
    assert (result.ok, result.challenge, len(codes)) == (False, "step_up", 1)
    assert _shape(events) == [("login", None, "step_up", None)]
    mfa: Events = []

    async def report(event: dict[str, Any]) -> None:
        mfa.append(event)

    async with aiohttp.ClientSession() as session:
        client = login_service.EdgeClient(session, url)
        for _ in range(2):
            done = await login_service.finish_step_up(
                _bob(), result.step_up_ticket, codes[0], client, step_ups, report
            )
            mfa.append({"ok": done.ok})
    assert [m["ok"] for m in mfa if "ok" in m] == [True, False]
    assert _shape([m for m in mfa if "ok" not in m]) == [
        ("mfa", None, "success", None),
        ("login", "step_up", "success", None),
        ("mfa", None, "failure", "bad_second_factor"),
    ]
    trusted, events, _ = await _run(url, _bob(device_trusted=True), step_ups=step_ups)
    assert (trusted.ok, trusted.challenge, len(codes)) == (True, None, 1)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"allowed": True, "retry_after_ms": 0}, (True, None)),  # an older edge
        ({"allowed": True, "retry_after_ms": 0, "challenge": None}, (True, None)),
        ({"allowed": True, "challenge": "puzzle"}, (False, "captcha")),  # unknown: a CAPTCHA
        ({"allowed": "yes"}, (True, None)),  # not an answer: fails open (FAIL_OPEN)
        ([True], (True, None)),
        ({"allowed": False, "retry_after_ms": 5000, "challenge": "captcha"}, (False, None)),
    ],
)
async def test_the_check_is_read_defensively(
    edge: tuple[str, list[Any]], answer: Any, expected: tuple[bool, str | None]
) -> None:
    """A missing or null challenge is none; an unknown kind asks for a CAPTCHA; a body
    without a boolean allowed is an edge failure (fail open here); a refusal wins."""
    url, answers = edge
    answers.append(answer)
    result, _, _ = await _run(url, _bob(), captcha=login_service.StubCaptcha())
    assert (result.ok, result.challenge) == expected


async def test_a_young_unchallenged_session_is_reviewed_and_suspended_on_step_up() -> None:
    """An untrusted sign-in that met no challenge asks GET /v1/session with its sign-in
    time on its requests: step_up suspends it with a mailed code (a step-up ticket); no
    answer lets it go on; a trusted device's sign-in, or one past REVIEW_S, is not asked."""
    asked: list[dict[str, str]] = []
    verdicts = [{"challenge": None}, {"challenge": "step_up"}]

    async def check(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(ALLOWED_ANSWER), content_type="application/json")

    async def session(request: web.Request) -> web.Response:
        asked.append(dict(request.query))
        body = verdicts.pop(0)
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/check", check)
    app.router.add_get("/v1/session", session)
    server = TestServer(app)
    await server.start_server()
    codes: list[str] = []

    async def mail(to: str, subject: str, body: str) -> None:
        codes.append(body)

    step_ups = login_service.StepUps(mail)
    try:
        url = str(server.make_url(""))
        signed_in, _, _ = await _run(url, _bob())
        trusted, _, _ = await _run(url, _bob(device_trusted=True))
        assert (signed_in.ok, trusted.ok, trusted.review_from_ms) == (True, True, None)
        async with aiohttp.ClientSession() as http:
            client = login_service.EdgeClient(http, url)
            first = await login_service.review_session(_bob(), signed_in, client, step_ups)
            second = await login_service.review_session(_bob(), signed_in, client, step_ups)
            late = await login_service.review_session(
                _bob(), signed_in, client, step_ups, now_s=lambda: 1e12
            )
    finally:
        await server.close()
    assert first is None and late is None
    assert (second.ok, second.challenge, len(codes)) == (False, "step_up", 1)
    assert second.step_up_ticket is not None
    assert [q["signed_in_at_ms"] for q in asked] == [str(signed_in.review_from_ms)] * 2
    assert (asked[0]["account"], asked[0]["ip"], asked[0]["device"]) == (
        "bob",
        "198.51.100.7",
        "dev-1",
    )


ALLOWED_ANSWER = {"allowed": True, "retry_after_ms": 0, "challenge": None}


# -- the backtest's model of this service (issue 44 item 6) ------------------------------


@pytest.mark.parametrize(
    ("answer", "password_right", "code_right"),
    [
        ({**STEP_UP, "step_up": True}, True, True),  # a person: the code passes
        ({**STEP_UP, "step_up": True}, True, False),  # a bot: the code fails
        ({**STEP_UP, "step_up": True}, False, True),  # a wrong password never reaches it
        ({"allowed": True, "retry_after_ms": 0, "challenge": None, "step_up": False}, True, True),
        (
            {"allowed": False, "retry_after_ms": 5000, "challenge": None, "step_up": False},
            True,
            True,
        ),
    ],
)
async def test_the_backtests_gateway_model_reports_what_this_service_reports(
    edge: tuple[str, list[Any]], answer: dict[str, Any], password_right: bool, code_right: bool
) -> None:
    """pipeline.sim.gateway.reported (what backtest --verdicts feeds the engine) gives the
    (flow, outcome, failure_reason) sequence this service reports, step-up included."""
    from pipeline.core.decisions import Verdict
    from pipeline.sim.gateway import reported
    from tests.unit.test_core_support import att

    url, answers = edge
    answers.append(answer)
    codes: list[str] = []

    async def mail(to: str, subject: str, body: str) -> None:
        codes.append(body.rsplit(" ", 1)[1].rstrip("."))

    step_ups = login_service.StepUps(mail)
    attempt = (
        _bob()
        if password_right
        else login_service.Attempt("bob", "wrong", "198.51.100.7", device_id="dev-1")
    )
    result, events, _ = await _run(url, attempt, step_ups=step_ups)
    if result.step_up_ticket is not None:
        async with aiohttp.ClientSession() as session:
            client = login_service.EdgeClient(session, url)
            answers.append({"allowed": True, "retry_after_ms": 0, "challenge": None})
            code = codes[0] if code_right else "000000"
            await login_service.finish_step_up(
                attempt,
                result.step_up_ticket,
                code,
                client,
                step_ups,
                lambda e: _append(events, e),
            )
    service = [(f, o, r) for f, _, o, r in _shape(events)]
    verdict = Verdict(
        answer["allowed"],
        answer["retry_after_ms"],
        None,
        None,
        answer["challenge"],
        None,
        answer["step_up"],
    )
    recorded = att(0, success=password_right, reason=None if password_right else "bad_password")
    model = reported(recorded, verdict, bot=not code_right)
    outcome = {True: "success", False: "failure"}
    assert service == [
        (
            a.flow,
            "step_up" if a.failure_reason == "step_up" else outcome[a.success],
            None if a.failure_reason == "step_up" else a.failure_reason,
        )
        for a in model
    ]


async def _append(events: Events, event: dict[str, Any]) -> None:
    events.append(event)
