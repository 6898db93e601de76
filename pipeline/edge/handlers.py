"""The edge's HTTP handlers (``Edge``) and the aiohttp application (``create_app``).

Endpoints (every answer is JSON unless said otherwise; errors are
``{"error": code, "parameter": name, "message": text}``):

==========================  ===========================================================
``GET /v1/check``           query ``tenant`` (default ``default``), ``account``, ``ip``
                            (the TCP peer), ``forwarded_for`` (comma-separated),
                            ``device``, ``session``, ``trusted`` (``true``/``false``),
                            ``flow`` (default ``login``) -> ``{"allowed": bool,
                            "retry_after_ms": int, "challenge": "captcha"|"step_up"|null,
                            "step_up": bool}`` and nothing else (no oracle).
                            ``challenge``: demand it (captcha before the password
                            check, step_up after a correct one) and report its outcome
                            as an event; ``step_up``: a correct password must be
                            answered by a possession check before any session (also
                            after a captcha), reported ``outcome = "step_up"``
``POST /v1/check``          the same fields as a JSON object (``forwarded_for`` may
                            be a list, ``trusted`` a JSON boolean)
``POST /v1/check/batch``    a JSON list of such objects (at most 1000) ->
                            ``{"results": [{"allowed", "retry_after_ms", "challenge", "step_up"}, ...]}``
``GET /v1/session``         query ``tenant``, ``account``, ``ip``, ``forwarded_for``,
                            ``device``, ``signed_in_at_ms`` (epoch ms) of a session
                            signed in from an untrusted client without a challenge ->
                            ``{"challenge": "step_up"|null}``: ask it on the session's
                            requests while it is young; ``step_up`` means a wave's
                            lead-in covers its sign-in (``review_session``): demand a
                            second factor before going on, and report it (``mfa``)
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

The block-list's two endpoints are ``pipeline.edge.blocklist_http`` (``Edge.blocklists``).
``Edge.quick_check`` is the same answer as ``check_get`` (metrics and log included) for
the fast path (``pipeline.edge.fastpath``): the service hands it this ``Edge``, which it
knows only through a protocol (it never imports this module).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from pipeline.core.decisions import Verdict
from pipeline.core.keys import Key, format_key
from pipeline.edge.blocklist_http import BlocklistEndpoints
from pipeline.edge.errors import CheckInputError, EdgeError
from pipeline.edge.health import Health
from pipeline.edge.http_input import (
    CheckRequest,
    check_request,
    json_body,
    parse_check_json,
    parse_check_query,
    parse_session_query,
)
from pipeline.edge.loglimit import REFUSAL_LOG_LINES_PER_S, LineBudget
from pipeline.edge.metrics import EdgeMetrics
from pipeline.edge.view import DecisionView
from pipeline.logs import get_logger

log = get_logger("edge")

BATCH_MAX_CHECKS = 1000
BODY_MAX_BYTES = 1 << 20
ALLOWED_BODY = b'{"allowed":true,"retry_after_ms":0,"challenge":null,"step_up":false}'
CHECK_PATH = "/v1/check"
_NO_TOKEN_PATHS = frozenset({"/healthz"})


class NotReady(EdgeError):
    """The view has not caught up yet; answered 503 with Retry-After."""


def _error(status: int, code: str, message: str, parameter: str | None = None) -> web.Response:
    body: dict[str, str] = {"error": code, "message": message}
    if parameter is not None:
        body["parameter"] = parameter
    return web.json_response(body, status=status, dumps=lambda v: orjson.dumps(v).decode())


def _json(value: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")


def _verdict_body(verdict: Verdict) -> dict[str, object]:
    return {
        "allowed": verdict.allowed,
        "retry_after_ms": verdict.retry_after_ms,
        "challenge": verdict.challenge,
        "step_up": verdict.step_up,
    }


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
        self.blocklists = BlocklistEndpoints(view, self.metrics, self._require_ready, tenants)

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
        except CheckInputError as exc:
            self.metrics.bad_request(exc.parameter)
            return _error(400, "bad_parameter", exc.detail, exc.parameter)
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
                req.tenant,
                req.account,
                req.ip,
                req.forwarded_for,
                req.device,
                req.trusted,
                req.flow,
                req.session,
            )
        except CheckInputError as exc:
            raise CheckInputError(prefix + exc.parameter, prefix + exc.detail) from None
        self.metrics.check(verdict.applied)
        if verdict.matched_key is not None:
            self._log_match("edge_check_refused", verdict.matched_key, verdict)
        elif verdict.challenge_key is not None:
            self._log_match("edge_check_challenged", verdict.challenge_key, verdict)
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
            log.warning(
                "edge_check_logs_suppressed", lines=suppressed, per_second=budget.per_second
            )
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
        except CheckInputError:
            return None
        plain = verdict.allowed and verdict.challenge is None
        body = ALLOWED_BODY if plain else orjson.dumps(_verdict_body(verdict))
        self.metrics.request(CHECK_PATH, 200, time.perf_counter() - started)
        return body

    async def check_get(self, request: web.Request) -> web.Response:
        req = parse_check_query(request.query)
        self._require_ready()
        verdict = self._check(req)
        if verdict.allowed and verdict.challenge is None:
            return web.Response(body=ALLOWED_BODY, content_type="application/json")
        return _json(_verdict_body(verdict))

    async def check_post(self, request: web.Request) -> web.Response:
        req = parse_check_json(await json_body(request))
        self._require_ready()
        verdict = self._check(req)
        return _json(_verdict_body(verdict))

    async def check_batch(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if not isinstance(body, list):
            raise CheckInputError("body", "a batch must be a JSON list of check objects")
        if len(body) > BATCH_MAX_CHECKS:
            raise CheckInputError("body", f"a batch holds at most {BATCH_MAX_CHECKS} checks")
        parsed = [parse_check_json(item, f"[{i}].") for i, item in enumerate(body)]
        self._require_ready()
        results = [_verdict_body(self._check(req, f"[{i}].")) for i, req in enumerate(parsed)]
        return _json({"results": results})

    async def session_get(self, request: web.Request) -> web.Response:
        req = parse_session_query(request.query)
        self._require_ready()
        challenge = self.view.review_session(
            req.tenant, req.account, req.ip, req.signed_in_ms, req.forwarded_for, req.device
        )
        self.metrics.session_review(challenge)
        return _json({"challenge": challenge})

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
        self.blocklists.close()


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
    app.router.add_get("/v1/session", edge.session_get, allow_head=False)
    app.router.add_get("/v1/blocklist", edge.blocklists.blocklist, allow_head=False)
    app.router.add_get("/v1/blocklist/events", edge.blocklists.events, allow_head=False)
    app.router.add_get("/healthz", edge.healthz)
    app.router.add_get("/readyz", edge.readyz)
    app.router.add_get("/metrics", edge.metrics_text)
    app.on_shutdown.append(edge.close)
    return app
