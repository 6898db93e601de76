"""``authpipe edge serve``: the process. It follows the decisions topic (``DecisionFeed``),
serves the edge's app (``pipeline.edge.handlers``) through ``EdgeSite`` (the fast path
for plain ``GET /v1/check``, ``pipeline.edge.fastpath``) and stops on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import ipaddress
import signal

from aiohttp import web

from pipeline.edge.errors import EdgeError
from pipeline.edge.fastpath import EdgeSite
from pipeline.edge.feed import DecisionFeed
from pipeline.edge.handlers import EDGE_KEY, create_app
from pipeline.edge.http_input import CHECK_FIELDS
from pipeline.logs import get_logger
from pipeline.settings import EdgeSettings, Settings

log = get_logger("edge")

SHUTDOWN_TIMEOUT_S = 5.0


class EdgeBindError(EdgeError):
    """The service could not listen on its address."""


class EdgeTokenRequired(EdgeError):
    """The edge would listen off loopback without ``edge.token``."""


def require_token(settings: Settings, host: str) -> None:
    """Raise EdgeTokenRequired when ``host`` is not a loopback address and ``edge.token``
    is unset: off loopback anyone who can reach the port could read the block-list and
    probe which accounts are blocked, so the token is required there (loopback stays
    open for a gateway on the same host)."""
    if not settings.edge.token and not _loopback(host):
        raise EdgeTokenRequired(
            f"edge.token is not set and the edge would listen on {host or 'every address'} "
            "(not loopback): set AUTHPIPE_EDGE_TOKEN to a random secret the gateways send "
            "as a bearer token, or listen on 127.0.0.1"
        )


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
        runner,
        host,
        port,
        edge=runner.app[EDGE_KEY],
        known=CHECK_FIELDS,
        head_timeout_s=edge.head_timeout_s,
        max_connections=edge.max_connections,
    )
    try:
        await site.start()
    except OSError as exc:
        raise EdgeBindError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port "
            "or stop what holds it"
        ) from exc
    return int(runner.addresses[0][1])


async def serve(settings: Settings, host: str, port: int, stop: asyncio.Event) -> None:
    """Follow the decisions topic and serve HTTP on ``host:port`` until ``stop`` is set.
    Raises EdgeTokenRequired before connecting anywhere (``require_token``)."""
    require_token(settings, host)
    feed = DecisionFeed.from_settings(settings)
    app = create_app(
        feed.view,
        feed,
        token=settings.edge.token,
        tenants=settings.ingest.tenants,
        refusal_logs_per_s=settings.edge.refusal_logs_per_s,
    )
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    try:
        bound = await _listen(runner, host, port, settings.edge)
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
    """``authpipe edge serve``: runs until SIGINT/SIGTERM; returns the exit code. Raises
    EdgeTokenRequired (exit 1, one line) off loopback without ``edge.token``."""
    edge = settings.edge
    host = host or edge.host
    require_token(settings, host)
    asyncio.run(_serve_until_signal(settings, host, edge.port if port is None else port))
    return 0
