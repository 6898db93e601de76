"""NAT64 beyond the well-known prefix (issue 46, item 10): RFC 8215's local-use
64:ff9b:1::/48 and a deployment's network-specific prefixes (``ingest.nat64_prefixes``,
RFC 6052's embedding per prefix length) are folded to the IPv4 client each carries."""

from __future__ import annotations

import pytest

from pipeline.core.normalise import (
    NetworkSet,
    SourceRules,
    embedded_ipv4,
    format_source,
    parse_address,
    parse_nat64_prefix,
)
from pipeline.settings import ConfigError, load_settings
from pipeline.wiring import build_normaliser

# RFC 6052 section 2.4's table: 192.0.2.33 under a prefix of each length.
RFC6052_EXAMPLES = [
    ("2001:db8::/32", "2001:db8:c000:221::"),
    ("2001:db8:100::/40", "2001:db8:1c0:2:21::"),
    ("2001:db8:122::/48", "2001:db8:122:c000:2:2100::"),
    ("2001:db8:122:300::/56", "2001:db8:122:3c0:0:221::"),
    ("2001:db8:122:344::/64", "2001:db8:122:344:c0:2:2100:0"),
    ("2001:db8:122:344::/96", "2001:db8:122:344::192.0.2.33"),
]


def source(peer: str, *prefixes: str) -> str:
    rules = SourceRules(
        trusted_proxies=NetworkSet(), nat64_prefixes=tuple(parse_nat64_prefix(p) for p in prefixes)
    )
    return rules.source_of(peer, [])


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("64:ff9b:1::1.2.3.4", "1.2.3.4"),
        ("64:ff9b:1:abcd:0:ef:198.51.100.7", "198.51.100.7"),
        ("64:ff9b:1:abcd:0:ef:198.51.100.8", "198.51.100.8"),
        ("64:ff9b::1.2.3.4", "1.2.3.4"),  # the well-known prefix, as before
        ("64:ff9b:2::1.2.3.4", "64:ff9b:2::/64"),  # outside both
    ],
)
def test_rfc8215_local_use_prefix_is_folded(peer: str, expected: str) -> None:
    """Clients translated through 64:ff9b:1::/48 (a /96 inside it) are each their IPv4
    address, not one shared /64."""
    assert source(peer) == expected


@pytest.mark.parametrize(("prefix", "peer"), RFC6052_EXAMPLES)
def test_network_specific_prefixes_use_rfc6052_embedding(prefix: str, peer: str) -> None:
    """Each RFC 6052 prefix length, configured, gives the example's 192.0.2.33; without the
    prefix configured the address stays an IPv6 /64."""
    assert source(peer, prefix) == "192.0.2.33"
    address = parse_address(peer)
    assert address is not None
    assert format_source(embedded_ipv4(address)) != "192.0.2.33"


def test_a_nonzero_u_octet_is_not_a_translated_address() -> None:
    """Bits 64-71 must be zero in RFC 6052 addresses: one that is not stays IPv6."""
    assert source("2001:db8:122:c000:ff02:2100::", "2001:db8:122::/48") == "2001:db8:122:c000::/64"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2001:db8::/50", "RFC 6052 allows /32, /40, /48, /56, /64 or /96"),
        ("2001:db8::", "RFC 6052 allows /32, /40, /48, /56, /64 or /96"),
        ("192.0.2.0/24", "is not an IPv6 prefix"),
        ("2001:db8:0:0:ff00::/96", "bits 64-71"),
        ("2001:db8::1/32", "has bits set after /32"),
        ("nat64", "is not a CIDR range"),
    ],
)
def test_a_bad_prefix_is_refused_with_advice(text: str, says: str) -> None:
    """A prefix RFC 6052 cannot embed in is a ValueError naming what to write."""
    with pytest.raises(ValueError, match=says):
        parse_nat64_prefix(text)


def test_the_setting_reaches_the_normaliser_and_is_validated() -> None:
    """ingest.nat64_prefixes configures the normaliser every component builds; a bad entry
    is a ConfigError naming the setting."""
    settings = load_settings(ingest={"nat64_prefixes": ["2001:db8:122::/48"]})
    rules = build_normaliser(settings).sources
    assert rules.source_of("2001:db8:122:c000:2:2100::", []) == "192.0.2.33"
    assert rules.source_of("2001:db8:122:c633:64:700::", []) == "198.51.100.7"
    with pytest.raises(ConfigError, match=r"ingest\.nat64_prefixes.*RFC 6052 allows"):
        load_settings(ingest={"nat64_prefixes": ["2001:db8::/50"]})
