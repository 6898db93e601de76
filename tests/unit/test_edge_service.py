"""The edge's HTTP service (issue 6) over an in-memory view: every endpoint, 400s, 401,
503 before readiness, ETag/304, the long poll and the event stream pushing within a second."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CONTENT_TYPE_LATEST
from yarl import URL

from pipeline.core.keys import format_key
from pipeline.edge.fastpath import EdgeSite
from pipeline.edge.handlers import BATCH_MAX_CHECKS, EDGE_KEY, create_app
from pipeline.edge.http_input import CHECK_FIELDS
from pipeline.edge.view import DecisionView
from tests.unit.test_edge_support import (
    ACCOUNT,
    MIN,
    PEER,
    PROXY,
    T0,
    Clock,
    account_key,
    account_source_key,
    edge_logs,
    message,
    new_view,
    source_key,
    tombstone,
)

TOKEN = "s3cret-edge-token"
PUSH_DEADLINE_S = 1.0
ALLOWED = {"allowed": True, "retry_after_ms": 0, "challenge": None, "step_up": False}


class FakeHealth:
    """A feed's health, set by the test."""

    def __init__(self) -> None:
        self.is_ready = True

    def ready(self) -> bool:
        return self.is_ready

    def not_ready_reason(self) -> str | None:
        return None if self.is_ready else "topic 'auth.throttle-decisions' does not exist"

    def lag_messages(self) -> int:
        return 0 if self.is_ready else 42

    def staleness_ms(self) -> int | None:
        return 150


@dataclass
class Edge:
    view: DecisionView
    clock: Clock
    health: FakeHealth
    client: TestClient  # type: ignore[type-arg]

    async def get_json(self, path: str, status: int = 200, **kw: object) -> object:
        response = await self.client.get(path, **kw)  # type: ignore[arg-type]
        assert response.status == status, await response.text()
        return orjson.loads(await response.read())

    async def post_json(self, path: str, body: object, status: int = 200) -> object:
        response = await self.client.post(path, data=orjson.dumps(body))
        assert response.status == status, await response.text()
        return orjson.loads(await response.read())


class FastPathServer(TestServer):
    """The test server listening through ``EdgeSite``, as ``authpipe edge serve`` does."""

    async def start_server(self, loop: object = None, **kwargs: Any) -> None:
        if self.runner:
            return
        self.runner = await self._make_runner(handler_cancellation=True, **kwargs)
        await self.runner.setup()
        assert isinstance(self.runner, web.AppRunner)
        site = EdgeSite(
            self.runner, self.host, 0, edge=self.runner.app[EDGE_KEY], known=CHECK_FIELDS
        )
        await site.start()
        self.port, self.scheme = site.port, "http"
        self._root = URL(f"http://{self.host}:{self.port}")


SITES = {"aiohttp": TestServer, "fast_path": FastPathServer}


async def _start(token: str | None, site: str) -> Edge:
    clock = Clock()
    view = new_view(clock)
    health = FakeHealth()
    client = TestClient(SITES[site](create_app(view, health, token=token)))
    await client.start_server()
    return Edge(view, clock, health, client)


# Every test runs against aiohttp's own site and against the fast path's (whose requests
# other than plain checks are handed to the same aiohttp app).
@pytest.fixture(params=sorted(SITES))
async def edge(request: pytest.FixtureRequest) -> AsyncIterator[Edge]:
    harness = await _start(None, request.param)
    try:
        yield harness
    finally:
        await harness.client.close()


@pytest.fixture(params=sorted(SITES))
async def guarded(request: pytest.FixtureRequest) -> AsyncIterator[Edge]:
    harness = await _start(TOKEN, request.param)
    try:
        yield harness
    finally:
        await harness.client.close()


def check_url(**params: str) -> str:
    query = {"account": ACCOUNT, "ip": PEER, **params}
    return "/v1/check?" + "&".join(f"{k}={quote(v)}" for k, v in query.items())


# -- checks ------------------------------------------------------------------------------


async def test_get_check_allows_then_refuses_with_nothing_else(edge: Edge) -> None:
    """GET /v1/check answers exactly {allowed, retry_after_ms, challenge, step_up}: allowed, then refused."""
    assert await edge.get_json(check_url()) == ALLOWED
    edge.view.apply(*message(account_key(), T0 + 10 * MIN))
    edge.clock.now = T0 + 4 * MIN
    assert await edge.get_json(check_url()) == {
        "allowed": False,
        "retry_after_ms": 6 * MIN,
        "challenge": None,
        "step_up": False,
    }


async def test_get_check_uses_forwarded_for_trusted_device_and_flow(edge: Edge) -> None:
    """forwarded_for behind a trusted proxy, trusted devices and flows reach the core check."""
    edge.view.apply(*message(account_source_key("203.0.113.9"), T0 + 10 * MIN))
    xff = "198.51.100.1, 203.0.113.9"
    refused = {"allowed": False, "retry_after_ms": 10 * MIN, "challenge": None, "step_up": False}
    assert await edge.get_json(check_url(ip=PROXY, forwarded_for=xff)) == refused
    assert await edge.get_json(check_url(ip=PROXY, forwarded_for=xff, flow="token")) == refused
    trusted = check_url(ip=PROXY, forwarded_for=xff, device="laptop", trusted="true")
    assert await edge.get_json(trusted) == ALLOWED
    assert await edge.get_json(check_url(ip=PROXY, forwarded_for=xff, flow="uia")) == ALLOWED
    assert await edge.get_json(check_url(ip="203.0.113.9", tenant="acme")) == ALLOWED


async def test_post_check_and_batch(edge: Edge) -> None:
    """POST /v1/check takes a JSON object; the batch form answers a list in order."""
    edge.view.apply(*message(account_key(), T0 + 2 * MIN))
    body = {"account": ACCOUNT, "ip": PROXY, "forwarded_for": ["198.51.100.3"], "trusted": False}
    refused = {"allowed": False, "retry_after_ms": 2 * MIN, "challenge": None, "step_up": False}
    assert await edge.post_json("/v1/check", body) == refused
    batch = [body, {"account": "bob", "ip": PEER}, {**body, "device": "d", "trusted": True}]
    assert await edge.post_json("/v1/check/batch", batch) == {
        "results": [refused, ALLOWED, ALLOWED]
    }
    assert await edge.post_json("/v1/check/batch", []) == {"results": []}


def session_url(signed_in_ms: int | str, **params: str) -> str:
    query = {"account": ACCOUNT, "ip": PEER, "signed_in_at_ms": str(signed_in_ms), **params}
    return "/v1/session?" + "&".join(f"{k}={quote(v)}" for k, v in query.items())


async def test_session_review_asks_a_step_up_within_a_waves_lead_in(edge: Edge) -> None:
    """GET /v1/session: a session signed in within a wave's lead-in owes a step-up while the
    wave holds; one signed in before the lead-in, or asked after the wave, owes none."""
    wave = ("tenant", "default", None, None, None)
    edge.view.apply(
        *message(wave, T0 + MIN, action="challenge", challenge="captcha", window_ms=MIN)
    )
    assert await edge.get_json(session_url(T0 - 30_000)) == {"challenge": "step_up"}
    assert await edge.get_json(session_url(T0 - 2 * MIN)) == {"challenge": None}
    edge.clock.now = T0 + MIN
    assert await edge.get_json(session_url(T0 - 30_000)) == {"challenge": None}


async def test_session_review_bad_parameters_are_400(edge: Edge) -> None:
    """A missing, non-numeric or far-future sign-in time, or an unknown parameter, is a 400
    naming it."""
    for url, parameter in [
        (f"/v1/session?account=bob&ip={PEER}", "signed_in_at_ms"),
        (session_url("yesterday"), "signed_in_at_ms"),
        (session_url(T0 + 10 * MIN), "signed_in_at_ms"),
        (session_url(T0, flow="login"), "flow"),
        (session_url(T0, ip="not-an-ip"), "ip"),
    ]:
        body = await edge.get_json(url, status=400)
        assert isinstance(body, dict) and body["parameter"] == parameter, body


@pytest.mark.parametrize(
    ("params", "parameter", "phrase"),
    [
        ({"trusted": "maybe"}, "trusted", "true or false"),
        ({"flow": "bogus"}, "flow", "one of login, uia, mfa, recovery, token, reset, challenge"),
        ({"account": ""}, "account", "required"),
        ({"account": "a" * 321}, "account", "320"),
        ({"account": "   "}, "account", "blank"),
        ({"ip": "not-an-ip"}, "ip", "not an IPv4 or IPv6"),
        ({"ip": "999.1.1.1"}, "ip", "not an IPv4 or IPv6"),
        ({"tenant": "a|b"}, "tenant", "tenant"),
        ({"forwarded_for": ",".join(["192.0.2.1"] * 65)}, "forwarded_for", "64"),
        ({"device": "d" * 257}, "device", "256"),
        ({"acount": "typo"}, "acount", "unknown parameter"),
    ],
)
async def test_malformed_query_is_400_naming_the_parameter(
    edge: Edge, params: dict[str, str], parameter: str, phrase: str
) -> None:
    """Each malformed parameter gets a 400 JSON error naming it with a clear message."""
    body = await edge.get_json(check_url(**params), status=400)
    assert isinstance(body, dict)
    assert (body["error"], body["parameter"]) == ("bad_parameter", parameter)
    assert phrase in body["message"]


async def test_missing_and_repeated_parameters_are_400(edge: Edge) -> None:
    """A missing account or ip, or a parameter given twice, is a 400 naming it."""
    for url, parameter in [
        (f"/v1/check?ip={PEER}", "account"),
        ("/v1/check?account=bob", "ip"),
        (check_url() + "&trusted=true&trusted=false", "trusted"),
    ]:
        body = await edge.get_json(url, status=400)
        assert isinstance(body, dict) and body["parameter"] == parameter, body


@pytest.mark.parametrize(
    ("path", "raw", "parameter"),
    [
        ("/v1/check", b"{not json", "body"),
        ("/v1/check", b"[1]", "body"),
        ("/v1/check", b'{"account": "bob", "ip": "192.0.2.1", "trusted": "true"}', "trusted"),
        ("/v1/check", b'{"account": 7, "ip": "192.0.2.1"}', "account"),
        (
            "/v1/check",
            b'{"account": "bob", "ip": "192.0.2.1", "forwarded_for": [1]}',
            "forwarded_for",
        ),
        ("/v1/check/batch", b'{"account": "bob"}', "body"),
        (
            "/v1/check/batch",
            b'[{"account": "bob", "ip": "192.0.2.1"}, {"account": "x", "ip": "x"}]',
            "[1].ip",
        ),
        ("/v1/check/batch", b"[1]", "[0]"),
    ],
)
async def test_malformed_json_is_400(edge: Edge, path: str, raw: bytes, parameter: str) -> None:
    """Malformed JSON bodies and batch items are 400s naming the field (with its position)."""
    response = await edge.client.post(path, data=raw)
    assert response.status == 400
    body = orjson.loads(await response.read())
    assert body["parameter"] == parameter, body


async def test_batch_over_the_limit_is_400(edge: Edge) -> None:
    """A batch of more than 1000 checks is refused as a whole."""
    batch = [{"account": "bob", "ip": PEER}] * (BATCH_MAX_CHECKS + 1)
    body = await edge.post_json("/v1/check/batch", batch, status=400)
    assert body == {
        "error": "bad_parameter",
        "parameter": "body",
        "message": "a batch holds at most 1000 checks",
    }


@pytest.mark.parametrize(
    "query",
    [
        "account=%ED%A0%80&ip=192.0.2.1",
        "account=%00&ip=192.0.2.1",
        "account=bob&ip=%5B%3A%3A1%5D",
        "account=bob&ip=fe80%3A%3A1%25eth0",
        "account=bob&ip=192.0.2.1&forwarded_for=%2C%2C%2C",
        "account=bob&ip=192.0.2.1&forwarded_for=" + "x" * 5000,
        "account=bob&ip=" + "1" * 5000,
        "account=bob&ip=192.0.2.1&tenant=%F0%9F%98%80",
        "account=bob&ip=192.0.2.1&device=%FF",
        "account=bob&ip=192.0.2.1&flow=",
        "account=bob&ip=192.0.2.1&%ZZ=1",
    ],
)
async def test_odd_input_is_never_a_500(edge: Edge, query: str) -> None:
    """Odd encodings and sizes get a 200 or a 400, never a 500."""
    response = await edge.client.get("/v1/check?" + query)
    assert response.status in (200, 400), await response.text()


async def test_refusal_is_logged_with_key_and_decision_id_not_the_account(edge: Edge) -> None:
    """The refused check logs the decision key and id for operators, never the plain account."""
    edge.view.apply(*message(account_key(), T0 + MIN, decision_id="f" * 32))
    with edge_logs() as logs:
        await edge.get_json(check_url())
    refused = [entry for entry in logs if entry["event"] == "edge_check_refused"]
    assert refused == [
        {
            "component": "edge",
            "event": "edge_check_refused",
            "log_level": "info",
            "key": format_key(account_key()),
            "decision_id": "f" * 32,
            "rule": "account",
            "retry_after_ms": MIN,
        }
    ]
    assert not any(ACCOUNT.lower() in str(entry).lower() for entry in logs)


# -- readiness and auth ------------------------------------------------------------------


async def test_not_ready_is_503_for_checks_and_feed(edge: Edge) -> None:
    """Before the view caught up, checks, the feed and /readyz answer 503 with the feed's reason
    (here: its topic is missing); /healthz 200."""
    edge.health.is_ready = False
    for path in (check_url(), "/v1/blocklist"):
        response = await edge.client.get(path)
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"
        assert orjson.loads(await response.read()) == {
            "error": "not_ready",
            "message": "the decision view is not ready: topic 'auth.throttle-decisions' does "
            "not exist; retry shortly",
        }
    assert await edge.get_json("/readyz", status=503) == {
        "ready": False,
        "lag_messages": 42,
        "staleness_ms": 150,
        "decisions": 0,
        "reason": "topic 'auth.throttle-decisions' does not exist",
    }
    assert await edge.get_json("/healthz") == {"status": "ok"}
    edge.health.is_ready = True
    assert await edge.get_json("/readyz") == {
        "ready": True,
        "lag_messages": 0,
        "staleness_ms": 150,
        "decisions": 0,
    }


async def test_token_is_required_except_for_healthz(guarded: Edge) -> None:
    """With a token set, every endpoint but /healthz answers 401 without the right bearer."""
    for path in (check_url(), "/v1/blocklist", "/readyz", "/metrics", "/v1/blocklist/events"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            response = await guarded.client.get(path, headers=headers)
            assert response.status == 401, (path, headers)
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="authpipe-edge"'
    assert await guarded.get_json("/healthz") == {"status": "ok"}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert await guarded.get_json(check_url(), headers=auth) == ALLOWED
    response = await guarded.client.post("/v1/check", data=b"{}")
    assert response.status == 401


async def test_unknown_path_and_method_are_json_errors(edge: Edge) -> None:
    """404 and 405 answers are JSON too (405 keeps its Allow header)."""
    assert await edge.get_json("/v2/nothing", status=404) == {
        "error": "not_found",
        "message": "Not Found",
    }
    response = await edge.client.delete("/v1/check")
    assert response.status == 405
    assert "GET" in response.headers["Allow"]


# -- the block-list ------------------------------------------------------------------------


def _blocks(edge: Edge) -> None:
    edge.view.apply(*message(source_key("203.0.113.7"), T0 + 10 * MIN, decision_id="a" * 32))
    edge.view.apply(*message(source_key("2001:db8:1:2::/64"), T0 + 5 * MIN, decision_id="b" * 32))
    edge.view.apply(*message(source_key("192.0.2.9"), T0 + 5 * MIN, action="observe"))
    edge.view.apply(*message(account_key(), T0 + 5 * MIN))


async def test_blocklist_formats(edge: Edge) -> None:
    """json, text, nginx and nginx-geo list the active source blocks (observe on request)."""
    _blocks(edge)
    body = await edge.get_json("/v1/blocklist")
    assert isinstance(body, dict)
    assert [(e["source"], e["action"]) for e in body["entries"]] == [
        ("2001:db8:1:2::/64", "block"),
        ("203.0.113.7", "block"),
    ]
    response = await edge.client.get("/v1/blocklist?format=text&include=observe")
    assert await response.read() == b"192.0.2.9\n2001:db8:1:2::/64\n203.0.113.7\n"
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    response = await edge.client.get("/v1/blocklist?format=nginx&tenant=default")
    assert await response.read() == (
        b'# authpipe source block-list: 2 sources, tenant="default", block\n'
        b"deny 2001:db8:1:2::/64;\ndeny 203.0.113.7;\n"
    )
    edge.view.apply(*message(account_key(tenant="acme"), T0 + 5 * MIN))  # acme is now known
    response = await edge.client.get("/v1/blocklist?format=nginx-geo&tenant=acme")
    assert (
        await response.read() == b'# authpipe source block-list: 0 sources, tenant="acme", block\n'
    )


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("format=xml", "format"),
        ("include=all", "include"),
        ("wait_ms=abc", "wait_ms"),
        ("wait_ms=60001", "wait_ms"),
        ("wait_ms=-1", "wait_ms"),
        ("wait_ms=%C2%B2", "wait_ms"),
        ("wait_ms=" + "0" * 5000, "wait_ms"),
        ("tenant=a%0Adeny%20all;", "tenant"),
        ("tenant=a|b", "tenant"),
        ("since=1", "since"),
    ],
)
async def test_blocklist_bad_parameters_are_400(edge: Edge, query: str, parameter: str) -> None:
    """Bad feed parameters are 400s naming the parameter."""
    body = await edge.get_json(f"/v1/blocklist?{query}", status=400)
    assert isinstance(body, dict) and body["parameter"] == parameter


async def test_etag_and_if_none_match(edge: Edge) -> None:
    """The feed carries an ETag; If-None-Match with it is a 304; a change gives a new tag."""
    _blocks(edge)
    first = await edge.client.get("/v1/blocklist?format=text")
    etag = first.headers["ETag"]
    again = await edge.client.get("/v1/blocklist?format=text", headers={"If-None-Match": etag})
    assert (again.status, again.headers["ETag"], await again.read()) == (304, etag, b"")
    edge.view.apply(*tombstone(source_key("203.0.113.7")))
    changed = await edge.client.get("/v1/blocklist?format=text", headers={"If-None-Match": etag})
    assert changed.status == 200
    assert changed.headers["ETag"] != etag
    assert await changed.read() == b"2001:db8:1:2::/64\n"


async def test_expiry_changes_the_feed_without_a_tombstone(edge: Edge) -> None:
    """An entry past its expires_at leaves the feed (and its ETag) even before prune runs."""
    _blocks(edge)
    first = await edge.client.get("/v1/blocklist?format=text")
    edge.clock.now = T0 + 5 * MIN
    second = await edge.client.get("/v1/blocklist?format=text")
    assert await second.read() == b"203.0.113.7\n"
    assert second.headers["ETag"] != first.headers["ETag"]


async def _timed(response_coro: object) -> tuple[ClientResponse, float]:
    response: ClientResponse = await response_coro  # type: ignore[misc]
    return response, time.monotonic()


async def test_long_poll_answers_within_a_second_of_a_change(edge: Edge) -> None:
    """A long poll with the current ETag is answered with the new feed < 1 s after a change."""
    _blocks(edge)
    etag = (await edge.client.get("/v1/blocklist?format=text")).headers["ETag"]
    poll = asyncio.create_task(
        _timed(
            edge.client.get(
                "/v1/blocklist?format=text&wait_ms=20000", headers={"If-None-Match": etag}
            )
        )
    )
    await asyncio.sleep(0.3)  # let the poll park; the assertion below is on the push delay
    assert not poll.done()
    changed_at = time.monotonic()
    edge.view.apply(*message(source_key("198.51.100.99"), T0 + 10 * MIN))
    response, answered_at = await asyncio.wait_for(poll, 5.0)
    assert response.status == 200
    assert await response.read() == b"198.51.100.99\n2001:db8:1:2::/64\n203.0.113.7\n"
    assert answered_at - changed_at < PUSH_DEADLINE_S


async def test_long_poll_pushes_an_expiry(edge: Edge) -> None:
    """A long poll wakes when prune drops an expired source block."""
    _blocks(edge)
    etag = (await edge.client.get("/v1/blocklist?format=text")).headers["ETag"]
    poll = asyncio.create_task(
        _timed(
            edge.client.get(
                "/v1/blocklist?format=text&wait_ms=20000", headers={"If-None-Match": etag}
            )
        )
    )
    await asyncio.sleep(0.3)
    edge.clock.now = T0 + 5 * MIN
    changed_at = time.monotonic()
    assert edge.view.prune() == 3
    response, answered_at = await asyncio.wait_for(poll, 5.0)
    assert await response.read() == b"203.0.113.7\n"
    assert answered_at - changed_at < PUSH_DEADLINE_S


async def test_long_poll_without_change_ends_in_304(edge: Edge) -> None:
    """A long poll that sees no change answers 304 with the same ETag after wait_ms."""
    _blocks(edge)
    etag = (await edge.client.get("/v1/blocklist")).headers["ETag"]
    started = time.monotonic()
    response = await edge.client.get("/v1/blocklist?wait_ms=300", headers={"If-None-Match": etag})
    assert (response.status, response.headers["ETag"]) == (304, etag)
    assert 0.3 <= time.monotonic() - started < 10.0  # answered at wait_ms, not hung


async def test_event_stream_pushes_changes_within_a_second(edge: Edge) -> None:
    """The SSE feed sends the current list at once and every change < 1 s after it."""
    _blocks(edge)
    response = await edge.client.get("/v1/blocklist/events?format=text")
    assert response.headers["Content-Type"] == "text/event-stream"

    async def next_event() -> list[bytes]:
        lines: list[bytes] = []
        while True:
            line = await response.content.readline()
            if line == b"\n" and lines:
                return lines
            if line != b"\n" and not line.startswith(b":"):
                lines.append(line.rstrip(b"\n"))

    first = await asyncio.wait_for(next_event(), 5.0)
    assert first[0] == b"event: blocklist"
    assert first[2:] == [b"data: 2001:db8:1:2::/64", b"data: 203.0.113.7"]
    changed_at = time.monotonic()
    edge.view.apply(*tombstone(source_key("2001:db8:1:2::/64")))
    second = await asyncio.wait_for(next_event(), 5.0)
    assert time.monotonic() - changed_at < PUSH_DEADLINE_S
    assert second[2:] == [b"data: 203.0.113.7"]
    response.close()


# -- metrics -------------------------------------------------------------------------------


async def test_metrics_count_checks_and_show_the_view(edge: Edge) -> None:
    """/metrics is Prometheus text with check results, 400s, readiness and active decisions."""
    edge.view.apply(*message(account_key(), T0 + MIN))
    edge.view.apply(b"garbage", b"{}")
    await edge.get_json(check_url())
    await edge.get_json(check_url(account="bob"))
    await edge.get_json(check_url(trusted="maybe"), status=400)
    response = await edge.client.get("/metrics")
    assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
    text = await response.text()
    for line in (
        'authpipe_edge_checks_total{result="block"} 1.0',
        'authpipe_edge_checks_total{result="allowed"} 1.0',
        'authpipe_edge_bad_requests_total{parameter="trusted"} 1.0',
        "authpipe_edge_ready 1.0",
        "authpipe_edge_lag_messages 0.0",
        "authpipe_edge_staleness_seconds 0.15",
        'authpipe_edge_active_decisions{action="block",scope="account"} 1.0',
        'authpipe_edge_messages_total{outcome="put"} 1.0',
        'authpipe_edge_bad_decisions_total{reason="bad_key"} 1.0',
        'authpipe_edge_http_requests_total{endpoint="/v1/check",status="400"} 1.0',
    ):
        assert line in text, line
