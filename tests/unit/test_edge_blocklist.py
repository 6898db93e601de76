"""Rendering of the source block-list feed (issue 6): formats, ETags, safety of sources."""

from __future__ import annotations

import orjson
import pytest

from pipeline.edge.blocklist import (
    BlockEntry,
    FeedQuery,
    etag_matches,
    etag_of,
    render,
    render_body,
    sse_event,
    valid_source,
)
from tests.unit.test_edge_support import MIN, T0

ENTRIES = [
    BlockEntry("default", "203.0.113.7", "block", "source", "a" * 32, T0 + 10 * MIN),
    BlockEntry("acme", "203.0.113.7", "block", "source", "b" * 32, T0 + 5 * MIN),
    BlockEntry("default", "2001:db8:1:2::/64", "observe", "source", "c" * 32, T0 + 7 * MIN),
]


def test_json_body_is_sorted_and_complete() -> None:
    """JSON lists every entry sorted by tenant then source, with expires_at in RFC 3339 UTC."""
    body = orjson.loads(render_body(ENTRIES, FeedQuery("json")))
    assert body == {
        "entries": [
            {
                "source": "203.0.113.7",
                "tenant": "acme",
                "action": "block",
                "rule": "source",
                "decision_id": "b" * 32,
                "expires_at": "2026-09-21T14:18:20.000Z",
            },
            {
                "source": "2001:db8:1:2::/64",
                "tenant": "default",
                "action": "observe",
                "rule": "source",
                "decision_id": "c" * 32,
                "expires_at": "2026-09-21T14:20:20.000Z",
            },
            {
                "source": "203.0.113.7",
                "tenant": "default",
                "action": "block",
                "rule": "source",
                "decision_id": "a" * 32,
                "expires_at": "2026-09-21T14:23:20.000Z",
            },
        ]
    }


def test_text_nginx_and_geo_bodies() -> None:
    """Text has one unique source per line; nginx has deny lines; geo has `<source> 1;`."""
    assert render_body(ENTRIES, FeedQuery("text")) == b"2001:db8:1:2::/64\n203.0.113.7\n"
    assert render_body(ENTRIES, FeedQuery("nginx", tenant="default")) == (
        b'# authpipe source block-list: 2 sources, tenant="default", block\n'
        b"deny 2001:db8:1:2::/64;\n"
        b"deny 203.0.113.7;\n"
    )
    assert render_body(ENTRIES[:1], FeedQuery("nginx-geo", include_observe=True)) == (
        b"# authpipe source block-list: 1 sources, tenant=*, block+observe\n203.0.113.7 1;\n"
    )
    assert render_body([], FeedQuery("nginx")) == (
        b"# authpipe source block-list: 0 sources, tenant=*, block\n"
    )


def test_same_entries_same_etag() -> None:
    """The ETag depends on the body only, so equal feeds have equal tags."""
    first = render(ENTRIES, FeedQuery("text"), T0)
    second = render(list(reversed(ENTRIES)), FeedQuery("text"), T0 + 1)
    assert first.etag == second.etag == etag_of(b"2001:db8:1:2::/64\n203.0.113.7\n")
    assert first.etag != render(ENTRIES[:1], FeedQuery("text"), T0).etag
    assert first.content_type == "text/plain; charset=utf-8"


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        (None, False),
        ("", False),
        ('"abc"', True),
        ('W/"abc"', True),
        ('"x", "abc"', True),
        ("*", True),
        ('"abd"', False),
        ("abc", False),
    ],
)
def test_if_none_match_parsing(header: str | None, matches: bool) -> None:
    """If-None-Match lists, weak tags and * are understood."""
    assert etag_matches(header, '"abc"') is matches


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("203.0.113.7", True),
        ("203.0.113.0/24", False),  # wider than one source (IPv4 is grouped by /32)
        ("0.0.0.0/0", False),
        ("2001:db8::/48", False),
        ("2001:db8:1:2::/80", True),
        ("2001:db8:1:2::/64", True),
        ("::1", True),
        ("203.0.113.7; allow all", False),
        ("203.0.113.7\n", False),
        ("example.com", False),
        ("999.1.1.1", False),
        ("203.0.113.0/33", False),
        ("", False),
    ],
)
def test_valid_source(text: str, ok: bool) -> None:
    """Only plain addresses and CIDRs no wider than one source may reach an nginx include."""
    assert valid_source(text) is ok


def test_valid_source_follows_the_configured_grouping() -> None:
    """With IPv4 grouped by /24 a /24 is one source; a /16 is still refused."""
    assert valid_source("203.0.113.0/24", ipv4_prefix=24)
    assert not valid_source("203.0.0.0/16", ipv4_prefix=24)
    assert not valid_source("2001:db8:1::/56", ipv6_prefix=64)
    assert valid_source("2001:db8:1::/56", ipv6_prefix=56)


def test_sse_event_frames_each_line() -> None:
    """A multi-line body becomes one event with one data line per body line."""
    feed = render(ENTRIES, FeedQuery("text"), T0)
    assert (
        sse_event(feed)
        == (
            f"event: blocklist\nid: {feed.etag}\ndata: 2001:db8:1:2::/64\ndata: 203.0.113.7\n\n"
        ).encode()
    )


def test_tenant_in_the_nginx_header_cannot_break_the_line() -> None:
    """A tenant with a line break is escaped in the header comment: nothing gets injected."""
    body = render_body([], FeedQuery("nginx", tenant="x\ndeny all;"))
    assert body == b'# authpipe source block-list: 0 sources, tenant="x\\ndeny all;", block\n'
    assert body.count(b"\n") == 1
