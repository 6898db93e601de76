"""Block-list sources at the grouping's resolution.

Every attempt's source is one group: an IPv4 address (or its ``ingest.ipv4_prefix``
network) or an IPv6 ``ingest.ipv6_prefix`` network (``format_source``). A decision on a
wider prefix would refuse more than any rule or operator can have meant (``0.0.0.0/0`` on
the nginx feed is a deny-all), so every reader of decisions (the edge's view and feed,
the audit sink, ``authpipe decisions add``) refuses a source whose prefix is shorter than
the grouping.

An IPv6 address that carries an IPv4 address (NAT64 ``64:ff9b::1.2.3.4``, IPv4-mapped,
-compatible, -translated, 6to4, Teredo: ``normalise.embedded_ipv4``) is counted by ingest
as that IPv4 address, so ``authpipe decisions add`` folds it the same way (a block on
``64:ff9b::/64`` would never match a check and, on an nginx behind NAT64, would deny every
translated client), refuses an IPv6 range that holds such a range whole, and the readers
refuse a source written in IPv6 that ingest would have counted as IPv4.
"""

from __future__ import annotations

from pipeline.core.normalise import Address, Network, embedded_ipv4, format_source, parse_network

_EMBEDDED = (
    # (the range, the bit where its IPv4 address starts, its name for a person)
    (parse_network("64:ff9b::/96"), 96, "the NAT64 range 64:ff9b::/96"),
    (parse_network("::ffff:0:0:0/96"), 96, "the IPv4-translated range ::ffff:0:0:0/96"),
    (parse_network("::/96"), 96, "the IPv4-compatible range ::/96"),
    (parse_network("2002::/16"), 16, "the 6to4 range 2002::/16"),
    (parse_network("2001::/32"), 96, "the Teredo range 2001::/32"),
)


def _v4_network(value: int, prefix: int) -> Network:
    return Network(4, value & ((0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF), prefix)


def fold_embedded(network: Network, text: str, *, strict: bool = True) -> Network:
    """``network`` as ingest counts its clients: an IPv6 address or range inside a range
    that carries IPv4 addresses becomes the IPv4 address or network it carries (as
    ``embedded_ipv4`` folds a peer); anything else as it is. Raises ValueError (with a
    message for a person) for a range inside one that spans several embedded clients
    (a Teredo range above /96), and, when ``strict``, for a range that holds such a
    range whole (``64:ff9b::/64``)."""
    if network.version != 6:
        return network
    if network.prefix == 128:
        address = embedded_ipv4(Address(6, network.value))
        return network if address.version == 6 else Network(4, address.value, 32)
    start = Address(6, network.value)
    for embedded, v4_start, name in _EMBEDDED:
        if network.prefix >= embedded.prefix and embedded.contains(start):
            if network.prefix < v4_start:
                raise ValueError(
                    f"{text} spans many clients of {name}, which authpipe counts by the IPv4 "
                    "address each carries; block those IPv4 addresses instead"
                )
            return _v4_network(embedded_ipv4(start).value, min(32, network.prefix - v4_start))
        holds = network.prefix < embedded.prefix and network.contains(Address(6, embedded.value))
        if strict and holds:
            raise ValueError(
                f"{text} holds {name}, whose clients authpipe counts by the IPv4 address each "
                "carries (a block on it would never match them); block those IPv4 "
                "addresses, or a narrower IPv6 range outside it"
            )
    return network


def check_block_source(text: str, ipv4_prefix: int = 32, ipv6_prefix: int = 64) -> str:
    """The canonical group of a block-list source (an address or CIDR): the text the
    pipeline gives attempts from it (embedded IPv4 folded as ingest folds a peer). Raises
    ValueError (with a message for a person) when it is not an address or CIDR, holds an
    embedded-IPv4 range whole, or its prefix is shorter than the grouping."""
    return _canonical(text, ipv4_prefix, ipv6_prefix, strict=True)


def _canonical(text: str, ipv4_prefix: int, ipv6_prefix: int, *, strict: bool) -> str:
    network = fold_embedded(parse_network(text), text, strict=strict)
    grouping = ipv4_prefix if network.version == 4 else ipv6_prefix
    if network.prefix < grouping:
        family = "IPv4" if network.version == 4 else "IPv6"
        raise ValueError(
            f"{text} is wider than one source: {family} sources are grouped by /{grouping} "
            f"(ingest.ipv{network.version}_prefix), so a block-list entry must be a /{grouping} "
            "or narrower"
        )
    return format_source(
        Address(network.version, network.value), ipv4_prefix=ipv4_prefix, ipv6_prefix=ipv6_prefix
    )


def within_grouping(text: str, ipv4_prefix: int = 32, ipv6_prefix: int = 64) -> bool:
    """Whether a decision's source ``text`` parses as an address or CIDR no wider than the
    grouping, in the family ingest gives its attempts: a source written in IPv6 that
    carries an IPv4 address (``64:ff9b::1.2.3.4``, ``::ffff:1.2.3.4``) is refused, since
    no attempt has it. (A range that merely holds an embedded range, ``64:ff9b::/64``, is
    the source of the other addresses in it, and passes.)"""
    try:
        canonical = _canonical(text, ipv4_prefix, ipv6_prefix, strict=False)
    except ValueError:
        return False
    return (":" in canonical) == (":" in text)
