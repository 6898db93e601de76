"""``authpipe edge serve``: an aiohttp service on a decision view.

Endpoints (every answer is JSON unless said otherwise; errors are
``{"error": code, "parameter": name, "message": text}``):

==========================  ===========================================================
``GET /v1/check``           query ``tenant`` (default ``default``), ``account``, ``ip``
                            (the TCP peer), ``forwarded_for`` (comma-separated),
                            ``device``, ``session``, ``trusted`` (``true``/``false``),
                            ``flow`` (default ``login``) -> ``{"allowed": bool,
                            "retry_after_ms": int}`` and nothing else (no oracle)
``POST /v1/check``          the same fields as a JSON object (``forwarded_for`` may
                            be a list, ``trusted`` a JSON boolean)
``POST /v1/check/batch``    a JSON list of such objects (at most 1000) ->
                            ``{"results": [{"allowed", "retry_after_ms"}, ...]}``
``GET /v1/blocklist``       ``format=json|text|nginx|nginx-geo``, ``include=observe``,
                            ``tenant``; ETag and ``If-None-Match`` (304); with
                            ``wait_ms`` (<= 60000) and ``If-None-Match`` it long-polls:
                            it answers as soon as the feed changes, or 304 at the end
``GET /v1/blocklist/events`` the same feed as server-sent events: one ``blocklist``
                            event with the whole body at once and at every change
``GET /healthz``            200 while the process runs (no token needed)
``GET /readyz``             200 once the view has caught up, else 503
``GET /metrics``            Prometheus text (own registry)
==========================  ===========================================================

Checks and the feed answer 503 ``not_ready`` until the view has caught up: a partial view
would allow attempts it should refuse. With ``edge.token`` set, every endpoint but
``/healthz`` needs ``Authorization: Bearer <token>`` (401 otherwise). Malformed input
is a 400 naming the parameter, never a 500. Refusals are logged with the decision key
and id (the key holds the account digest, never the account).

``serve`` listens through ``EdgeSite`` (``pipeline.edge.fastpath``): plain ``GET
/v1/check`` requests to a ready view are answered there (``Edge.quick_check``, the same
answer, metrics and log as ``check_get``); everything else reaches this app unchanged.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import re
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web
from multidict import MultiMapping
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pipeline.contracts.models import TENANT_RULE, valid_tenant
from pipeline.core.decisions import Verdict
from pipeline.core.keys import Key, format_key
from pipeline.edge.blocklist import (
    FORMATS,
    FeedQuery,
    RenderedFeed,
    etag_matches,
    render,
    sse_event,
)
from pipeline.edge.fastpath import EdgeSite
from pipeline.edge.loglimit import REFUSAL_LOG_LINES_PER_S, LineBudget
from pipeline.edge.view import FLOWS, CheckInputError, DecisionFeed, DecisionView, EdgeError
from pipeline.logs import get_logger
from pipeline.settings import EdgeSettings, Settings

log = get_logger("edge")

CHECK_FIELDS = frozenset(
    {"tenant", "account", "ip", "forwarded_for", "device", "session", "trusted", "flow"}
)
FEED_FIELDS = frozenset({"format", "include", "tenant", "wait_ms"})
EVENTS_FIELDS = frozenset({"format", "include", "tenant"})
BATCH_MAX_CHECKS = 1000
WAIT_MAX_MS = 60_000
BODY_MAX_BYTES = 1 << 20
SSE_HEARTBEAT_S = 15.0
SHUTDOWN_TIMEOUT_S = 5.0
ALLOWED_BODY = b'{"allowed":true,"retry_after_ms":0}'
CHECK_PATH = "/v1/check"
_NO_TOKEN_PATHS = frozenset({"/healthz"})
_DIGITS = re.compile(r"[0-9]{1,5}")


class BadRequest(EdgeError):
    """A malformed request; answered 400 with the parameter and a clear message."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.message = message


class NotReady(EdgeError):
    """The view has not caught up yet; answered 503 with Retry-After."""


class EdgeBindError(EdgeError):
    """The service could not listen on its address."""


class Health(Protocol):
    """What the service needs to know about the feed behind its view."""

    def ready(self) -> bool: ...

    def not_ready_reason(self) -> str | None: ...

    def lag_messages(self) -> int: ...

    def staleness_ms(self) -> int | None: ...


class AlwaysReady:
    """Health of a view fed in-process (no topic): always ready, never lagging."""

    def ready(self) -> bool:
        return True

    def not_ready_reason(self) -> str | None:
        return None

    def lag_messages(self) -> int:
        return 0

    def staleness_ms(self) -> int | None:
        return 0


# -- parsing requests -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """One check, validated for shape (the view validates values)."""

    tenant: str
    account: str
    ip: str
    forwarded_for: str | tuple[str, ...]
    device: str | None
    session: str | None
    trusted: bool
    flow: str


def _single(query: MultiMapping[str], name: str) -> str | None:
    values = query.getall(name, ())
    if len(values) > 1:
        raise BadRequest(name, f"{name} is given {len(values)} times; give it once")
    return values[0] if values else None


def _reject_unknown(names: Iterable[str], allowed: frozenset[str], prefix: str = "") -> None:
    for name in names:
        if name not in allowed:
            label = str(name)[:40]
            raise BadRequest(
                f"{prefix}{label}",
                f"unknown parameter {label!r}; known: {', '.join(sorted(allowed))}",
            )


def _parse_trusted(text: str | None, parameter: str = "trusted") -> bool:
    if text is None or text == "false":
        return False
    if text == "true":
        return True
    raise BadRequest(parameter, f"{parameter} must be true or false")


def _parse_flow(text: str | None, parameter: str = "flow") -> str:
    if text is None:
        return "login"
    if text not in FLOWS:
        raise BadRequest(parameter, f"{parameter} must be one of login, token, recovery, uia, mfa")
    return text


def _required(value: str | None, parameter: str, what: str) -> str:
    if not value:
        raise BadRequest(parameter, f"{parameter} is required ({what})")
    return value


def parse_check_query(query: MultiMapping[str]) -> CheckRequest:
    """A check from query parameters; raises BadRequest."""
    _reject_unknown(query.keys(), CHECK_FIELDS)
    return check_request(lambda name: _single(query, name))


def check_request(field: Callable[[str], str | None]) -> CheckRequest:
    """A check from ``field(name)``, a query parameter's value (None: not given); raises
    BadRequest, naming the first bad parameter in the order read here."""
    tenant = field("tenant")
    return CheckRequest(
        tenant="default" if tenant is None else tenant,
        account=_required(field("account"), "account", "the identifier as typed"),
        ip=_required(field("ip"), "ip", "the TCP peer address"),
        forwarded_for=field("forwarded_for") or (),
        device=field("device") or None,
        session=field("session") or None,
        trusted=_parse_trusted(field("trusted")),
        flow=_parse_flow(field("flow")),
    )


def _json_text(body: Mapping[str, Any], name: str, prefix: str) -> str | None:
    value = body.get(name)
    if value is None or isinstance(value, str):
        return value
    raise BadRequest(prefix + name, f"{prefix}{name} must be a string")


def _json_hops(value: object, parameter: str) -> str | tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(hop, str) for hop in value):
        return tuple(value)
    raise BadRequest(parameter, f"{parameter} must be a string or a list of strings")


def parse_check_json(body: object, prefix: str = "") -> CheckRequest:
    """A check from a JSON object; ``prefix`` names its place in a batch; raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest(prefix.rstrip(".") or "body", "a check must be a JSON object")
    _reject_unknown(body.keys(), CHECK_FIELDS, prefix)
    trusted = body.get("trusted", False)
    if not isinstance(trusted, bool):
        raise BadRequest(prefix + "trusted", f"{prefix}trusted must be true or false")
    tenant = _json_text(body, "tenant", prefix)
    return CheckRequest(
        tenant="default" if tenant is None else tenant,
        account=_required(_json_text(body, "account", prefix), prefix + "account", "a string"),
        ip=_required(_json_text(body, "ip", prefix), prefix + "ip", "the TCP peer address"),
        forwarded_for=_json_hops(body.get("forwarded_for"), prefix + "forwarded_for"),
        device=_json_text(body, "device", prefix) or None,
        session=_json_text(body, "session", prefix) or None,
        trusted=trusted,
        flow=_parse_flow(_json_text(body, "flow", prefix), prefix + "flow"),
    )


def parse_feed_query(query: MultiMapping[str], allowed: frozenset[str]) -> tuple[FeedQuery, int]:
    """The block-list query and the long-poll wait in ms; raises BadRequest."""
    _reject_unknown(query.keys(), allowed)
    fmt = _single(query, "format") or "json"
    if fmt not in FORMATS:
        raise BadRequest("format", f"format must be one of {', '.join(FORMATS)}")
    include = _single(query, "include")
    if include not in (None, "", "observe"):
        raise BadRequest("include", "include must be 'observe' (or absent)")
    tenant = _single(query, "tenant") or None
    if tenant is not None and not valid_tenant(tenant):
        raise BadRequest("tenant", TENANT_RULE)
    wait_text = _single(query, "wait_ms") or "0"
    if not _DIGITS.fullmatch(wait_text) or int(wait_text) > WAIT_MAX_MS:
        raise BadRequest("wait_ms", f"wait_ms must be an integer from 0 to {WAIT_MAX_MS}")
    return FeedQuery(fmt, include == "observe", tenant), int(wait_text)


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest("body", "the body is not valid JSON") from None


# -- metrics ---------------------------------------------------------------------------


class _ViewCollector:
    """Gauges and counters read from the view and the feed at scrape time."""

    def __init__(self, view: DecisionView, health: Health) -> None:
        self.view = view
        self.health = health

    def collect(self) -> Any:
        health = self.health
        yield GaugeMetricFamily(
            "authpipe_edge_ready", "1 once caught up", value=int(health.ready())
        )
        yield GaugeMetricFamily(
            "authpipe_edge_lag_messages", "messages not applied yet", value=health.lag_messages()
        )
        staleness = health.staleness_ms()
        yield GaugeMetricFamily(
            "authpipe_edge_staleness_seconds",
            "seconds since the broker last answered a fetch of every partition (-1: never)",
            value=-1.0 if staleness is None else staleness / 1000,
        )
        active = GaugeMetricFamily(
            "authpipe_edge_active_decisions", "unexpired decisions", labels=["scope", "action"]
        )
        for (scope, action), count in sorted(self.view.counts().items()):
            active.add_metric([scope, action], count)
        yield active
        stats = self.view.stats
        messages = CounterMetricFamily(
            "authpipe_edge_messages", "decision messages applied", labels=["outcome"]
        )
        for outcome, count in stats.outcomes.items():
            messages.add_metric([outcome], count)
        yield messages
        bad = CounterMetricFamily(
            "authpipe_edge_bad_decisions", "invalid decision messages", labels=["reason"]
        )
        for reason, count in sorted(stats.bad_reasons.items()):
            bad.add_metric([reason], count)
        yield bad


class EdgeMetrics:
    """The service's metrics on its own registry."""

    def __init__(self, view: DecisionView, health: Health) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.checks_total = Counter(
            "authpipe_edge_checks_total", "checks answered", ["result"], registry=r
        )
        self.bad_requests_total = Counter(
            "authpipe_edge_bad_requests_total", "requests answered 400", ["parameter"], registry=r
        )
        self.requests_total = Counter(
            "authpipe_edge_http_requests_total", "HTTP requests", ["endpoint", "status"], registry=r
        )
        self.check_logs_suppressed_total = Counter(
            "authpipe_edge_check_logs_suppressed_total",
            "refusal log lines held back by the per-second budget", registry=r,
        )  # fmt: skip
        self.feed_renders_total = Counter(
            "authpipe_edge_feed_renders_total", "block-list bodies rendered", registry=r
        )
        self.connections_refused_total = Counter(
            "authpipe_edge_connections_refused_total",
            "connections closed at once: edge.max_connections were open", registry=r,
        )  # fmt: skip
        self.head_timeouts_total = Counter(
            "authpipe_edge_head_timeouts_total",
            "connections closed: a request head was not complete within edge.head_timeout_s",
            registry=r,
        )
        self.request_seconds = Histogram(
            "authpipe_edge_http_request_seconds",
            "HTTP request handling time (long polls excluded)",
            ["endpoint"],
            buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=r,
        )
        r.register(_ViewCollector(view, health))
        # labels() takes a lock and builds a tuple: children are looked up once and kept.
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (str(id(metric)), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def request(self, endpoint: str, status: int, seconds: float | None) -> None:
        self._child(self.requests_total, endpoint, str(status)).inc()
        if seconds is not None:
            self._child(self.request_seconds, endpoint).observe(seconds)

    def check_log_suppressed(self) -> None:
        self.check_logs_suppressed_total.inc()

    def feed_rendered(self) -> None:
        self.feed_renders_total.inc()

    def connection_refused(self) -> None:
        self.connections_refused_total.inc()

    def head_timeout(self) -> None:
        self.head_timeouts_total.inc()

    def check(self, applied: str) -> None:
        self._child(self.checks_total, applied).inc()

    def bad_request(self, parameter: str) -> None:
        self._child(self.bad_requests_total, _parameter_label(parameter)).inc()

    def render(self) -> bytes:
        data: bytes = generate_latest(self.registry)
        return data


def _parameter_label(parameter: str) -> str:
    """A bounded label: known parameter names only (batch positions dropped)."""
    name = parameter.rsplit(".", 1)[-1]
    return name if name in CHECK_FIELDS | FEED_FIELDS | {"body"} else "other"


# -- the service -------------------------------------------------------------------------


def _error(status: int, code: str, message: str, parameter: str | None = None) -> web.Response:
    body: dict[str, str] = {"error": code, "message": message}
    if parameter is not None:
        body["parameter"] = parameter
    return web.json_response(body, status=status, dumps=lambda v: orjson.dumps(v).decode())


def _json(value: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")


def _verdict_body(verdict: Verdict) -> dict[str, object]:
    return {"allowed": verdict.allowed, "retry_after_ms": verdict.retry_after_ms}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

EDGE_KEY: web.AppKey[Edge] = web.AppKey("edge")


class Edge:
    """Request handlers over one view; built by ``create_app``."""

    def __init__(
        self,
        view: DecisionView,
        health: Health,
        token: str | None,
        tenants: Iterable[str] = (),
        refusal_logs_per_s: int = REFUSAL_LOG_LINES_PER_S,
    ) -> None:
        self.view = view
        self.health = health
        self.metrics = EdgeMetrics(view, health)
        self._token = f"Bearer {token}".encode() if token else None
        self.log_budget = LineBudget(refusal_logs_per_s)
        self.tenants = frozenset(tenants)
        """Tenants the feed serves before any decision names them (``ingest.tenants``)."""
        self._feeds: dict[FeedQuery, tuple[int, RenderedFeed]] = {}
        self._closing = asyncio.Event()

    # -- middleware ----------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        resource = request.match_info.route.resource
        endpoint = resource.canonical if resource is not None else "other"
        response = await self._respond(request, handler)
        timed = isinstance(response, web.Response) and "wait_ms" not in request.query
        seconds = time.perf_counter() - started if timed else None
        self.metrics.request(endpoint, response.status, seconds)
        return response

    async def _respond(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self._authorised(request):
            response = _error(401, "unauthorised", "send Authorization: Bearer <edge token>")
            response.headers["WWW-Authenticate"] = 'Bearer realm="authpipe-edge"'
            return response
        try:
            return await handler(request)
        except BadRequest as exc:
            self.metrics.bad_request(exc.parameter)
            return _error(400, "bad_parameter", exc.message, exc.parameter)
        except NotReady as exc:
            response = _error(503, "not_ready", str(exc))
            response.headers["Retry-After"] = "1"
            return response
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = _error(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
            if "Allow" in exc.headers:
                response.headers["Allow"] = exc.headers["Allow"]
            return response
        except Exception:
            log.exception("edge_request_failed", path=request.path, method=request.method)
            return _error(500, "internal", "internal error; see the edge's log")

    def _authorised(self, request: web.Request) -> bool:
        if self._token is None or request.path in _NO_TOKEN_PATHS:
            return True
        sent = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        return hmac.compare_digest(sent, self._token)

    def _require_ready(self) -> None:
        if not self.health.ready():
            reason = self.health.not_ready_reason() or "catching up"
            raise NotReady(f"the decision view is not ready: {reason}; retry shortly")

    # -- checks --------------------------------------------------------------------------

    def _check(self, req: CheckRequest, prefix: str = "") -> Verdict:
        try:
            verdict = self.view.check(
                req.tenant, req.account, req.ip, req.forwarded_for, req.device, req.trusted,
                req.flow, req.session,
            )  # fmt: skip
        except CheckInputError as exc:
            raise BadRequest(prefix + exc.parameter, prefix + exc.message) from None
        self.metrics.check(verdict.applied)
        if verdict.matched_key is not None:
            self._log_match("edge_check_refused", verdict.matched_key, verdict)
        elif verdict.observed_key is not None:
            self._log_match("edge_check_observed", verdict.observed_key, verdict)
        return verdict

    def _log_match(self, event: str, key: Key, verdict: Verdict) -> None:
        """One line per refused or observed check, within ``log_budget`` lines a second;
        the lines held back are counted (``authpipe_edge_check_logs_suppressed_total``)
        and reported in one ``edge_check_logs_suppressed`` line when the budget allows."""
        budget = self.log_budget
        if not budget.allow():
            self.metrics.check_log_suppressed()
            return
        suppressed = budget.take_suppressed()
        if suppressed:
            log.warning("edge_check_logs_suppressed", lines=suppressed, per_second=budget.per_second)
        active = self.view.index.get(key)
        log.info(
            event,
            key=format_key(key),
            decision_id=active.decision_id if active else None,
            rule=active.rule if active else None,
            retry_after_ms=verdict.retry_after_ms,
        )

    def quick_check(self, query: Mapping[str, str], authorization: bytes | None) -> bytes | None:
        """The body of the 200 answer to ``GET /v1/check`` with these query parameters
        (each given once, all in ``CHECK_FIELDS``) and Authorization header, counted and logged as ``check_get`` through the middleware would be; None
        where that answer is not a 200 (no token, not ready, a bad parameter): the caller
        then lets the aiohttp app answer, which counts the request instead."""
        started = time.perf_counter()
        token = self._token
        if token is not None and (
            authorization is None or not hmac.compare_digest(authorization, token)
        ):
            return None
        if not self.health.ready():
            return None
        try:
            verdict = self._check(check_request(query.get))
        except BadRequest:
            return None
        body = ALLOWED_BODY if verdict.allowed else orjson.dumps(_verdict_body(verdict))
        self.metrics.request(CHECK_PATH, 200, time.perf_counter() - started)
        return body

    async def check_get(self, request: web.Request) -> web.Response:
        req = parse_check_query(request.query)
        self._require_ready()
        verdict = self._check(req)
        if verdict.allowed:
            return web.Response(body=ALLOWED_BODY, content_type="application/json")
        return _json(_verdict_body(verdict))

    async def check_post(self, request: web.Request) -> web.Response:
        req = parse_check_json(await _json_body(request))
        self._require_ready()
        verdict = self._check(req)
        return _json(_verdict_body(verdict))

    async def check_batch(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, list):
            raise BadRequest("body", "a batch must be a JSON list of check objects")
        if len(body) > BATCH_MAX_CHECKS:
            raise BadRequest("body", f"a batch holds at most {BATCH_MAX_CHECKS} checks")
        parsed = [parse_check_json(item, f"[{i}].") for i, item in enumerate(body)]
        self._require_ready()
        results = [_verdict_body(self._check(req, f"[{i}].")) for i, req in enumerate(parsed)]
        return _json({"results": results})

    # -- the block-list ------------------------------------------------------------------

    def known_tenant(self, tenant: str) -> bool:
        """A tenant the feed serves: in ``ingest.tenants`` or named by a decision."""
        return tenant in self.tenants or tenant in self.view.tenants

    def feed(self, query: FeedQuery) -> RenderedFeed:
        """The rendered feed, re-rendered only when the block-list changed or expired.

        Queries are for a known tenant (``known_tenant``) or all, so the cache holds at
        most ``len(FORMATS) * 2 * (known tenants + 1)`` bodies and is never cleared: each
        of them is rendered at most once per change (or first expiry) of the block-list,
        whatever clients ask."""
        if query.tenant is not None and not self.known_tenant(query.tenant):
            raise BadRequest(
                "tenant",
                f"unknown tenant {query.tenant!r}: no decision names it and it is not in "
                "ingest.tenants",
            )
        version = self.view.blocklist_changes.version
        cached = self._feeds.get(query)
        fresh = cached is not None and cached[0] == version
        if cached is not None and fresh and self.view.now_ms() < cached[1].valid_until_ms:
            return cached[1]
        entries, valid_until_ms = self.view.blocklist(
            include_observe=query.include_observe, tenant=query.tenant
        )
        rendered = render(entries, query, valid_until_ms)
        self.metrics.feed_rendered()
        self._feeds[query] = (version, rendered)
        return rendered

    async def _wait_change(self, version: int, timeout_s: float) -> None:
        """Until the block-list changes, ``timeout_s`` passes or the service closes."""
        change = asyncio.ensure_future(self.view.blocklist_changes.wait(version, timeout_s))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait({change, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            change.cancel()
            closing.cancel()

    def _until_expiry_s(self, feed: RenderedFeed, cap_s: float) -> float:
        return max(0.01, min(cap_s, (feed.valid_until_ms - self.view.now_ms()) / 1000))

    async def blocklist(self, request: web.Request) -> web.Response:
        query, wait_ms = parse_feed_query(request.query, FEED_FIELDS)
        self._require_ready()
        known = request.headers.get("If-None-Match")
        current = self.feed(query)
        if wait_ms and etag_matches(known, current.etag):
            deadline = time.monotonic() + wait_ms / 1000
            while etag_matches(known, current.etag) and not self._closing.is_set():
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    break
                version = self.view.blocklist_changes.version
                await self._wait_change(version, self._until_expiry_s(current, remaining_s))
                current = self.feed(query)
        headers = {"ETag": current.etag, "Cache-Control": "no-cache"}
        if etag_matches(known, current.etag):
            return web.Response(status=304, headers=headers)
        headers["Content-Type"] = current.content_type
        return web.Response(body=current.body, headers=headers)

    async def blocklist_events(self, request: web.Request) -> web.StreamResponse:
        query, _ = parse_feed_query(request.query, EVENTS_FIELDS)
        self._require_ready()
        self.feed(query)  # a 400 for an unknown tenant before the stream starts
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        sent = request.headers.get("Last-Event-ID")
        written_s = time.monotonic()
        try:
            while not self._closing.is_set():
                version = self.view.blocklist_changes.version
                current = self.feed(query)
                if current.etag != sent:
                    await response.write(sse_event(current))
                    sent, written_s = current.etag, time.monotonic()
                elif time.monotonic() - written_s >= SSE_HEARTBEAT_S:
                    await response.write(b": keep-alive\n\n")
                    written_s = time.monotonic()
                await self._wait_change(version, self._until_expiry_s(current, SSE_HEARTBEAT_S))
        except ConnectionError:
            pass  # the client went away
        return response

    # -- operations ----------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        ready = self.health.ready()
        body: dict[str, object] = {
            "ready": ready,
            "lag_messages": self.health.lag_messages(),
            "staleness_ms": self.health.staleness_ms(),
            "decisions": len(self.view),
        }
        if not ready:
            body["reason"] = self.health.not_ready_reason() or "catching up"
        return _json(body, status=200 if ready else 503)

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def close(self, app: web.Application) -> None:
        """Wake long polls and event streams so shutdown does not wait for them."""
        self._closing.set()


def create_app(
    view: DecisionView,
    health: Health,
    *,
    token: str | None = None,
    tenants: Iterable[str] = (),
    refusal_logs_per_s: int = REFUSAL_LOG_LINES_PER_S,
) -> web.Application:
    """The aiohttp application of the edge over ``view`` (fed by whatever ``health`` reports
    on, e.g. a DecisionFeed); the feed serves ``tenants`` and every tenant a decision
    names."""
    edge = Edge(view, health, token, tenants, refusal_logs_per_s)
    app = web.Application(middlewares=[edge.middleware], client_max_size=BODY_MAX_BYTES)
    app[EDGE_KEY] = edge
    app.router.add_get(CHECK_PATH, edge.check_get, allow_head=False)
    app.router.add_post(CHECK_PATH, edge.check_post)
    app.router.add_post("/v1/check/batch", edge.check_batch)
    app.router.add_get("/v1/blocklist", edge.blocklist, allow_head=False)
    app.router.add_get("/v1/blocklist/events", edge.blocklist_events, allow_head=False)
    app.router.add_get("/healthz", edge.healthz)
    app.router.add_get("/readyz", edge.readyz)
    app.router.add_get("/metrics", edge.metrics_text)
    app.on_shutdown.append(edge.close)
    return app


# -- running it -------------------------------------------------------------------------


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def _listen(
    runner: web.AppRunner, host: str, port: int, settings: EdgeSettings | None = None
) -> int:
    edge = settings or EdgeSettings()
    site = EdgeSite(
        runner, host, port, edge=runner.app[EDGE_KEY], known=CHECK_FIELDS,
        head_timeout_s=edge.head_timeout_s, max_connections=edge.max_connections,
    )  # fmt: skip
    try:
        await site.start()
    except OSError as exc:
        raise EdgeBindError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port "
            "or stop what holds it"
        ) from exc
    return int(runner.addresses[0][1])


async def serve(settings: Settings, host: str, port: int, stop: asyncio.Event) -> None:
    """Follow the decisions topic and serve HTTP on ``host:port`` until ``stop`` is set."""
    feed = DecisionFeed.from_settings(settings)
    app = create_app(
        feed.view, feed, token=settings.edge.token, tenants=settings.ingest.tenants,
        refusal_logs_per_s=settings.edge.refusal_logs_per_s,
    )  # fmt: skip
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    try:
        bound = await _listen(runner, host, port, settings.edge)
        if not settings.edge.token and not _loopback(host):
            log.warning("edge_open_bind", host=host, hint="set edge.token (AUTHPIPE_EDGE_TOKEN)")
        log.info("edge_listening", host=host, port=bound, topic=feed.config.topic)
        await feed.start()
        await stop.wait()
    finally:
        await runner.cleanup()
        await feed.stop()
        log.info("edge_stopped")


async def _serve_until_signal(settings: Settings, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await serve(settings, host, port, stop)


def run_edge(settings: Settings, host: str | None = None, port: int | None = None) -> int:
    """``authpipe edge serve``: runs until SIGINT/SIGTERM; returns the exit code."""
    edge = settings.edge
    asyncio.run(
        _serve_until_signal(settings, host or edge.host, edge.port if port is None else port)
    )
    return 0
