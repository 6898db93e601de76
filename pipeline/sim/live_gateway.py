"""``authpipe simulate --gateway URL``: the simulator as a login service that follows the
contract, in front of the real edge and the real worker's decisions.

For each attempt of the run (not of the history) the simulator asks the edge's
``POST /v1/check`` (one keep-alive connection, TCP_NODELAY, ``CHECK_TIMEOUT_S``), then
produces exactly what ``pipeline.sim.gateway.reported`` says a contract-following login
service reports under that answer, the bot being the truth's ``attacker`` role: a refused
attempt as ``failure_reason = "refused"``, a bot's CAPTCHA as a ``flow = "challenge"``
failure, a right password under a step-up as ``outcome = "step_up"`` then the possession
check (``flow = "mfa"``: a bot fails it, a person passes it and the completed sign-in
follows with ``challenge = "step_up"``; a person's passed CAPTCHA comes first as a
``flow = "challenge"`` success). This is ``backtest --verdicts``'s model played
through the broker. A check that fails (an HTTP error, no answer in
``CHECK_TIMEOUT_S``) stops the run with ``GatewayError``: an answer guessed for the edge
would make the measurement none.

**Time.** The edge checks a decision's expiry against its wall clock, so the run is in
event time: an attempt is checked and produced when the wall clock reaches its
``occurred_at`` (``--speedup 1``, no ``--start``). The history (``--history-s``) is
produced first, as fast as the broker takes it, unchecked (the deployment's past; its
sign-ins were answered long ago), and the run starts ``gateway_lead_ms`` after the
command: the history's 60th part (at most 200 s, under the worker's 5-minute future
skew), the time the worker has to count it before the first check. An attempt checked
later than its time (history still producing, a slow edge) is counted in ``late_ms``.

**Truth.** The truth file holds the attempts as their people and bots made them (the
rows of any ``simulate`` run, so ``scorecard --decisions-from-topic`` scores each one by
the decisions in force, exactly as it scores ``backtest --verdicts``'s input), and after
each, the login service's extra reports (``#step_up``, ``#mfa``) with role ``REPORTED``:
like ``backtest --verdicts``, which feeds them to the engine and scores only the attempts,
the scorecard counts them nowhere. An attempt its reports replace (a bot's
step-up) is in the truth but not on the topic under its id, so score a gateway run from
the topics (``scorecard --decisions-from-topic``), not by replaying the truth
(``--engine``, ``backtest --live``). The summary scores the edge's own answers with the
scorecard's functions (``pipeline.sim.scoring``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.clock import wall_ms
from pipeline.contracts.models import format_utc_ms, ms_to_datetime
from pipeline.core.attempt import STEP_UP, Attempt
from pipeline.core.decisions import Verdict
from pipeline.errors import AuthpipeError
from pipeline.logs import get_logger
from pipeline.settings import Settings
from pipeline.sim.card import AttackScore
from pipeline.sim.gateway import reported
from pipeline.sim.scenarios import SimConfig, SimEvent, check_config, generate
from pipeline.sim.scoring import count_valid, shown_challenge, takeover
from pipeline.sim.simulate import SimulateOptions, Summary
from pipeline.sim.truth import ATTACKER, LEGIT_ROLES, TruthEvent
from pipeline.topics import Topics

log = get_logger("simulate")

CHECK_TIMEOUT_S = 2.0
LEAD_SHARE = 60
"""The run starts the history's 60th part after the command (``gateway_lead_ms``)."""
LEAD_MIN_MS = 2_000
LEAD_MAX_MS = 200_000
REPORTED = "reported"
"""The truth role of what the login service reported beyond the attempt itself."""
CHALLENGES = ("captcha", "step_up")


class GatewayError(AuthpipeError):
    """The edge given to ``simulate --gateway`` cannot be used, or stopped answering."""


@dataclass
class GatewayTally:
    """The edge's answers to the run's attempts, scored as the scorecard scores them."""

    checks: int = 0
    produced: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    extra_events: int = 0
    takeovers: int = 0
    valid: AttackScore = field(
        default_factory=lambda: AttackScore(
            attack="all", tenant="-", attempts=0, start_ms=0, end_ms=0
        )
    )
    bought: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    people: set[str] = field(default_factory=set)
    people_challenged: set[str] = field(default_factory=set)
    people_refused: set[str] = field(default_factory=set)
    late_ms: int = 0

    def add(self, event: TruthEvent, verdict: Verdict) -> None:
        self.checks += 1
        self.answers[_answer_kind(verdict)] += 1
        if event.role == ATTACKER:
            self.takeovers += takeover(event, verdict, False)
            self.bought.setdefault(event.scenario, set())
            count_valid(self.valid, self.bought, event, verdict, False)
        elif event.role in LEGIT_ROLES:
            self.people.add(event.actor)
            if shown_challenge(verdict, event):
                self.people_challenged.add(event.actor)
            if not verdict.allowed:
                self.people_refused.add(event.actor)

    def render(self) -> str:
        answers = ", ".join(f"{k} {n:,}" for k, n in sorted(self.answers.items()))
        bought = sum(len(s) for s in self.bought.values())
        return "\n".join(
            [
                f"edge checks: {self.checks:,} ({answers}); events produced: {self.produced:,} "
                f"({self.extra_events:,} extra reports); checked late by at most "
                f"{self.late_ms:,} ms",
                f"attacker valid credentials: {self.takeovers} taken over (bots fail "
                f"CAPTCHAs), {self.takeovers + bought} if CAPTCHAs are bought "
                f"({self.valid.valid_captcha_only} met only a CAPTCHA), "
                f"{self.valid.valid_confirmed_by_step_up} confirmed by a step-up",
                f"people: {len(self.people):,}, challenged {len(self.people_challenged):,}, "
                f"refused {len(self.people_refused):,}",
            ]
        )


def _answer_kind(verdict: Verdict) -> str:
    if not verdict.allowed:
        return "refused"
    kind = verdict.challenge or ("step_up" if verdict.step_up else "allowed")
    return "captcha+step_up" if kind == "captcha" and verdict.step_up else kind


def gateway_lead_ms(history_ms: int) -> int:
    """How long after the command the run starts (see the module doc)."""
    return min(max(LEAD_MIN_MS, history_ms // LEAD_SHARE), LEAD_MAX_MS)


def gateway_start_ms(now_ms: int, history_ms: int) -> int:
    """The run's start: the next whole second after the lead."""
    start = now_ms + gateway_lead_ms(history_ms)
    return start - start % 1000 + 1000


def attempt_of(wire: dict[str, Any], occurred_ms: int) -> Attempt:
    """The attempt ``reported`` reads, from a wire event: identifiers stay as typed (the
    model looks only at the flow, the outcome, trust and the event id)."""
    device = wire.get("device_id")
    outcome = wire["outcome"]
    return Attempt(
        wire["event_id"],
        occurred_ms,
        wire.get("tenant", "default"),
        wire["account"],
        wire["peer_ip"],
        device,
        wire.get("session_id"),
        bool(wire.get("device_trusted") and device),
        wire.get("flow", "login"),
        outcome == "success",
        STEP_UP if outcome == STEP_UP else wire.get("failure_reason"),
    )


def wire_of(wire: dict[str, Any], report: Attempt, stepped_up: bool) -> dict[str, Any]:
    """``wire`` as the login service reports it in ``report`` (``reported``'s output):
    its event id, flow and outcome; a ``flow = "challenge"`` names its CAPTCHA and a
    sign-in completed after a step-up carries ``challenge = "step_up"`` (the contract)."""
    out = {**wire, "event_id": report.event_id, "flow": report.flow}
    out.pop("failure_reason", None)
    out.pop("challenge", None)
    if report.success:
        out["outcome"] = "success"
    elif report.failure_reason == STEP_UP:
        out["outcome"] = STEP_UP
    else:
        out["outcome"] = "failure"
        out["failure_reason"] = report.failure_reason or "other"
    if report.flow == "challenge":
        out["challenge"] = wire.get("challenge") or "captcha"
    elif stepped_up and report.success and report.event_id == wire["event_id"]:
        out["challenge"] = "step_up"
    return out


def verdict_of(answer: object) -> Verdict:
    """The edge's JSON answer as a ``Verdict`` (``allowed``, ``retry_after_ms``,
    ``challenge``, ``step_up``); raises GatewayError on anything else."""
    if not isinstance(answer, dict) or not isinstance(answer.get("allowed"), bool):
        raise GatewayError(f"the edge answered {answer!r:.200}, not a check's answer")
    challenge = answer.get("challenge")
    if challenge is not None and challenge not in CHALLENGES:
        raise GatewayError(f"the edge asked for challenge {challenge!r}, unknown here")
    retry = answer.get("retry_after_ms")
    return Verdict(
        answer["allowed"],
        retry if isinstance(retry, int) and retry > 0 else 0,
        challenge=challenge,
        step_up=answer.get("step_up") is True or challenge == "step_up",
    )


def check_body(wire: dict[str, Any]) -> dict[str, Any]:
    """The ``POST /v1/check`` body for a wire event (what the login service sends)."""
    return {
        "tenant": wire.get("tenant", "default"),
        "account": wire["account"],
        "ip": wire["peer_ip"],
        "forwarded_for": list(wire.get("forwarded_for") or ()),
        "device": wire.get("device_id"),
        "session": wire.get("session_id"),
        "trusted": bool(wire.get("device_trusted", False)),
        "flow": wire.get("flow", "login"),
    }


def truth_event(event: SimEvent) -> TruthEvent:
    """The event as the scorecard's functions read it (identifiers as typed)."""
    label = event.label
    a = attempt_of(event.wire, event.occurred_ms)
    return TruthEvent(
        0,
        event.event_id,
        label.scenario,
        label.role,
        label.actor,
        label.cohort,
        event.wire["account"],
        a,
    )


class EdgeChecker:
    """``POST /v1/check`` on one edge over a keep-alive, TCP_NODELAY connection."""

    def __init__(self, url: str, token: str | None) -> None:
        self.base = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.session: Any = None

    async def __aenter__(self) -> EdgeChecker:
        import aiohttp

        # aiohttp keeps connections alive and sets TCP_NODELAY on each (its default).
        connector = aiohttp.TCPConnector(limit=1, force_close=False)
        timeout = aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=self.headers
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    async def ready(self) -> None:
        """Raise GatewayError unless the edge answers a check (before anything is
        produced): a bad URL, a wrong token or an edge not caught up."""
        probe = {"account": "authpipe-simulate-probe", "ip": "192.0.2.1"}
        try:
            await self.check({**probe, "peer_ip": probe["ip"]})
        except GatewayError as exc:
            raise GatewayError(
                f"--gateway {self.base}: {exc}; give the base URL of a running, ready "
                "authpipe edge (authpipe edge serve), its token in edge.token"
            ) from None

    async def check(self, wire: dict[str, Any]) -> Verdict:
        import aiohttp

        try:
            async with self.session.post(
                self.base + "/v1/check",
                data=orjson.dumps(check_body(wire)),
                headers={"Content-Type": "application/json"},
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise GatewayError(f"the edge answered HTTP {resp.status}: {body[:200]!r}")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise GatewayError(f"the edge check failed ({exc.__class__.__name__}: {exc})") from None
        try:
            return verdict_of(orjson.loads(body))
        except orjson.JSONDecodeError:
            raise GatewayError(f"the edge answered {body[:200]!r}, not JSON") from None


async def play(
    events: Iterable[SimEvent],
    start_ms: int,
    edge: EdgeChecker,
    send: Any,
    truth: Any,
    summary: Summary,
    tally: GatewayTally,
) -> None:
    """The history as it is, then each attempt at its time through the edge (module doc);
    ``send(wire)`` produces one event, ``truth`` takes the truth lines."""
    for event in events:
        truth.write(orjson.dumps(event.truth_row()) + b"\n")
        summary.add(event)
        if event.occurred_ms < start_ms:
            await send(event.wire, event.occurred_ms)
            tally.produced += 1
            continue
        ahead_ms = event.occurred_ms - wall_ms()
        if ahead_ms > 5:
            await asyncio.sleep(ahead_ms / 1000)
        tally.late_ms = max(tally.late_ms, wall_ms() - event.occurred_ms)
        verdict = await edge.check(event.wire)
        scored = truth_event(event)
        tally.add(scored, verdict)
        reports = reported(scored.attempt, verdict, event.label.role == ATTACKER)
        stepped = any(r.failure_reason == STEP_UP for r in reports)
        for report in reports:
            wire = wire_of(event.wire, report, stepped)
            await send(wire, event.occurred_ms)
            tally.produced += 1
            if report.event_id != event.event_id:
                tally.extra_events += 1
                row = {**event.truth_row(), "event_id": report.event_id, "role": REPORTED}
                truth.write(orjson.dumps({**row, "event": wire}) + b"\n")


async def produce_through(
    options: SimulateOptions, settings: Settings, url: str
) -> tuple[Summary, GatewayTally]:
    """Check the edge, create the topics if needed, then play the run (``play``)."""
    from aiokafka import AIOKafkaProducer

    from pipeline.kafka_admin import ensure_topics, wait_for_broker
    from pipeline.kafka_client import producer_kwargs, security_kwargs

    kafka = settings.kafka
    summary, tally = Summary(), GatewayTally()
    async with EdgeChecker(url, settings.edge.token) as edge:
        await edge.ready()
        security = security_kwargs(kafka)
        await wait_for_broker(kafka.bootstrap_servers, 30.0, security=security)
        await ensure_topics(
            kafka.bootstrap_servers,
            Topics.from_settings(kafka).specs(kafka.partitions),
            replication_factor=kafka.replication_factor,
            security=security,
        )
        producer = AIOKafkaProducer(**producer_kwargs(kafka), linger_ms=5)
        in_flight: list[asyncio.Future[object]] = []

        async def send(wire: dict[str, Any], occurred_ms: int) -> None:
            in_flight.append(
                await producer.send(
                    kafka.input_topic,
                    value=orjson.dumps(wire),
                    key=wire["account"].encode(),
                    timestamp_ms=occurred_ms,
                )
            )
            if len(in_flight) >= 5_000:
                await asyncio.gather(*in_flight)
                in_flight.clear()

        options.truth_path.parent.mkdir(parents=True, exist_ok=True)
        await producer.start()
        try:
            with options.truth_path.open("wb") as truth:
                started = time.perf_counter()
                events = generate(options.config)
                await play(events, options.config.start_ms, edge, send, truth, summary, tally)
                await asyncio.gather(*in_flight)
                await producer.flush()
                summary.wall_s = time.perf_counter() - started
        finally:
            await producer.stop()
    return summary, tally


def check_url(url: str) -> str:
    """``url`` if it is an http(s) base URL; raises GatewayError naming what to give."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise GatewayError(
            f"--gateway {url!r} is not an edge's base URL; give http(s)://HOST:PORT "
            "(authpipe edge serve's address)"
        )
    return url


def run_gateway_command(
    settings: Settings,
    *,
    url: str,
    scenarios: tuple[str, ...],
    rate_per_s: float,
    duration_s: float,
    seed: int,
    truth: Path | None,
    history_s: float = 0.0,
) -> int:
    """``authpipe simulate --gateway URL``: the run in event time through the edge."""
    check_url(url)
    history_ms = round(history_s * 1000)
    start_ms = gateway_start_ms(wall_ms(), history_ms)
    config = SimConfig(scenarios, rate_per_s, round(duration_s * 1000), seed, start_ms, history_ms)
    check_config(config)
    truth = truth or settings.state_dir / "sim" / "truth.jsonl"
    options = SimulateOptions(config, 1.0, truth)
    log.info(
        "simulate_gateway_started",
        gateway=url,
        scenarios=",".join(scenarios),
        start=format_utc_ms(ms_to_datetime(start_ms)),
        history_ms=history_ms,
    )
    summary, tally = asyncio.run(produce_through(options, settings, url))
    log.info("simulate_gateway_finished", events=summary.events, checks=tally.checks)
    print(summary.render())
    print(tally.render())
    print(f"topic: {settings.kafka.input_topic} at {settings.kafka.bootstrap_servers}")
    print(f"truth: {truth}")
    return 0
