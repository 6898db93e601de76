"""Normalisation of accounts and sources (issue 3): trusted proxies, XFF spoofing,
prefixes, mapped and bracketed addresses, Unicode and case."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from pipeline.contracts.models import LoginAttempt
from pipeline.core.attempt import Normaliser, Recent
from pipeline.core.errors import InvalidAttempt
from pipeline.core.keys import Digester
from pipeline.core.normalise import (
    NetworkSet,
    SourceRules,
    client_address,
    embedded_ipv4,
    format_source,
    normalise_account,
    parse_address,
    parse_hop,
    parse_network,
)

PROXIES = NetworkSet(["10.0.0.0/8", "2001:db8:aaaa::/48"])
RULES = SourceRules(PROXIES)


def source(peer: str, xff: list[str] | tuple[str, ...] = (), **kw: int) -> str:
    rules = SourceRules(PROXIES, **kw) if kw else RULES
    return rules.source_of(peer, list(xff))


# -- sources: trusted proxies and X-Forwarded-For ---------------------------------------


def test_untrusted_peer_is_the_source_whatever_xff_says() -> None:
    """A peer that is not a trusted proxy is the client; its XFF claim is ignored."""
    assert source("203.0.113.9", ["192.0.2.1"]) == "203.0.113.9"


def test_right_most_untrusted_hop_wins() -> None:
    """Behind two trusted proxies, the right-most untrusted address is the client."""
    assert source("10.0.0.1", ["198.51.100.20", "203.0.113.5", "10.0.0.2"]) == "203.0.113.5"


def test_spoofed_left_entries_never_win() -> None:
    """Client-supplied entries left of the address the proxy appended are ignored."""
    spoofed = ["1.1.1.1", "8.8.8.8", "10.9.9.9"]  # the client claims to be a proxy chain
    assert source("10.0.0.1", [*spoofed, "203.0.113.77"]) == "203.0.113.77"


def test_spoof_of_a_trusted_proxy_address_only_moves_the_claim() -> None:
    """A client claiming a trusted address on the left still ends as the appended hop."""
    assert source("10.0.0.1", ["10.1.1.1", "198.51.100.3"]) == "198.51.100.3"


def test_a_hop_that_does_not_parse_stops_the_walk_at_its_proxy() -> None:
    """Garbage appended inside the trusted chain fails closed: the proxy that appended it
    (here the peer) is the source, never a client claim further left."""
    xff = ["203.0.113.8", "not-an-ip", "", "999.1.1.1", "10.0.0.3", "unknown", " "]
    assert source("10.0.0.1", xff) == "10.0.0.1"  # " " is no hop; "unknown" stops the walk
    assert source("10.0.0.1", ["203.0.113.8", "", " "]) == "203.0.113.8"


def test_garbage_between_trusted_hops_stops_at_the_proxy_right_of_it() -> None:
    """Garbage between trusted proxies: the trusted hop to its right is the source."""
    assert source("10.0.0.1", ["198.51.100.9", "%%%", "10.0.0.2"]) == "10.0.0.2"


@pytest.mark.parametrize(
    ("hop", "expected"),
    [
        ("203.0.113.7:51234", "203.0.113.7"),
        ("[2001:db8::7]:443", "2001:db8::/64"),
        ("unknown", "10.0.0.1"),
        ("_hidden", "10.0.0.1"),
        ("203.0.113.7:", "10.0.0.1"),
        ("203.0.113.7:123456", "10.0.0.1"),
        ("[2001:db8::7]:x", "10.0.0.1"),
    ],
)
def test_a_client_claim_left_of_a_port_or_obfuscated_hop_is_never_the_source(
    hop: str, expected: str
) -> None:
    """Issue 15 #5: behind a trusted proxy that appends ip:port, [v6]:port, unknown or
    _hidden, the client's own X-Forwarded-For: 6.6.6.6 is never the source."""
    assert source("10.0.0.1", ["6.6.6.6", hop]) == expected


def test_all_trusted_chain_gives_the_left_most_proxy() -> None:
    """If every hop is a trusted proxy, the left-most one is the source (a hop that does
    not parse left of it ends the walk there)."""
    assert source("10.0.0.1", ["junk", "10.0.0.7", "10.0.0.2"]) == "10.0.0.7"
    assert source("10.0.0.1", ["10.0.0.7:80", "10.0.0.2"]) == "10.0.0.7"


def test_trusted_peer_with_empty_xff_is_the_source() -> None:
    """A trusted proxy with no XFF at all is itself the source."""
    assert source("10.0.0.1", []) == "10.0.0.1"


def test_no_trusted_proxies_configured_means_peer() -> None:
    """Without trusted proxies the peer is always the source."""
    rules = SourceRules(NetworkSet())
    assert rules.source_of("10.0.0.1", ["203.0.113.1"]) == "10.0.0.1"


def test_ipv6_grouped_by_64_by_default() -> None:
    """IPv6 sources are grouped by /64: two hosts of one /64 are one source."""
    a = source("2001:db8:1:2:aaaa::1")
    b = source("2001:db8:1:2:bbbb:cccc:dddd:eeee")
    assert a == b == "2001:db8:1:2::/64"
    assert source("2001:db8:1:3::1") == "2001:db8:1:3::/64"


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [(48, "2001:db8:1::/48"), (56, "2001:db8:1:200::/56"), (128, "2001:db8:1:2ff::1")],
)
def test_ipv6_prefix_is_configurable(prefix: int, expected: str) -> None:
    """The IPv6 grouping prefix is configurable (/48, /56, /128 = single address)."""
    assert source("2001:db8:1:2ff::1", ipv6_prefix=prefix) == expected


def test_ipv4_single_address_by_default_and_prefix_option() -> None:
    """IPv4 is the single address by default; a prefix groups it when configured."""
    assert source("203.0.113.77") == "203.0.113.77"
    assert source("203.0.113.77", ipv4_prefix=24) == "203.0.113.0/24"
    assert source("203.0.113.77", ipv4_prefix=16) == "203.0.0.0/16"


def test_ipv4_mapped_ipv6_is_ipv4() -> None:
    """::ffff:a.b.c.d (in either notation) is the same source as a.b.c.d."""
    assert source("::ffff:203.0.113.5") == "203.0.113.5"
    assert source("::ffff:cb00:7105") == "203.0.113.5"
    assert parse_address("::ffff:203.0.113.5") == parse_address("203.0.113.5")


def test_mapped_address_of_a_trusted_proxy_is_trusted() -> None:
    """A proxy seen as IPv4-mapped IPv6 is matched by its IPv4 range."""
    assert source("::ffff:10.0.0.1", ["203.0.113.5"]) == "203.0.113.5"


def test_bracketed_and_zone_id_addresses() -> None:
    """[v6] brackets and %zone suffixes are accepted and dropped."""
    assert source("[2001:db8:5::1]") == "2001:db8:5::/64"
    assert source("fe80::1%eth0", ipv6_prefix=128) == "fe80::1"
    assert source("10.0.0.1", ["[2001:db8:7::9]"]) == "2001:db8:7::/64"


def test_trusted_ipv6_proxy_range() -> None:
    """An IPv6 trusted proxy range is honoured like an IPv4 one."""
    assert source("2001:db8:aaaa::5", ["2001:db8:bbbb::1"]) == "2001:db8:bbbb::/64"


@pytest.mark.parametrize("peer", ["", "garbage", "1.2.3", "1.2.3.4:80", "::g", "x" * 300])
def test_bad_peer_ip_is_invalid_attempt(peer: str) -> None:
    """A peer_ip that is not an address raises InvalidAttempt('bad_peer_ip')."""
    with pytest.raises(InvalidAttempt) as info:
        client_address(peer, [], PROXIES)
    assert info.value.reason == "bad_peer_ip"


def test_parse_network_rejects_bad_ranges_with_advice() -> None:
    """Bad CIDR text raises ValueError naming the text."""
    for bad in ("10.0.0.0/33", "nope/8", "10.0.0.0/x", "2001:db8::/129"):
        with pytest.raises(ValueError, match=r"10\.0\.0\.0|nope|2001"):
            parse_network(bad)


def test_parse_network_mapped_range_uses_ipv4_prefix() -> None:
    """A mapped range in IPv6 notation (::ffff:10.0.0.0/104) means 10.0.0.0/8."""
    net = parse_network("::ffff:10.0.0.0/104")
    assert (net.version, net.prefix) == (4, 8)
    address = parse_address("10.200.0.1")
    assert address is not None and net.contains(address)


_xff_entry = st.one_of(
    st.text(max_size=70),
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    st.sampled_from(["10.0.0.2", "10.255.0.1", "::ffff:10.0.0.9", "2001:db8:aaaa::1"]),
)


@given(
    peer=st.one_of(st.ip_addresses().map(str), st.sampled_from(["10.0.0.1", "2001:db8:aaaa::9"])),
    xff=st.lists(_xff_entry, max_size=12),
    v4=st.integers(0, 32),
    v6=st.integers(0, 128),
)
def test_source_of_never_raises_and_parses_back(
    peer: str, xff: list[str], v4: int, v6: int
) -> None:
    """source_of never raises for any list of text, and its result always parses back."""
    result = SourceRules(PROXIES, ipv4_prefix=v4, ipv6_prefix=v6).source_of(peer, xff)
    network = parse_network(result)
    address = parse_address(result.partition("/")[0])
    assert address is not None
    assert network.value == address.value
    # A grouped network's own address can fall in a range that carries IPv4 (2001::/16
    # covers Teredo): re-reading it extracts the IPv4; every other result reads back as itself.
    if embedded_ipv4(address) is address:
        assert (
            SourceRules(PROXIES, ipv4_prefix=v4, ipv6_prefix=v6).source_of(
                result.partition("/")[0], []
            )
            == result
        )


_trusted_hop = st.sampled_from(
    [
        "10.0.0.2",
        "10.255.0.1",
        "10.0.0.3:8443",
        "::ffff:10.0.0.9",
        "2001:db8:aaaa::1",
        "[2001:db8:aaaa::2]:443",
    ]
)
_appended_hop = st.one_of(
    _trusted_hop,
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=4).map(lambda a: f"{a}:51234"),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]:443"),
    st.sampled_from(["unknown", "_hidden", "", "garbage", "1.2.3.4:"]),
)


@given(
    claim=st.lists(_xff_entry, max_size=8),
    chain=st.lists(_appended_hop, max_size=6),
    v6=st.sampled_from([48, 64, 128]),
)
def test_what_the_client_writes_left_of_the_trusted_chain_never_changes_the_source(
    claim: list[str], chain: list[str], v6: int
) -> None:
    """Issue 15 #5 (property): the hops the trusted proxies appended decide the source;
    any client-written prefix (an attacker's choice) gives the same source as none, unless
    every appended hop is a parseable trusted proxy (then the claim is read on, as before)."""
    rules = SourceRules(PROXIES, ipv6_prefix=v6)
    alone = rules.source_of("10.0.0.1", chain)
    parsed = [parse_hop(hop) for hop in chain]
    reaches_claim = all(
        (hop is not None and hop in PROXIES) or not text.strip()
        for hop, text in zip(parsed, chain, strict=True)
    )
    if not reaches_claim:
        assert rules.source_of("10.0.0.1", [*claim, *chain]) == alone
    # The source is always the peer or one of the parsed hops, never text from elsewhere.
    candidates = {"10.0.0.1"} | {
        format_source(embedded_ipv4(a), ipv6_prefix=v6) for a in parsed if a is not None
    }
    assert alone in candidates


@given(ip=st.ip_addresses(v=4), port=st.integers(0, 65535))
def test_ip_port_hops_read_as_their_address(ip: object, port: int) -> None:
    """a.b.c.d:port and [v6]:port hops parse to the address without the port."""
    assert parse_hop(f"{ip}:{port}") == parse_address(str(ip))
    assert parse_hop(f"[2001:db8::{port:x}]:{port}") == parse_address(f"2001:db8::{port:x}")


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("64:ff9b::203.0.113.5", "203.0.113.5"),  # NAT64 well-known prefix
        ("64:ff9b::c633:6407", "198.51.100.7"),
        ("::203.0.113.9", "203.0.113.9"),  # IPv4-compatible
        ("::ffff:0:203.0.113.10", "203.0.113.10"),  # IPv4-translated
        ("2002:cb00:7105::1", "203.0.113.5"),  # 6to4: one host, 65,536 /64s
        ("2002:cb00:7105:ffff::9", "203.0.113.5"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),  # Teredo (RFC 4380 example)
        ("::1", "::1"),  # loopback is not IPv4-compatible
        ("2001:db8::1", "2001:db8::/64"),
    ],
)
def test_addresses_that_carry_an_ipv4_address_are_that_ipv4_source(
    peer: str, expected: str
) -> None:
    """Issue 15 #6: NAT64, IPv4-compatible, IPv4-translated, 6to4 and Teredo addresses are
    counted as the IPv4 address they carry, not as a shared or a fresh /64."""
    assert source(peer, ipv6_prefix=128 if peer == "::1" else 64) == expected
    assert source("10.0.0.1", [peer], ipv6_prefix=128 if peer == "::1" else 64) == expected


def test_embedded_ipv4_leaves_other_addresses_and_ranges_alone() -> None:
    """Trusted-proxy ranges written in those prefixes keep their IPv6 meaning."""
    net = parse_network("64:ff9b::/96")
    assert (net.version, net.prefix) == (6, 96)
    address = parse_address("2001:db8::5")
    assert address is not None and embedded_ipv4(address) is address


# -- accounts ---------------------------------------------------------------------------


def test_account_casefold_and_trim() -> None:
    """Case and surrounding whitespace never make a different account."""
    assert normalise_account("  Alice@Example.COM \t") == "alice@example.com"


def test_account_full_width_letters_fold() -> None:
    """Full-width letters are the same account as their ASCII forms."""
    assert normalise_account("\uff41\uff4c\uff49\uff43\uff45") == "alice"
    assert normalise_account("\uff21\uff2c\uff29\uff23\uff25") == "alice"


def test_account_ligatures_fold() -> None:
    """Compatibility ligatures (ﬁ, ﬀ) fold onto their letters."""
    assert normalise_account("ﬁona") == "fiona"
    assert normalise_account("Eﬀie") == "effie"


def test_account_sharp_s_and_greek_sigma_casefold() -> None:
    """casefold, not lower: ß == ss and final sigma == sigma."""
    assert normalise_account("Straße") == normalise_account("STRASSE") == "strasse"
    assert normalise_account("ΟΔΟΣ") == normalise_account("οδος")


def test_account_ideographic_space_is_trimmed() -> None:
    """Unicode whitespace (ideographic space) around the account is trimmed."""
    assert normalise_account("\u3000bob\u3000") == "bob"


def test_account_case_sensitive_tenant_keeps_case() -> None:
    """A case-sensitive tenant keeps case but still applies NFKC and trimming."""
    assert normalise_account(" \uff22\uff4f\uff22 ", case_sensitive=True) == "BoB"


@pytest.mark.parametrize(
    "variant",
    [
        "al\u200bice",
        "\u00adalice",
        "ali\u200dce",
        "alice\ufeff",
        "a\u2060lice",
        "al\u034fice",
        "alic\ufe0fe",
        "\u202ealice",
        "al\U000e0041ice",
        "ALI\u200cCE",
    ],
)
def test_account_default_ignorable_code_points_are_dropped(variant: str) -> None:
    """Issue 15 #7: zero-width space/joiners, soft hyphen, BOM, word joiner, variation
    selectors, bidi controls and tags are invisible: the variant is the same account."""
    assert normalise_account(variant) == "alice"


def test_account_look_alike_letters_of_other_scripts_stay_distinct() -> None:
    """Cyrillic a is a different letter, not an ignorable one (the login service's matter)."""
    assert normalise_account("\u0430lice") != "alice"


def test_account_empty_after_normalisation_is_invalid() -> None:
    """An account of only whitespace raises InvalidAttempt('empty_account')."""
    with pytest.raises(InvalidAttempt) as info:
        normalise_account(" \u3000 ")
    assert info.value.reason == "empty_account"


# -- the Normaliser over wire events ----------------------------------------------------


def _event(**fields: object) -> LoginAttempt:
    base: dict[str, object] = {
        "event_id": "e1",
        "occurred_at": datetime(2026, 11, 29, 12, 0, 0, 123000, tzinfo=UTC),
        "service": "web",
        "account": "Alice",
        "peer_ip": "10.0.0.1",
        "forwarded_for": ("203.0.113.5",),
        "outcome": "failure",
        "failure_reason": "bad_password",
    }
    base.update(fields)
    return LoginAttempt(**base)  # type: ignore[arg-type]


NORMALISER = Normaliser(Digester("secret"), RULES, frozenset({"strict"}))


def test_normaliser_builds_the_core_attempt() -> None:
    """A wire event becomes digests, the derived source and epoch-ms time."""
    a = NORMALISER.normalise(_event(device_id="cookie-1", device_trusted=True))
    d = Digester("secret")
    assert a.account == d.account("default", "alice")
    assert a.source == "203.0.113.5"
    assert a.device == d.device("default", "cookie-1")
    assert a.trusted is True
    assert a.occurred_ms == 1_795_953_600_123
    assert (a.flow, a.success, a.failure_reason) == ("login", False, "bad_password")


def test_trusted_needs_a_device_id() -> None:
    """device_trusted without a device id is untrusted."""
    assert NORMALISER.normalise(_event(device_trusted=True)).trusted is False
    assert NORMALISER.normalise(_event(device_id="c", device_trusted=False)).trusted is False


def test_case_sensitive_tenant_digests_differ_by_case() -> None:
    """In a case-sensitive tenant, Alice and alice are different accounts."""
    assert NORMALISER.account_digest("strict", "Alice") != NORMALISER.account_digest(
        "strict", "alice"
    )
    assert NORMALISER.account_digest("default", "Alice") == NORMALISER.account_digest(
        "default", "alice"
    )


def test_confusable_forms_share_one_digest() -> None:
    """Full-width, ligature and case variants of one account give one digest."""
    forms = [
        "\ufb01ona@example.com",
        "FIONA@example.com",
        "\uff46\uff49\uff4f\uff4e\uff41@example.com",
        " fiona@EXAMPLE.com ",
    ]
    assert len({NORMALISER.account_digest("default", f) for f in forms}) == 1


def test_bad_peer_ip_from_wire_event() -> None:
    """A wire event with a bad peer_ip raises InvalidAttempt('bad_peer_ip')."""
    with pytest.raises(InvalidAttempt) as info:
        NORMALISER.normalise(_event(peer_ip="localhost"))
    assert info.value.reason == "bad_peer_ip"


@pytest.mark.parametrize("tenant", ["a|b", "-", "|", "a\\", "Acme", "a'"])
def test_tenant_outside_the_syntax_is_invalid(tenant: str) -> None:
    """Issue 15 #15: the wire model refuses a tenant outside [a-z0-9][a-z0-9._-]{0,63}, and
    the Normaliser, given one anyway (an unvalidated event), raises bad_tenant."""
    with pytest.raises(ValidationError, match="tenant must match"):
        _event(tenant=tenant)
    unvalidated = LoginAttempt.model_construct(**{**_event().__dict__, "tenant": tenant})
    with pytest.raises(InvalidAttempt) as info:
        NORMALISER.normalise(unvalidated)
    assert info.value.reason == "bad_tenant"


# -- caches of recent identifiers -----------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 50), st.text(max_size=3)), max_size=300))
def test_recent_holds_at_most_two_generations_and_returns_the_last_value(
    puts: list[tuple[int, str]],
) -> None:
    """Recent never holds more than 2 x entries, and a hit is the value last put for the key."""
    recent = Recent(entries=8)
    last: dict[int, str] = {}
    for key, value in puts:
        recent.put(key, value)
        last[key] = value
        assert len(recent.young) <= 8 and len(recent.old) <= 8
    for key, value in last.items():
        assert recent.get(key) in (value, None)


def test_cached_normalisation_equals_a_fresh_normaliser_over_repeats_and_evictions() -> None:
    """Caches change nothing: 3,000 attempts through a 16-entry cache match a fresh Normaliser each."""
    cached = Normaliser(Digester("secret"), RULES, frozenset({"strict"}))
    for cache in (cached.recent_accounts, cached.recent_sources, cached.recent_devices):
        cache.entries = 16
    for i in range(3000):
        event = _event(
            account=f"user{i % 40}",
            peer_ip=f"203.0.113.{i % 50}",
            device_id=f"c{i % 30}",
            tenant="strict" if i % 7 == 0 else "default",
        )
        fresh = Normaliser(Digester("secret"), RULES, frozenset({"strict"}))
        assert cached.normalise(event) == fresh.normalise(event)
    # 40 accounts, 50 sources and 30 devices cycle through 16-entry generations: bounded.
    assert (
        max(len(cached.recent_accounts), len(cached.recent_sources), len(cached.recent_devices))
        <= 32
    )


def test_a_bad_address_is_refused_every_time_and_never_cached() -> None:
    """An invalid peer_ip raises on each attempt; nothing is remembered for it."""
    normaliser = Normaliser(Digester("secret"), RULES)
    for _ in range(2):
        with pytest.raises(InvalidAttempt):
            normaliser.normalise(_event(peer_ip="not-an-ip"))
    assert len(normaliser.recent_sources) == 0
