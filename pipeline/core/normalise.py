"""Normalisation of the parts of an attempt that identify who is trying: account and source.

Addresses are parsed with ``socket.inet_pton`` into integers (ten times cheaper than
``ipaddress``), so one normalisation costs a few microseconds.
"""

from __future__ import annotations

import re
import socket
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.core.errors import InvalidAttempt

_V6_BITS = 128
_V4_BITS = 32
_V4_MASK = 0xFFFFFFFF
_NAT64_PREFIX = 0x0064FF9B << 96  # 64:ff9b::/96 (RFC 6052 well-known prefix)
_NAT64_LOCAL = 0x0064FF9B0001  # 64:ff9b:1::/48 (RFC 8215 local use), IPv4 in bits 96-127
NAT64_LENGTHS = (32, 40, 48, 56, 64, 96)
"""The prefix lengths RFC 6052 embeds IPv4 addresses under."""
_V4_TRANSLATED_PREFIX = 0xFFFF0000 << 32  # ::ffff:0:0/96 (RFC 2765)
_6TO4_PREFIX = 0x2002  # 2002::/16 (RFC 3056), the IPv4 address in bits 16-47
_TEREDO_PREFIX = 0x20010000  # 2001::/32 (RFC 4380), the client IPv4 inverted in bits 96-127

DEFAULT_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
    "\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)
"""Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt, Unicode 15.1): soft
hyphen, zero-width space/joiners, bidi controls, variation selectors, fillers, tags. They
render as nothing, so ``al\u200bice`` looks like ``alice``."""


def normalise_account(account: str, *, case_sensitive: bool = False) -> str:
    """Default-ignorable code points removed, then NFKC, trimmed, case-folded unless the
    tenant is case-sensitive.

    NFKC folds compatibility forms (full-width letters, ligatures) onto their plain
    letters, so full-width ``alice`` and ``alice`` count as one account; invisible code
    points (zero-width space, soft hyphen, ...) are dropped first, so ``al\u00adice`` is
    ``alice`` too. Look-alike letters of other scripts (Cyrillic a, U+0430) stay distinct:
    that is the login service's matter.
    """
    if not account.isascii():
        account = DEFAULT_IGNORABLE.sub("", account)
    text = unicodedata.normalize("NFKC", account).strip()
    if not case_sensitive:
        text = text.casefold()
        # casefold can produce sequences NFKC would compose differently; settle once more.
        text = unicodedata.normalize("NFKC", text)
    if not text:
        raise InvalidAttempt("empty_account", "account is empty after normalisation")
    return text


@dataclass(frozen=True, slots=True)
class Address:
    """An IP address as (version, integer); IPv4-mapped IPv6 is already folded to IPv4."""

    version: int
    value: int


def parse_address(text: str) -> Address | None:
    """Parse an IPv4 or IPv6 literal; None for anything else (never raises)."""
    text = text.strip()
    if not text or len(text) > 64:
        return None
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    zone = text.find("%")
    if zone != -1:
        text = text[:zone]
    try:
        if ":" in text:
            value = int.from_bytes(socket.inet_pton(socket.AF_INET6, text), "big")
            if value >> 32 == 0xFFFF:
                return Address(4, value & 0xFFFFFFFF)
            return Address(6, value)
        return Address(4, int.from_bytes(socket.inet_pton(socket.AF_INET, text), "big"))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Network:
    """A CIDR range, parsed once."""

    version: int
    value: int
    prefix: int

    def contains(self, address: Address) -> bool:
        if address.version != self.version:
            return False
        bits = _V4_BITS if self.version == 4 else _V6_BITS
        shift = bits - self.prefix
        return (address.value >> shift) == (self.value >> shift)


def parse_network(text: str) -> Network:
    """Parse ``a.b.c.d/n`` or ``x::/n`` (or a bare address); raises ValueError with advice."""
    addr_text, _, prefix_text = text.strip().partition("/")
    address = parse_address(addr_text)
    if address is None:
        raise ValueError(f"{text!r} is not a CIDR range; write it like 10.0.0.0/8 or 2001:db8::/32")
    bits = _V4_BITS if address.version == 4 else _V6_BITS
    if prefix_text and address.version == 4 and ":" in addr_text:
        bits = _V6_BITS  # a mapped range written in IPv6 notation keeps IPv6 prefix arithmetic
    try:
        prefix = int(prefix_text) if prefix_text else bits
    except ValueError as exc:
        raise ValueError(f"{text!r} has a bad prefix length; use /0 to /{bits}") from exc
    if bits == _V6_BITS and address.version == 4:
        prefix = max(0, prefix - (_V6_BITS - _V4_BITS))
        bits = _V4_BITS
    if not 0 <= prefix <= bits:
        raise ValueError(f"{text!r} has a prefix outside /0 to /{bits}")
    mask = ((1 << bits) - 1) ^ ((1 << (bits - prefix)) - 1)
    return Network(address.version, address.value & mask, prefix)


class NetworkSet:
    """A small set of CIDR ranges (trusted proxies, allowlists); membership is a linear scan
    over the configured ranges, which are few (a handful of proxies), never per-event data."""

    __slots__ = ("_networks",)

    def __init__(self, networks: Iterable[str] = ()) -> None:
        self._networks = tuple(parse_network(n) for n in networks)

    def __contains__(self, address: Address) -> bool:
        return any(net.contains(address) for net in self._networks)

    def __bool__(self) -> bool:
        return bool(self._networks)


def format_source(address: Address, *, ipv4_prefix: int = 32, ipv6_prefix: int = 64) -> str:
    """The canonical source text: the address, or its network ``/n`` when grouped."""
    if address.version == 4:
        if ipv4_prefix >= _V4_BITS:
            return socket.inet_ntop(socket.AF_INET, address.value.to_bytes(4, "big"))
        masked = address.value & (((1 << _V4_BITS) - 1) ^ ((1 << (_V4_BITS - ipv4_prefix)) - 1))
        return socket.inet_ntop(socket.AF_INET, masked.to_bytes(4, "big")) + f"/{ipv4_prefix}"
    if ipv6_prefix >= _V6_BITS:
        return socket.inet_ntop(socket.AF_INET6, address.value.to_bytes(16, "big"))
    masked = address.value & (((1 << _V6_BITS) - 1) ^ ((1 << (_V6_BITS - ipv6_prefix)) - 1))
    return socket.inet_ntop(socket.AF_INET6, masked.to_bytes(16, "big")) + f"/{ipv6_prefix}"


def parse_hop(text: str) -> Address | None:
    """One X-Forwarded-For entry: an address, ``a.b.c.d:port`` or ``[v6]:port`` (as some
    load balancers append); None for anything else (``unknown``, ``_hidden``, garbage)."""
    text = text.strip()
    address = parse_address(text)
    if address is not None or len(text) > 64:
        return address
    if text.startswith("["):
        close = text.find("]:")
        port = text[close + 2 :]
        if close > 0 and port.isdigit() and len(port) <= 5:
            return parse_address(text[1:close])
        return None
    host, sep, port = text.rpartition(":")
    if sep and "." in host and ":" not in host and port.isdigit() and len(port) <= 5:
        return parse_address(host)
    return None


def parse_nat64_prefix(text: str) -> Network:
    """A NAT64 network-specific prefix (RFC 6052): an IPv6 ``/32``, ``/40``, ``/48``,
    ``/56``, ``/64`` or ``/96`` with no bits set after its length (and, for a ``/96``, bits
    64-71 zero, as RFC 6052 reserves them); raises ValueError with advice."""
    network = parse_network(text)
    address_text, _, prefix_text = text.strip().partition("/")
    if network.version != 6 or not prefix_text:
        lengths = ", ".join(f"/{n}" for n in NAT64_LENGTHS[:-1]) + f" or /{NAT64_LENGTHS[-1]}"
        if network.version != 6:
            raise ValueError(
                f"{text!r} is not an IPv6 prefix; a NAT64 prefix looks like 2001:db8:64::/96"
            )
        raise ValueError(f"{text!r} has no length: RFC 6052 allows {lengths}")
    if network.prefix not in NAT64_LENGTHS:
        lengths = ", ".join(f"/{n}" for n in NAT64_LENGTHS[:-1]) + f" or /{NAT64_LENGTHS[-1]}"
        raise ValueError(f"{text!r}: RFC 6052 allows {lengths}, the lengths it embeds IPv4 under")
    written = parse_address(address_text)
    if written is None or written.value != network.value:
        raise ValueError(
            f"{text!r} has bits set after /{network.prefix}; write the prefix itself, "
            f"like {format_source(Address(6, network.value), ipv6_prefix=network.prefix)}"
        )
    if network.prefix == 96 and (network.value >> 56) & 0xFF:
        raise ValueError(f"{text!r} sets bits 64-71, which RFC 6052 reserves (must be zero)")
    return network


def _nat64_ipv4(value: int, prefix: int) -> int:
    """The IPv4 address in ``value`` under an RFC 6052 prefix of length ``prefix``: the 32
    bits after the prefix, skipping bits 64-71 (the reserved octet); -1 when that octet
    is not zero (no translated address)."""
    if (value >> 56) & 0xFF:
        return -1
    without_u = ((value >> 64) << 56) | (value & ((1 << 56) - 1))  # 120 bits
    start = prefix if prefix <= 64 else prefix - 8  # a /96 holds the reserved octet
    return (without_u >> (120 - start - _V4_BITS)) & _V4_MASK


def embedded_ipv4(address: Address, nat64_prefixes: Sequence[Network] = ()) -> Address:
    """The IPv4 address an IPv6 address carries, for the ranges that carry one: a
    deployment's NAT64 ``nat64_prefixes`` (RFC 6052's embedding for each prefix length),
    NAT64 ``64:ff9b::/96`` and ``64:ff9b:1::/48`` (RFC 8215, the address in the last 32
    bits, as a /96 inside it puts it), IPv4-compatible ``::a.b.c.d`` (not ``::`` or
    ``::1``), IPv4-translated ``::ffff:0:a.b.c.d``, 6to4 ``2002:AABB:CCDD::/48`` and Teredo
    ``2001:0::/32`` (the client's address, stored inverted); any other address as it is
    (a NAT64 address whose bits 64-71 are not zero too).

    So every IPv4 client behind NAT64 is its own source instead of one shared /64, and
    one 6to4 or Teredo host is one source instead of 65,536 /64s."""
    if address.version != 6:
        return address
    value = address.value
    for network in nat64_prefixes:
        if network.contains(address):
            ipv4 = _nat64_ipv4(value, network.prefix)
            return address if ipv4 < 0 else Address(4, ipv4)
    if value >> 80 == _NAT64_LOCAL:
        ipv4 = _nat64_ipv4(value, 96)
        return address if ipv4 < 0 else Address(4, ipv4)
    high = value >> 32
    if high == _NAT64_PREFIX >> 32 or high == _V4_TRANSLATED_PREFIX >> 32:
        return Address(4, value & _V4_MASK)
    if high == 0 and value > 1:
        return Address(4, value & _V4_MASK)
    if value >> 112 == _6TO4_PREFIX:
        return Address(4, (value >> 80) & _V4_MASK)
    if value >> 96 == _TEREDO_PREFIX:
        return Address(4, (value & _V4_MASK) ^ _V4_MASK)
    return address


def client_address(
    peer_ip: str, forwarded_for: Sequence[str], trusted_proxies: NetworkSet
) -> Address:
    """The right-most address of ``forwarded_for + [peer_ip]`` that is not a trusted proxy.

    Only hops appended by trusted proxies are believed: walking from the right, the first
    untrusted address is the client, and anything to its left is the client's own claim.
    An entry holding a comma-joined header value (``"6.6.6.6, 198.51.100.2"``, as some
    frameworks hand over a whole X-Forwarded-For line) is split on its commas into its
    hops, as the edge splits a header string, so a list of header lines reads like the one
    joined header. Hops are read by ``parse_hop`` (``ip:port`` and ``[v6]:port`` too);
    empty entries are no hops (proxies append an address, ``unknown`` or ``_hidden``, never nothing,
    and the edge's header split drops them too). A hop that still does not parse stops
    the walk, failing closed: the trusted proxy that appended it (the hop to its right,
    or the peer) is the source, never a claim further left. If
    every hop is a trusted proxy, the left-most one is the source. Raises InvalidAttempt
    for a bad ``peer_ip``. The worker and the edge both call this one function.
    """
    peer = parse_address(peer_ip)
    if peer is None:
        raise InvalidAttempt("bad_peer_ip", f"peer_ip {peer_ip[:64]!r} is not an IP address")
    if not trusted_proxies or peer not in trusted_proxies:
        return peer
    if any("," in hop for hop in forwarded_for):
        forwarded_for = [part for hop in forwarded_for for part in hop.split(",")]
    last_trusted = peer
    for hop_text in reversed(forwarded_for):
        hop = parse_hop(hop_text)
        if hop is None:
            if not hop_text.strip():
                continue  # an empty entry ("a,,b", a trailing comma) is no hop
            return last_trusted
        if hop not in trusted_proxies:
            return hop
        last_trusted = hop
    return last_trusted


@dataclass(frozen=True, slots=True)
class SourceRules:
    """How sources are derived: trusted proxies, a deployment's NAT64 prefixes
    (``parse_nat64_prefix``) and grouping prefixes (frozen config)."""

    trusted_proxies: NetworkSet
    ipv4_prefix: int = 32
    ipv6_prefix: int = 64
    nat64_prefixes: tuple[Network, ...] = ()

    def source_of(self, peer_ip: str, forwarded_for: Sequence[str]) -> str:
        client = client_address(peer_ip, forwarded_for, self.trusted_proxies)
        address = embedded_ipv4(client, self.nat64_prefixes)
        return format_source(address, ipv4_prefix=self.ipv4_prefix, ipv6_prefix=self.ipv6_prefix)
