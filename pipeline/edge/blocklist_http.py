"""The block-list endpoints: ``GET /v1/blocklist`` (with ETag, 304 and long polls) and
``GET /v1/blocklist/events`` (server-sent events), over the view's source decisions.

Each (format, include, tenant) is rendered at most once per change (or first expiry) of
the block-list, whatever clients ask, and only for known tenants, so the cache of
rendered bodies is bounded. Long polls and event streams end when the service closes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from aiohttp import web

from pipeline.edge.blocklist import FeedQuery, RenderedFeed, etag_matches, render, sse_event
from pipeline.edge.errors import CheckInputError
from pipeline.edge.http_input import EVENTS_FIELDS, FEED_FIELDS, parse_feed_query
from pipeline.edge.metrics import EdgeMetrics
from pipeline.edge.view import DecisionView

SSE_HEARTBEAT_S = 15.0


class BlocklistEndpoints:
    """The block-list's handlers over one view (``Edge.blocklists``)."""

    def __init__(
        self,
        view: DecisionView,
        metrics: EdgeMetrics,
        require_ready: Callable[[], None],
        tenants: Iterable[str] = (),
    ) -> None:
        self.view = view
        self.metrics = metrics
        self._require_ready = require_ready
        self.tenants = frozenset(tenants)
        """Tenants the feed serves before any decision names them (``ingest.tenants``)."""
        self._feeds: dict[FeedQuery, tuple[int, RenderedFeed]] = {}
        self._closing = asyncio.Event()

    def close(self) -> None:
        """Wake long polls and event streams so shutdown does not wait for them."""
        self._closing.set()

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
            raise CheckInputError(
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

    async def events(self, request: web.Request) -> web.StreamResponse:
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
