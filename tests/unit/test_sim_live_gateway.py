"""``simulate --gateway`` (pipeline.sim.live_gateway): what it produces under each edge
answer, how it reads the edge, when the run starts, and its HTTP client."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pipeline.clock import wall_ms
from pipeline.contracts.codec import decode_attempt
from pipeline.core.decisions import Verdict
from pipeline.settings import Settings
from pipeline.sim import live_gateway
from pipeline.sim.gateway import reported
from pipeline.sim.live_gateway import (
    REPORTED,
    EdgeChecker,
    GatewayError,
    GatewayTally,
    attempt_of,
    check_body,
    check_url,
    gateway_lead_ms,
    gateway_start_ms,
    play,
    verdict_of,
    wire_of,
)
from pipeline.sim.scenarios import SimConfig, generate
from pipeline.sim.simulate import Summary
from pipeline.wiring import build_normaliser
from tests.conftest import TEST_DIGEST_KEY
from tests.unit.test_sim_cli import cli

T_MS = 1_800_000_000_000
WIRE = {
    "event_id": "sim-1",
    "occurred_at": "2027-01-15T08:00:00.000Z",
    "tenant": "default",
    "service": "web",
    "flow": "login",
    "account": "Alice@Example.com",
    "peer_ip": "198.51.100.7",
    "device_id": "dev-1",
    "device_trusted": False,
    "outcome": "success",
    "user_agent": "Mozilla/5.0",
}
VERDICTS = {
    "allowed": Verdict(True, 0),
    "refused": Verdict(False, 30_000),
    "captcha": Verdict(True, 0, challenge="captcha"),
    "captcha+step_up": Verdict(True, 0, challenge="captcha", step_up=True),
    "step_up": Verdict(True, 0, challenge="step_up", step_up=True),
}
WIRES = {
    "right password": WIRE,
    "wrong password": {**WIRE, "outcome": "failure", "failure_reason": "bad_password"},
    "trusted device": {**WIRE, "device_trusted": True},
    "second factor": {**WIRE, "flow": "mfa"},
    "failed captcha": {
        **WIRE,
        "flow": "challenge",
        "challenge": "captcha",
        "outcome": "failure",
        "failure_reason": "other",
    },
}


@pytest.mark.parametrize("bot", [True, False])
@pytest.mark.parametrize("verdict", VERDICTS.values(), ids=list(VERDICTS))
@pytest.mark.parametrize("wire", WIRES.values(), ids=list(WIRES))
def test_the_events_produced_are_what_reported_gives(
    wire: dict[str, Any], verdict: Verdict, bot: bool
) -> None:
    """Every event produced for an attempt, decoded and normalised as the worker does, is
    exactly pipeline.sim.gateway.reported's attempt for the same answer, in order."""
    normaliser = build_normaliser(Settings(identity={"digest_key": TEST_DIGEST_KEY}))

    def normalised(event: dict[str, Any]) -> Any:
        return normaliser.normalise(decode_attempt(orjson.dumps(event), max_bytes=1 << 16))

    reports = reported(attempt_of(wire, T_MS), verdict, bot)
    produced = [wire_of(wire, r, len(reports) > 1) for r in reports]
    assert [normalised(e) for e in produced] == reported(normalised(wire), verdict, bot)


def test_a_step_up_is_reported_as_the_contract_says() -> None:
    """A right password under a step-up: a person's step_up, passed mfa, then the sign-in
    with challenge step_up; a bot's step_up then a failed second factor, no sign-in. Under
    a CAPTCHA: a person's passed CAPTCHA then the sign-in; a bot's failed CAPTCHA only."""

    def shapes(
        bot: bool, verdict: str = "step_up"
    ) -> list[tuple[str, str, str, str | None, str | None]]:
        reports = reported(attempt_of(WIRE, T_MS), VERDICTS[verdict], bot)
        stepped = any(r.failure_reason == "step_up" for r in reports)
        return [
            (e["event_id"], e["flow"], e["outcome"], e.get("failure_reason"), e.get("challenge"))
            for e in (wire_of(WIRE, r, stepped) for r in reports)
        ]

    assert shapes(False) == [
        ("sim-1#step_up", "login", "step_up", None, None),
        ("sim-1#mfa", "mfa", "success", None, None),
        ("sim-1", "login", "success", None, "step_up"),
    ]
    assert shapes(True) == [
        ("sim-1#step_up", "login", "step_up", None, None),
        ("sim-1#mfa", "mfa", "failure", "bad_second_factor", None),
    ]
    assert shapes(False, "captcha") == [
        ("sim-1#captcha", "challenge", "success", None, "captcha"),
        ("sim-1", "login", "success", None, None),
    ]
    assert shapes(True, "captcha+step_up") == [
        ("sim-1", "challenge", "failure", "other", "captcha"),
    ]


def test_the_edge_answer_is_read_exactly() -> None:
    """The four fields as a Verdict (challenge step_up implies step_up; a bad
    retry_after_ms is 0); anything else is a GatewayError."""
    assert verdict_of(
        {"allowed": True, "retry_after_ms": 0, "challenge": "captcha", "step_up": True}
    ) == Verdict(True, 0, challenge="captcha", step_up=True)
    assert verdict_of({"allowed": False, "retry_after_ms": 5000}) == Verdict(False, 5000)
    assert verdict_of({"allowed": True, "retry_after_ms": "x", "challenge": "step_up"}) == (
        Verdict(True, 0, challenge="step_up", step_up=True)
    )
    bad_answers: list[object] = [[], {"allowed": "yes"}, {"allowed": True, "challenge": "riddle"}]
    for bad in bad_answers:
        with pytest.raises(GatewayError):
            verdict_of(bad)


def test_only_an_http_base_url_is_taken() -> None:
    """http(s)://HOST[:PORT][/path] passes; another scheme, no host or a query is refused."""
    assert check_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert check_url("https://edge.example/") == "https://edge.example/"
    for bad in ("127.0.0.1:8080", "ftp://edge", "http://", "http://edge/?x=1"):
        with pytest.raises(GatewayError, match="base URL"):
            check_url(bad)


def test_the_run_starts_after_the_history_s_60th_part() -> None:
    """Lead: 2 s at least, history/60, 200 s at most; the start is the next whole second."""
    assert [gateway_lead_ms(h) for h in (0, 300_000, 3_600_000, 86_400_000)] == [
        2_000,
        5_000,
        60_000,
        200_000,
    ]
    assert gateway_start_ms(T_MS + 400, 3_600_000) == T_MS + 61_000


def test_the_check_body_is_the_login_service_s() -> None:
    """POST /v1/check's body from a wire event: the identifiers as typed, the TCP peer,
    the cookie and its trust, the flow."""
    assert check_body({**WIRE, "forwarded_for": ["203.0.113.9"], "session_id": "s-1"}) == {
        "tenant": "default",
        "account": "Alice@Example.com",
        "ip": "198.51.100.7",
        "forwarded_for": ["203.0.113.9"],
        "device": "dev-1",
        "session": "s-1",
        "trusted": False,
        "flow": "login",
    }


class StubEdge:
    """Answers every check with a step-up after the password, recording the bodies."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    async def check(self, wire: dict[str, Any]) -> Verdict:
        self.checked.append(wire["event_id"])
        return VERDICTS["step_up"]


class Truth:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, line: bytes) -> None:
        self.rows.append(orjson.loads(line))


async def test_the_history_goes_unchecked_and_each_attempt_through_the_edge() -> None:
    """A past run with 10 minutes of history: the history is produced as it is, each run
    attempt checked once; under a step-up for all, every attacker right password is
    produced as step_up then a failed mfa, confirmed and not taken over; the truth holds
    every attempt as made and each extra report with role "reported"."""
    now = wall_ms()
    start = now - now % 1000 - 3_600_000
    config = SimConfig(("baseline", "retry_after_hit"), 1.0, 120_000, 3, start, 600_000)
    events = list(generate(config))
    history = [e for e in events if e.occurred_ms < start]
    run = [e for e in events if e.occurred_ms >= start]
    sent: list[dict[str, Any]] = []

    async def send(wire: dict[str, Any], occurred_ms: int) -> None:
        sent.append(wire)

    edge, truth, tally = StubEdge(), Truth(), GatewayTally()
    await play(events, start, edge, send, truth, Summary(), tally)  # type: ignore[arg-type]
    assert edge.checked == [e.event_id for e in run]
    assert sent[: len(history)] == [e.wire for e in history]
    valid = [
        e.event_id for e in run if e.label.role == "attacker" and e.wire["outcome"] == "success"
    ]
    assert len(valid) == 6  # 3 hits, each retried from the same exit 20 s later
    for event_id in valid:
        mine = [(e["event_id"], e["outcome"]) for e in sent if e["event_id"].startswith(event_id)]
        assert mine == [(event_id + "#step_up", "step_up"), (event_id + "#mfa", "failure")]
    extras = [r for r in truth.rows if r["role"] == REPORTED]
    assert [r["event_id"] for r in truth.rows if r["role"] != REPORTED] == [
        e.event_id for e in events
    ]
    assert len(sent) == tally.produced == len(events) + len(extras) - len(valid)
    assert (tally.checks, tally.takeovers, tally.valid.valid_confirmed_by_step_up) == (
        len(run),
        0,
        6,
    )
    assert tally.valid.valid_captcha_only == 0 and not tally.people_refused


async def test_the_client_keeps_one_nodelay_connection_and_sends_the_token() -> None:
    """Three checks on one TCP connection with TCP_NODELAY, the bearer token and the JSON
    body each time; an HTTP error, a timeout and a refused connection are GatewayErrors,
    and ready() names the URL."""
    peers: list[Any] = []
    seen: list[tuple[str | None, dict[str, Any]]] = []
    slow = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        seen.append((request.headers.get("Authorization"), await request.json()))
        if slow.is_set():
            await asyncio.sleep(1.0)
        if seen[-1][1]["account"] == "down":
            return web.json_response({"error": "not_ready"}, status=503)
        return web.json_response(
            {"allowed": True, "retry_after_ms": 0, "challenge": None, "step_up": True}
        )

    app = web.Application()
    app.router.add_post("/v1/check", handle)
    async with TestServer(app) as server, EdgeChecker(str(server.make_url("/")), "t0k") as edge:
        for _ in range(3):
            assert await edge.check(WIRE) == Verdict(True, 0, step_up=True)
        assert len(set(peers)) == 1
        assert [s for s, _ in seen] == ["Bearer t0k"] * 3 and seen[0][1] == check_body(WIRE)
        (conn,) = [c for conns in edge.session.connector._conns.values() for c, _ in conns]
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        with pytest.raises(GatewayError, match="HTTP 503"):
            await edge.check({**WIRE, "account": "down"})
        slow.set()
        edge.session._timeout = type(edge.session.timeout)(total=0.2)
        with pytest.raises(GatewayError, match="TimeoutError"):
            await edge.check(WIRE)
    async with EdgeChecker("http://127.0.0.1:1", None) as edge:
        with pytest.raises(GatewayError, match=r"--gateway http://127.0.0.1:1: the edge check"):
            await edge.ready()


def test_the_timeout_is_small() -> None:
    """A check waits at most 2 s: a contract login service's budget, not a batch job's."""
    assert live_gateway.CHECK_TIMEOUT_S == 2.0


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--dry-run", "--out", "x.jsonl"], 2, "--gateway asks a running edge"),
        (["--speedup", "10"], 2, "leave --speedup at 1 and --start unset"),
        (["--start", "2026-12-07T00:00:00Z"], 2, "leave --speedup at 1 and --start unset"),
        ([], 1, "the edge check failed"),
    ],
)
def test_the_flag_refuses_what_cannot_run_before_producing(
    argv: list[str], code: int, message: str
) -> None:
    """--gateway with --dry-run, another speedup or a --start is a usage error; an edge
    that does not answer is a clear error before anything is produced (the broker given,
    127.0.0.1:1, is never reached)."""
    done = cli("simulate", "--gateway", "http://127.0.0.1:1", "--duration-s", "5", *argv)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "kafka" not in done.stderr.lower()
