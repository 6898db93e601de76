"""Block-list sources at the grouping's resolution.

Every attempt's source is one group: an IPv4 address (or its ``ingest.ipv4_prefix``
network) or an IPv6 ``ingest.ipv6_prefix`` network (``format_source``). A decision on a
wider prefix would refuse more than any rule or operator can have meant (``0.0.0.0/0`` on
the nginx feed is a deny-all), so every reader of decisions (the edge's view and feed,
the audit sink, ``authpipe decisions add``) refuses a source whose prefix is shorter than
the grouping.

An IPv6 address that carries an IPv4 address (NAT64 ``64:ff9b::1.2.3.4`` and
``64:ff9b:1::/48``, a deployment's ``ingest.nat64_prefixes``, IPv4-mapped, -compatible,
-translated, 6to4, Teredo: ``normalise.embedded_ipv4``) is counted by ingest as that IPv4
address, so ``authpipe decisions add`` folds it the same way (a block on ``64:ff9b::/64``
would never match a check and, on an nginx behind NAT64, would deny every translated
client), refuses an IPv6 range that holds such a range whole or spans many of its clients,
and the readers refuse a source written in IPv6 that ingest would have counted as IPv4.
The deployment's NAT64 prefixes are the caller's (``SourceRules.nat64_prefixes``, parsed
by ``normalise.parse_nat64_prefix``): the core never reads settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core.normalise import Address, Network, embedded_ipv4, format_source, parse_network

_U_OCTET = 64
"""RFC 6052 reserves bits 64-71 of a NAT64 address (zero); one with them set carries no
IPv4 address (``embedded_ipv4`` leaves it IPv6)."""


@dataclass(frozen=True, slots=True)
class _Embedding:
    """A range whose addresses carry an IPv4 address, as ``embedded_ipv4`` reads it."""

    network: Network
    spans: tuple[tuple[int, int], ...]  # the bits that hold the IPv4 address, in order
    name: str  # for a person
    u_octet: bool = False  # RFC 6052's reserved octet decides whether an address carries one

    def ipv4_bits(self, prefix: int) -> int:
        """How many bits of the carried IPv4 address a range of length ``prefix`` fixes."""
        return sum(max(0, min(prefix, end) - start) for start, end in self.spans)

    def u_fixed(self, network: Network) -> tuple[int, int]:
        """(how many bits of the reserved octet ``network`` fixes, their value)."""
        fixed = min(8, max(0, network.prefix - _U_OCTET)) if self.u_octet else 0
        return fixed, (network.value >> (128 - _U_OCTET - fixed)) & ((1 << fixed) - 1)


_LAST_32 = ((96, 128),)
_BUILT_IN = (
    _Embedding(parse_network("64:ff9b:1::/48"), _LAST_32, "the NAT64 range 64:ff9b:1::/48", True),
    _Embedding(parse_network("64:ff9b::/96"), _LAST_32, "the NAT64 range 64:ff9b::/96"),
    _Embedding(
        parse_network("::ffff:0:0:0/96"), _LAST_32, "the IPv4-translated range ::ffff:0:0:0/96"
    ),
    _Embedding(parse_network("::/96"), _LAST_32, "the IPv4-compatible range ::/96"),
    _Embedding(parse_network("2002::/16"), ((16, 48),), "the 6to4 range 2002::/16"),
    _Embedding(parse_network("2001::/32"), _LAST_32, "the Teredo range 2001::/32"),
)


def _configured(prefix: Network) -> _Embedding:
    """A deployment's NAT64 prefix with RFC 6052's layout for its length: the IPv4 address
    right after the prefix, around the reserved octet."""
    length = prefix.prefix
    if length >= 96:
        spans: tuple[tuple[int, int], ...] = ((length, length + 32),)
    elif length >= _U_OCTET:
        spans = ((_U_OCTET + 8, _U_OCTET + 40),)
    else:
        spans = ((length, _U_OCTET), (_U_OCTET + 8, _U_OCTET + 8 + 32 - (_U_OCTET - length)))
    name = f"the NAT64 prefix {_text(prefix)} (ingest.nat64_prefixes)"
    return _Embedding(prefix, spans, name, True)


def _embeddings(nat64_prefixes: Sequence[Network]) -> Sequence[_Embedding]:
    """Every embedding range, in the order ``embedded_ipv4`` tries them."""
    if not nat64_prefixes:
        return _BUILT_IN
    return (*(_configured(prefix) for prefix in nat64_prefixes), *_BUILT_IN)


def _text(network: Network) -> str:
    return format_source(
        Address(network.version, network.value),
        ipv4_prefix=network.prefix if network.version == 4 else 32,
        ipv6_prefix=network.prefix if network.version == 6 else 128,
    )


def _v4_network(value: int, prefix: int) -> Network:
    return Network(4, value & ((0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF), prefix)


def fold_embedded(
    network: Network,
    text: str,
    *,
    strict: bool = True,
    nat64_prefixes: Sequence[Network] = (),
) -> Network:
    """``network`` as ingest counts its clients: an IPv6 address or range inside a range
    that carries IPv4 addresses (the built-in ones and the deployment's
    ``nat64_prefixes``) becomes the IPv4 address or network it carries (as
    ``embedded_ipv4`` folds a peer); anything else as it is. Raises ValueError (with a
    message for a person) for a range inside one that spans several embedded clients
    (a Teredo range above /96, ``64:ff9b:1::/64``), and, when ``strict``, for a range that
    holds such a range whole (``64:ff9b::/64``).

    A NAT64 address whose reserved octet (bits 64-71) is set carries nothing, so a range
    that does not fix that octet is also the source of such addresses: when not
    ``strict`` (a reader) it passes as it is, as ``64:ff9b::/64`` does."""
    if network.version != 6:
        return network
    if network.prefix == 128:
        address = embedded_ipv4(Address(6, network.value), nat64_prefixes)
        return network if address.version == 6 else Network(4, address.value, 32)
    start = Address(6, network.value)
    for embedding in _embeddings(nat64_prefixes):
        embedded, name = embedding.network, embedding.name
        if network.prefix >= embedded.prefix and embedded.contains(start):
            fixed, u_value = embedding.u_fixed(network)
            if u_value or (not strict and embedding.u_octet and fixed < 8):
                return network  # no translated client, or also the source of the others
            if network.prefix < embedding.spans[0][0]:
                raise ValueError(
                    f"{text} spans many clients of {name}, which authpipe counts by the IPv4 "
                    "address each carries; block those IPv4 addresses instead"
                )
            ipv4 = embedded_ipv4(start, nat64_prefixes).value
            return _v4_network(ipv4, min(32, embedding.ipv4_bits(network.prefix)))
        holds = network.prefix < embedded.prefix and network.contains(Address(6, embedded.value))
        if strict and holds:
            raise ValueError(
                f"{text} holds {name}, whose clients authpipe counts by the IPv4 address each "
                "carries (a block on it would never match them); block those IPv4 "
                "addresses, or a narrower IPv6 range outside it"
            )
    return network


def check_block_source(
    text: str,
    ipv4_prefix: int = 32,
    ipv6_prefix: int = 64,
    nat64_prefixes: Sequence[Network] = (),
) -> str:
    """The canonical group of a block-list source (an address or CIDR): the text the
    pipeline gives attempts from it (embedded IPv4 folded as ingest folds a peer, with the
    deployment's ``nat64_prefixes``). Raises ValueError (with a message for a person) when
    it is not an address or CIDR, holds an embedded-IPv4 range whole, or its prefix is
    shorter than the grouping."""
    return _canonical(text, ipv4_prefix, ipv6_prefix, nat64_prefixes, strict=True)


def _canonical(
    text: str,
    ipv4_prefix: int,
    ipv6_prefix: int,
    nat64_prefixes: Sequence[Network],
    *,
    strict: bool,
) -> str:
    written = parse_network(text)
    network = fold_embedded(written, text, strict=strict, nat64_prefixes=nat64_prefixes)
    grouping = ipv4_prefix if network.version == 4 else ipv6_prefix
    if network.prefix < grouping:
        family = "IPv4" if network.version == 4 else "IPv6"
        folded = ""
        if network.version != written.version:
            folded = f" (the IPv4 range {_text(network)} as ingest counts it)"
        raise ValueError(
            f"{text}{folded} is wider than one source: {family} sources are grouped by /{grouping} "
            f"(ingest.ipv{network.version}_prefix), so a block-list entry must be a /{grouping} "
            "or narrower"
        )
    return format_source(
        Address(network.version, network.value), ipv4_prefix=ipv4_prefix, ipv6_prefix=ipv6_prefix
    )


def within_grouping(
    text: str,
    ipv4_prefix: int = 32,
    ipv6_prefix: int = 64,
    nat64_prefixes: Sequence[Network] = (),
) -> bool:
    """Whether a decision's source ``text`` parses as an address or CIDR no wider than the
    grouping, in the family ingest gives its attempts: a source written in IPv6 that
    carries an IPv4 address (``64:ff9b::1.2.3.4``, ``::ffff:1.2.3.4``, one in the
    deployment's ``nat64_prefixes``) is refused, since no attempt has it. (A range that
    merely holds an embedded range, ``64:ff9b::/64``, is the source of the other addresses
    in it, and passes.)"""
    try:
        canonical = _canonical(text, ipv4_prefix, ipv6_prefix, nat64_prefixes, strict=False)
    except ValueError:
        return False
    return (":" in canonical) == (":" in text)
