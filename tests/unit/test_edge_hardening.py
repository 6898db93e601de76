"""The edge under hostile input (issue 15): forwarded_for caps and normalised caching,
feed renders per known tenant only, refusal logs at a bounded rate, tenant syntax, and the
same source as the worker's for any X-Forwarded-For chain."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote

import orjson
import pytest
from aiohttp.test_utils import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.edge.errors import CheckInputError
from pipeline.edge.handlers import create_app
from pipeline.wiring import build_normaliser
from tests.unit.test_edge_service import SITES, Edge, FakeHealth, check_url
from tests.unit.test_edge_support import (
    ACCOUNT,
    MIN,
    PEER,
    PROXY,
    SETTINGS,
    T0,
    TENANT,
    Clock,
    account_key,
    edge_logs,
    message,
    new_view,
    source_key,
)


async def _start(site: str, **app_kw: object) -> Edge:
    clock = Clock()
    view = new_view(clock)
    health = FakeHealth()
    client = TestClient(SITES[site](create_app(view, health, **app_kw)))  # type: ignore[arg-type]
    await client.start_server()
    return Edge(view, clock, health, client)


@pytest.fixture(params=sorted(SITES))
async def edge(request: pytest.FixtureRequest) -> AsyncIterator[Edge]:
    harness = await _start(request.param, tenants=["acme"])
    try:
        yield harness
    finally:
        await harness.client.close()


# -- 9: forwarded_for length --------------------------------------------------------------


@pytest.mark.parametrize(
    "forwarded_for",
    ["203.0.113.1," * 200, "x" * 2049, "203.0.113.1, " + "1" * 65, ",".join(["1.2.3.4"] * 65)],
)
async def test_long_forwarded_for_is_400_naming_it(edge: Edge, forwarded_for: str) -> None:
    """Issue 15 #9: more than 2 KiB in all, 64 characters in a hop or 64 hops is a 400
    naming forwarded_for, on GET and POST (string or list)."""
    body = await edge.get_json(check_url(forwarded_for=forwarded_for), status=400)
    assert isinstance(body, dict) and body["parameter"] == "forwarded_for"
    for value in (forwarded_for, forwarded_for.split(",")):
        check = {"account": ACCOUNT, "ip": PROXY, "forwarded_for": value}
        body = await edge.post_json("/v1/check", check, status=400)
        assert isinstance(body, dict) and body["parameter"] == "forwarded_for"


def test_sources_are_cached_by_normalised_hops_and_long_chains_not_at_all() -> None:
    """Spellings of one chain share one cache entry; a chain longer than 256 characters is
    answered right and kept in no cache (memory does not grow with caller-chosen text)."""
    view = new_view()
    view.apply(*message(source_key("203.0.113.5"), T0 + MIN))
    for spelling in ("203.0.113.5,10.0.0.2", " 203.0.113.5 , 10.0.0.2", "203.0.113.5,,10.0.0.2"):
        assert view.check(TENANT, ACCOUNT, PROXY, spelling).allowed is False
    assert list(view._addresses) == [(PROXY, ("203.0.113.5", "10.0.0.2"))]
    keys_before = len(view._keys)
    for i in range(50):
        chain = f"198.51.100.{i}, " + ", ".join(["10.0.0.2"] * 30) + ", 203.0.113.5"
        assert len(chain) > 256
        assert view.check(TENANT, ACCOUNT, PROXY, chain).allowed is False
    padded = "203.0.113.5," + " " * 300 + "10.0.0.2"  # short once normalised, long as sent
    assert view.check(TENANT, ACCOUNT, PROXY, padded).allowed is False
    assert len(view._addresses) == 1
    assert len(view._keys) == keys_before


def test_an_empty_entry_is_no_hop_in_the_header_and_in_the_workers_list() -> None:
    """ "6.6.6.6,,10.0.0.2" at the edge and ["6.6.6.6", "", "10.0.0.2"] in the worker give one
    source: the empty entry is skipped (no proxy appends nothing), 6.6.6.6 is read."""
    norm = build_normaliser(SETTINGS)
    assert norm.sources.source_of(PROXY, ["6.6.6.6", "", "10.0.0.2"]) == "6.6.6.6"
    view = new_view()
    view.apply(*message(source_key("6.6.6.6"), T0 + MIN))
    assert view.check(TENANT, ACCOUNT, PROXY, "6.6.6.6,,10.0.0.2").allowed is False
    assert view.check(TENANT, ACCOUNT, PROXY, ("6.6.6.6", "", "10.0.0.2")).allowed is False


def test_view_refuses_long_forwarded_for_as_check_input_error() -> None:
    """The view's own check raises CheckInputError('forwarded_for') past the caps."""
    view = new_view()
    with pytest.raises(CheckInputError) as info:
        view.check(TENANT, ACCOUNT, PROXY, ("1" * 65,))
    assert info.value.parameter == "forwarded_for"


# -- 5: one function in worker and edge ------------------------------------------------------


_HOP = st.one_of(
    st.sampled_from(
        [
            "10.0.0.2",
            "10.9.9.9:443",
            "unknown",
            "_hidden",
            "",
            "[2001:db8::7]:443",
            "203.0.113.7:51234",
            "6.6.6.6",
            "64:ff9b::198.51.100.3",
        ]
    ),
    st.ip_addresses().map(str),
)


@settings(max_examples=200, deadline=None)
@given(hops=st.lists(_HOP, max_size=8), peer=st.sampled_from([PROXY, PEER, "10.0.0.1"]))
def test_the_edge_derives_the_workers_source_for_any_chain(hops: list[str], peer: str) -> None:
    """Issue 15 #5: for any chain, the edge refuses exactly when a block sits on the source
    the worker's Normaliser derives (the same function, on the same hops)."""
    norm = build_normaliser(SETTINGS)
    expected = norm.sources.source_of(peer, hops)
    view = new_view()
    view.apply(*message(source_key(expected), T0 + MIN))
    assert view.check(TENANT, ACCOUNT, peer, tuple(hops)).allowed is False
    assert view._keys_of((TENANT, ACCOUNT, peer, tuple(hops), None, False, "login", None))[2] == (
        expected
    )


# -- 12: the feed ---------------------------------------------------------------------------


async def test_feed_for_an_unknown_tenant_is_400_and_renders_nothing(edge: Edge) -> None:
    """Issue 15 #12: tenant= names a configured tenant or one a decision named; others are a
    400 naming tenant (on the feed and the event stream), and no body is rendered for them."""
    edge_app = edge.client.server.app
    assert edge_app is not None
    for i in range(100):
        for path in ("/v1/blocklist", "/v1/blocklist/events"):
            body = await edge.get_json(f"{path}?tenant=t{i}", status=400)
            assert isinstance(body, dict) and body["parameter"] == "tenant"
    assert _renders(edge) == 0
    for tenant in ("acme", "default"):
        response = await edge.client.get(f"/v1/blocklist?format=text&tenant={tenant}")
        assert response.status == 200
    edge.view.apply(*message(account_key(tenant="globex"), T0 + MIN))
    assert (await edge.client.get("/v1/blocklist?tenant=globex")).status == 200


async def test_feed_renders_each_query_at_most_once_per_change(edge: Edge) -> None:
    """Issue 15 #12: however many requests come, each (format, include, tenant) is rendered
    once per change of the block-list; nothing evicts the renders of other queries."""
    edge.view.apply(*message(source_key("203.0.113.7"), T0 + 10 * MIN))
    queries = [
        f"/v1/blocklist?format={fmt}{inc}{ten}"
        for fmt in ("json", "text", "nginx", "nginx-geo")
        for inc in ("", "&include=observe")
        for ten in ("", "&tenant=default", "&tenant=acme")
    ]
    for _ in range(5):
        for query in queries:
            assert (await edge.client.get(query)).status == 200
    assert _renders(edge) == len(queries) == 24
    edge.view.apply(*message(source_key("203.0.113.8"), T0 + 10 * MIN))
    for _ in range(3):
        for query in queries:
            assert (await edge.client.get(query)).status == 200
    assert _renders(edge) == 48


def _renders(edge: Edge) -> float:
    text = _metrics(edge)
    line = next(x for x in text.splitlines() if x.startswith("authpipe_edge_feed_renders_total"))
    return float(line.split()[-1])


def _metrics(edge: Edge) -> str:
    from pipeline.edge.handlers import EDGE_KEY

    app = edge.client.server.app
    assert app is not None
    return app[EDGE_KEY].metrics.render().decode()


# -- 13: refusal logs at a bounded rate ----------------------------------------------------------


async def test_a_thousand_refused_checks_write_a_bounded_number_of_lines(edge: Edge) -> None:
    """Issue 15 #13: a batch of 1,000 refused checks writes at most 20 refusal lines (the
    per-second budget); the rest are counted in a metric and a summary line follows."""
    edge.view.apply(*message(account_key(), T0 + 10 * MIN))
    batch = [{"account": ACCOUNT, "ip": PEER}] * 1000
    with edge_logs() as logs:
        body = await edge.post_json("/v1/check/batch", batch)
    assert isinstance(body, dict) and len(body["results"]) == 1000
    refused = [entry for entry in logs if entry["event"] == "edge_check_refused"]
    assert len(refused) == 20
    assert "authpipe_edge_check_logs_suppressed_total 980.0" in _metrics(edge)


def test_line_budget_opens_a_new_window_each_second_and_reports_what_it_held_back() -> None:
    """LineBudget: per_second lines per window; the held-back count is reported once."""
    from pipeline.edge.loglimit import LineBudget

    now = [100.0]
    budget = LineBudget(3, clock=lambda: now[0])
    assert [budget.allow() for _ in range(5)] == [True, True, True, False, False]
    now[0] = 100.99
    assert budget.allow() is False
    now[0] = 101.0
    assert budget.allow() is True
    assert (budget.take_suppressed(), budget.take_suppressed(), budget.suppressed_total) == (
        3,
        0,
        3,
    )


# -- 15: tenant syntax ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tenant", ["a\\", "\\') OR 1=1 --", "Acme", "a b", "-x", ".x", "a" * 65, "a|b", "-", "a'"]
)
async def test_a_tenant_outside_the_syntax_is_400_on_checks_and_feed(
    edge: Edge, tenant: str
) -> None:
    """Issue 15 #15: the edge refuses tenants outside [a-z0-9][a-z0-9._-]{0,63} with a 400
    naming tenant, on GET and POST checks and on the feed."""
    body = await edge.get_json(check_url(tenant=tenant), status=400)
    assert isinstance(body, dict) and body["parameter"] == "tenant"
    body = await edge.post_json(
        "/v1/check", {"account": ACCOUNT, "ip": PEER, "tenant": tenant}, status=400
    )
    assert isinstance(body, dict) and body["parameter"] == "tenant"
    body = await edge.get_json(f"/v1/blocklist?tenant={quote(tenant)}", status=400)
    assert isinstance(body, dict) and body["parameter"] == "tenant"


async def test_tenants_inside_the_syntax_are_checked(edge: Edge) -> None:
    """Tenants like acme, eu-1.prod and a_b pass."""
    for tenant in ("acme", "eu-1.prod", "a_b", "0"):
        response = await edge.client.get(check_url(tenant=tenant))
        assert response.status == 200, await response.text()
        assert orjson.loads(await response.read())["allowed"] is True
