"""Which ``GET /v1/check`` request heads the fast path (``pipeline.edge.fastpath``) reads,
and what it takes from them: ``parse_head`` returns None for every head aiohttp would
read differently or the handler would refuse, so the fast path hands those to aiohttp.

What is read, strictly (anything outside it is handed off, not refused):

* a head of at most ``HEAD_MAX_BYTES`` with at most ``HEADERS_MAX`` header lines;
* a request line ``GET /v1/check?<query> HTTP/1.1``, the query printable ASCII;
* header lines ``name: value`` with a token name, no folding, exactly one ``Host``, no
  ``Transfer-Encoding``, ``Upgrade``, ``Expect`` or ``Proxy-Connection``,
  ``Content-Length`` at most ``0``, at most one ``Authorization`` and ``Connection``
  and at most one of each of aiohttp's singleton headers (it answers 400 to a repeat);
  ``Connection`` is ``close`` or ``keep-alive``, and ``close`` closes after the answer
  (a request following it in the same read is aiohttp's to refuse);
* a query of ``name=value`` pairs joined by ``&``, names without escapes, values
  percent-decoded as UTF-8 (no ``+``: aiohttp reads it as a space, so it is handed off).
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

HEAD_MAX_BYTES = 8190
"""A request head longer than this goes to aiohttp (its line and field limits are 8190)."""
HEADERS_MAX = 100
_HANDED_OFF_HEADERS = frozenset({b"transfer-encoding", b"upgrade", b"expect", b"proxy-connection"})
_ONCE = frozenset({b"authorization", b"connection"})


def parse_query(raw: bytes, known: frozenset[str]) -> dict[str, str] | None:
    """The query's parameters as aiohttp would read them, or None where the fast path does
    not read it exactly so (empty pairs, a pair without ``=``, ``+``, escapes that are not
    UTF-8) or the handler would refuse it (a name not in ``known``, a name given twice)."""
    if b"+" in raw:
        return None
    params: dict[str, str] = {}
    try:
        for pair in raw.split(b"&"):
            name_bytes, sep, value = pair.partition(b"=")
            name = name_bytes.decode("ascii")
            if not sep or name not in known or name in params:
                return None
            params[name] = (unquote_to_bytes(value) if b"%" in value else value).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return params


class CheckHead:
    """What the fast path takes from a request head (``parse_head``)."""

    __slots__ = ("authorization", "close", "query")

    def __init__(self, query: dict[str, str], authorization: bytes | None, close: bool) -> None:
        self.query = query
        self.authorization = authorization
        self.close = close


_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
_VALUE = rb"[^\x00-\x08\x0a-\x1f\x7f]*"
_HEAD = re.compile(rb"GET /v1/check\?([!\x22$-~]+) HTTP/1\.1((?:\r\n%s:%s)*)" % (_TOKEN, _VALUE))
"""The heads the fast path reads: the request line (a query of printable ASCII without
'#'), then header lines of a token name, a
colon and a value without control characters but tab (so no folded lines, no bare CR or
LF); the query and the header lines are its groups."""
_NOTABLE = re.compile(
    rb"\r\n(transfer-encoding|upgrade|expect|proxy-connection|content-length|authorization"
    rb"|connection|host|content-location|content-range|content-type|etag|max-forwards|server"
    rb"|user-agent):([^\r]*)",
    re.I,
)
"""The header lines the fast path must look at: those it hands off, those it reads, and
aiohttp's singleton headers (RFC 9110; aiohttp answers 400 to a duplicate)."""
_RARE = re.compile(
    rb"\r\n(?:transfer-encoding|upgrade|expect|proxy-connection|content-length|authorization"
    rb"|connection|content-location|content-range|content-type|etag|max-forwards|server):"
)
"""The notable headers but Host and User-Agent, in lower-cased header lines: a head with
none of them, one Host and at most one User-Agent (the common case) needs no more look."""
_SINGLETONS = frozenset(
    {
        b"content-length",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        b"host",
        b"max-forwards",
        b"server",
        b"user-agent",
    }
)


def parse_head(head: bytes, known: frozenset[str]) -> CheckHead | None:
    """A ``GET /v1/check`` head (without its blank line), or None for any other: also for
    every head aiohttp would read differently (a missing or duplicate ``Host``, any other
    duplicate singleton header, ``Proxy-Connection``, a ``Connection`` other than
    ``close`` or ``keep-alive``)."""
    match = _HEAD.fullmatch(head)
    if match is None:
        return None
    query = parse_query(match[1], known)
    if query is None:
        return None
    lines = match[2]
    if lines.count(b"\n") > HEADERS_MAX:
        return None
    low = lines.lower()
    if (
        low.count(b"\r\nhost:") == 1
        and low.count(b"\r\nuser-agent:") <= 1
        and _RARE.search(low) is None
    ):
        return CheckHead(query, None, False)
    authorization: bytes | None = None
    connection: bytes | None = None
    seen: set[bytes] = set()
    for raw_name, raw_value in _NOTABLE.findall(lines):
        name, value = raw_name.lower(), raw_value.strip(b" \t")
        if name in _HANDED_OFF_HEADERS:
            return None
        if name in seen and (name in _SINGLETONS or name in _ONCE):
            return None
        seen.add(name)
        if name == b"content-length":
            if value != b"0":
                return None
        elif name == b"authorization":
            authorization = value
        elif name == b"connection":
            connection = value
    if b"host" not in seen:
        return None
    close = False
    if connection is not None:
        tokens = {token.strip(b" \t").lower() for token in connection.split(b",")}
        tokens.discard(b"")
        if tokens == {b"close"}:
            close = True
        elif tokens != {b"keep-alive"}:
            return None  # e.g. "Upgrade", "close, x": aiohttp's to judge
    return CheckHead(query, authorization, close)
