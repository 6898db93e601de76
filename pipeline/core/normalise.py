"""Normalisation of the parts of an attempt that identify who is trying: account and source.

Addresses are parsed with ``socket.inet_pton`` into integers (ten times cheaper than
``ipaddress``), so one normalisation costs a few microseconds.
"""

from __future__ import annotations

import socket
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.core.errors import InvalidAttempt

_V4_MAPPED_PREFIX = 0xFFFF << 32
_V6_BITS = 128
_V4_BITS = 32


def normalise_account(account: str, *, case_sensitive: bool = False) -> str:
    """NFKC, trimmed, case-folded unless the tenant is case-sensitive.

    NFKC folds compatibility forms (full-width letters, ligatures) onto their plain
    letters, so full-width ``alice`` and ``alice`` count as one account.
    """
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


def client_address(
    peer_ip: str, forwarded_for: Sequence[str], trusted_proxies: NetworkSet
) -> Address:
    """The right-most address of ``forwarded_for + [peer_ip]`` that is not a trusted proxy.

    Only hops appended by trusted proxies are believed: walking from the right, the first
    untrusted address is the client, and anything to its left is the client's own claim.
    Unparseable ``forwarded_for`` entries are skipped one by one. If every hop is a trusted
    proxy, the left-most one is the source. Raises InvalidAttempt for a bad ``peer_ip``.
    """
    peer = parse_address(peer_ip)
    if peer is None:
        raise InvalidAttempt("bad_peer_ip", f"peer_ip {peer_ip[:64]!r} is not an IP address")
    if not trusted_proxies or peer not in trusted_proxies:
        return peer
    last_trusted = peer
    for hop_text in reversed(forwarded_for):
        hop = parse_address(hop_text)
        if hop is None:
            continue
        if hop not in trusted_proxies:
            return hop
        last_trusted = hop
    return last_trusted


@dataclass(frozen=True, slots=True)
class SourceRules:
    """How sources are derived: trusted proxies and grouping prefixes (frozen config)."""

    trusted_proxies: NetworkSet
    ipv4_prefix: int = 32
    ipv6_prefix: int = 64

    def source_of(self, peer_ip: str, forwarded_for: Sequence[str]) -> str:
        address = client_address(peer_ip, forwarded_for, self.trusted_proxies)
        return format_source(address, ipv4_prefix=self.ipv4_prefix, ipv6_prefix=self.ipv6_prefix)
