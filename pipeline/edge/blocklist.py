"""The source block-list feed: the view's active source-scope decisions, rendered.

Formats (``format=`` on ``GET /v1/blocklist``):

==============  =========================================================================
``json``        ``{"entries": [{"source", "tenant", "action", "rule", "decision_id",
                "expires_at"}, ...]}`` sorted by (tenant, source)
``text``        one address or CIDR per line, unique, sorted (``include=observe`` adds
                the observe-only ones; otherwise only blocks)
``nginx``       ``deny <source>;`` lines: include it in an ``http``, ``server`` or
                ``location`` block
``nginx-geo``   ``<source> 1;`` lines: include it inside
                ``geo $authpipe_blocked { default 0; include ...; }``
==============  =========================================================================

Bodies hold no timestamps of their own, so the same entries always give the same bytes
and the ETag (a digest of the body) changes exactly when the feed does. Sources were
checked to be an address or CIDR when the view applied them (``valid_source``), so
nothing else can reach an nginx include file.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from pipeline.contracts.models import format_utc_ms, ms_to_datetime
from pipeline.core.grouping import within_grouping
from pipeline.core.normalise import Network

FORMATS: dict[str, str] = {
    "json": "application/json",
    "text": "text/plain; charset=utf-8",
    "nginx": "text/plain; charset=utf-8",
    "nginx-geo": "text/plain; charset=utf-8",
}

_JSON_FIELDS = ("source", "tenant", "action", "rule", "decision_id")
"""The text fields of a ``BlockEntry`` in the order the JSON feed lists them."""
_SOURCE_SYNTAX = re.compile(r"[0-9A-Fa-f.:]{2,45}(?:/[0-9]{1,3})?")


def valid_source(
    text: str,
    ipv4_prefix: int = 32,
    ipv6_prefix: int = 64,
    nat64_prefixes: Sequence[Network] = (),
) -> bool:
    """An IPv4/IPv6 address or CIDR in plain notation (safe to write into nginx config),
    no wider than the grouping (``pipeline.core.grouping``: ``0.0.0.0/0`` is refused) and
    in the family ingest counts it in (the deployment's ``nat64_prefixes`` too)."""
    return bool(_SOURCE_SYNTAX.fullmatch(text)) and within_grouping(
        text, ipv4_prefix, ipv6_prefix, nat64_prefixes
    )


@dataclass(frozen=True, slots=True, order=True)
class BlockEntry:
    """One active source-scope decision as the feed shows it."""

    tenant: str
    source: str
    action: str
    rule: str
    decision_id: str
    expires_ms: int

    def as_json(self) -> dict[str, str]:
        """The entry in the feed's JSON: the text fields as named, then ``expires_at``."""
        body = {name: getattr(self, name) for name in _JSON_FIELDS}
        body["expires_at"] = format_utc_ms(ms_to_datetime(self.expires_ms))
        return body


@dataclass(frozen=True, slots=True)
class FeedQuery:
    """What a client asked for: format, whether observe-only entries count, one tenant."""

    fmt: str = "json"
    include_observe: bool = False
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class RenderedFeed:
    """A rendered body with its ETag; valid until ``valid_until_ms`` (first expiry)."""

    body: bytes
    etag: str
    content_type: str
    count: int
    valid_until_ms: int


def _unique_sources(entries: Iterable[BlockEntry]) -> list[str]:
    return sorted({entry.source for entry in entries})


def _header(query: FeedQuery, count: int) -> str:
    kinds = "block+observe" if query.include_observe else "block"
    # The tenant is quoted and escaped: no request can put a line break into the file.
    tenant = orjson.dumps(query.tenant).decode() if query.tenant else "*"
    return f"# authpipe source block-list: {count} sources, tenant={tenant}, {kinds}\n"


def render_body(entries: Sequence[BlockEntry], query: FeedQuery) -> bytes:
    """The feed body in ``query.fmt`` (a key of FORMATS); entries are already filtered
    (and their sources checked against the grouping by the view)."""
    if query.fmt == "json":
        return orjson.dumps({"entries": [entry.as_json() for entry in sorted(entries)]})
    sources = _unique_sources(entries)
    if query.fmt == "text":
        return "".join(f"{source}\n" for source in sources).encode()
    if query.fmt == "nginx":
        lines = [f"deny {source};\n" for source in sources]
    else:
        lines = [f"{source} 1;\n" for source in sources]
    return (_header(query, len(sources)) + "".join(lines)).encode()


def etag_of(body: bytes) -> str:
    """A strong ETag: the quoted BLAKE2b-96 digest of the body."""
    return '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header (a list, ``*``, weak tags) names ``etag``."""
    if not if_none_match:
        return False
    for candidate in if_none_match.split(","):
        tag = candidate.strip()
        if tag == "*":
            return True
        if tag.startswith("W/"):
            tag = tag[2:]
        if tag == etag:
            return True
    return False


def render(entries: Sequence[BlockEntry], query: FeedQuery, valid_until_ms: int) -> RenderedFeed:
    body = render_body(entries, query)
    return RenderedFeed(
        body=body,
        etag=etag_of(body),
        content_type=FORMATS[query.fmt],
        count=len(entries),
        valid_until_ms=valid_until_ms,
    )


def sse_event(feed: RenderedFeed) -> bytes:
    """One server-sent event carrying a whole feed body (``id`` is its ETag)."""
    text = feed.body.decode()
    data = "".join(f"data: {line}\n" for line in text.rstrip("\n").split("\n"))
    return f"event: blocklist\nid: {feed.etag}\n{data}\n".encode()
