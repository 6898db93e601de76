"""Block-list sources at the grouping's resolution.

Every attempt's source is one group: an IPv4 address (or its ``ingest.ipv4_prefix``
network) or an IPv6 ``ingest.ipv6_prefix`` network (``format_source``). A decision on a
wider prefix would refuse more than any rule or operator can have meant (``0.0.0.0/0`` on
the nginx feed is a deny-all), so every reader of decisions (the edge's view and feed,
the audit sink, ``authpipe decisions add``) refuses a source whose prefix is shorter than
the grouping.
"""

from __future__ import annotations

from pipeline.core.normalise import Address, format_source, parse_network


def check_block_source(text: str, ipv4_prefix: int = 32, ipv6_prefix: int = 64) -> str:
    """The canonical group of a block-list source (an address or CIDR): the text the
    pipeline gives attempts from it. Raises ValueError (with a message for a person) when
    it is not an address or CIDR, or its prefix is shorter than the grouping."""
    network = parse_network(text)
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
    """Whether ``text`` parses as an address or CIDR no wider than the grouping."""
    try:
        check_block_source(text, ipv4_prefix, ipv6_prefix)
    except ValueError:
        return False
    return True
