"""Block-list sources behind NAT64 beyond the well-known prefix (issue 46, item 10): RFC
8215's 64:ff9b:1::/48 and a deployment's ``ingest.nat64_prefixes`` are folded by
``authpipe decisions add --source`` (or refused) as ingest folds a peer, so an operator's
block on a translated client's range refuses that client's checks, and the readers of the
decisions topic refuse a source written in IPv6 that ingest counts as IPv4."""

from __future__ import annotations

import re

import orjson
import pytest

from pipeline import cli
from pipeline.contracts.codec import DecodeError, encode
from pipeline.core.grouping import check_block_source, within_grouping
from pipeline.core.normalise import parse_nat64_prefix
from pipeline.manual import Target, manual_decision
from pipeline.settings import Settings
from pipeline.sinks.rows import decision_message
from pipeline.wiring import build_normaliser, grouping_check
from tests.unit.test_edge_support import DIGEST_KEY, T0, message, new_view, source_key
from tests.unit.test_nat64_prefixes import RFC6052_EXAMPLES

NSP = "2001:db8:122::/48"
"""A deployment's network-specific prefix: 192.0.2.33 is 2001:db8:122:c000:2:2100::."""
TRANSLATED = "2001:db8:122:c000:2:2100::"
SETTINGS = Settings(
    identity={"digest_key": DIGEST_KEY}, ingest={"ipv4_prefix": 24, "nat64_prefixes": [NSP]}
)
PREFIXES = build_normaliser(SETTINGS).sources.nat64_prefixes
DEFAULTS = build_normaliser(Settings(identity={"digest_key": DIGEST_KEY}))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64:ff9b:1::1.2.3.4", "1.2.3.4"),
        ("64:ff9b:1:abcd:0:ef:198.51.100.7/128", "198.51.100.7"),
        ("64:ff9b:1:0:ff00::1", "64:ff9b:1::/64"),  # bits 64-71 set: no translated client
    ],
)
def test_a_local_use_address_is_stored_as_ingest_counts_it(text: str, expected: str) -> None:
    """An address in 64:ff9b:1::/48 is the source ingest gives a peer of it."""
    assert check_block_source(text) == expected
    assert DEFAULTS.sources.source_of(text.partition("/")[0], ()) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64:ff9b:1::1.2.3.0/120", "1.2.3.0/24"),
        ("64:ff9b:1:abcd::198.51.100.0/120", "198.51.100.0/24"),
        ("64:ff9b:1:0:ff00::/96", "64:ff9b:1::/64"),  # bits 64-71 set: no translated client
    ],
)
def test_a_local_use_range_folds_to_its_ipv4_network(text: str, expected: str) -> None:
    """With IPv4 grouped by /24, a range in 64:ff9b:1::/48 is the IPv4 network it carries."""
    assert check_block_source(text, ipv4_prefix=24) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("64:ff9b:1::/64", "spans many clients of the NAT64 range 64:ff9b:1::/48"),
        ("64:ff9b:1:0:0:ab::/96", "(the IPv4 range 0.0.0.0/0 as ingest counts it) is wider"),
        ("64:ff9b:1:0:ab::/80", "spans many clients of the NAT64 range 64:ff9b:1::/48"),
        ("64:ff9b::/32", "holds the NAT64 range 64:ff9b:1::/48"),
    ],
)
def test_a_local_use_range_it_cannot_fold_is_refused(text: str, says: str) -> None:
    """A range over many translated clients, or over the whole prefix, raises ValueError."""
    with pytest.raises(ValueError, match=re.escape(says)):
        check_block_source(text)


def test_the_cli_refuses_a_local_use_slash_64(capsys: pytest.CaptureFixture[str]) -> None:
    """decisions add --source 64:ff9b:1::/64 exits 2 naming --source and the NAT64 range
    (it was accepted, and never matched a check)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["decisions", "add", "--source", "64:ff9b:1::/64", "--ttl", "1h", "--reason", "x"])
    assert exited.value.code == 2
    assert (
        "--source 64:ff9b:1::/64 spans many clients of the NAT64 range 64:ff9b:1::/48, which "
        "authpipe counts by the IPv4 address each carries; block those IPv4 addresses instead"
    ) in capsys.readouterr().err


@pytest.mark.parametrize(("prefix", "peer"), RFC6052_EXAMPLES)
def test_a_configured_prefix_folds_each_rfc6052_layout(prefix: str, peer: str) -> None:
    """Under each RFC 6052 prefix length, configured, the example address is 192.0.2.33,
    the source ingest gives it; the prefix not configured, it stays IPv6."""
    configured = (parse_nat64_prefix(prefix),)
    assert check_block_source(peer, nat64_prefixes=configured) == "192.0.2.33"
    assert ":" in check_block_source(peer)


@pytest.mark.parametrize(
    ("prefix", "text", "expected"),
    [
        (NSP, "2001:db8:122:c000:2::/80", "192.0.2.0/24"),  # IPv4 bits 48-63 and 72-79
        (NSP, "2001:db8:122:c000:2:2100::/88", "192.0.2.0/24"),  # the whole address, /24
        ("2001:db8::/32", "2001:db8:c000:221::/64", "192.0.2.0/24"),  # the address in 32-63
        ("2001:db8:122:344::/64", "2001:db8:122:344:c0:2::/96", "192.0.2.0/24"),
        ("2001:db8:122:344::/96", "2001:db8:122:344::c000:200/120", "192.0.2.0/24"),
    ],
)
def test_a_configured_prefix_range_folds_to_its_ipv4_network(
    prefix: str, text: str, expected: str
) -> None:
    """A range inside a configured prefix is the IPv4 network of the bits it fixes."""
    configured = (parse_nat64_prefix(prefix),)
    assert check_block_source(text, 24, 64, configured) == expected


@pytest.mark.parametrize(
    ("prefix", "text", "says"),
    [
        (NSP, "2001:db8:122:c000::/64", "(the IPv4 range 192.0.0.0/16 as ingest counts it) is"),
        (NSP, "2001:db8:122::/48", "(the IPv4 range 0.0.0.0/0 as ingest counts it) is wider"),
        (
            "2001:db8:64::/96",
            "2001:db8:64::/64",
            "holds the NAT64 prefix 2001:db8:64::/96 (ingest.nat64_prefixes)",
        ),
        (
            "2001:db8:122:344::/64",
            "2001:db8:122:344::/68",
            "spans many clients of the NAT64 prefix 2001:db8:122:344::/64 (ingest.nat64_prefixes)",
        ),
    ],
)
def test_a_configured_prefix_range_it_cannot_fold_is_refused(
    prefix: str, text: str, says: str
) -> None:
    """A range over many clients of a configured prefix, or over the prefix, is refused."""
    with pytest.raises(ValueError, match=re.escape(says)):
        check_block_source(text, 24, 128, (parse_nat64_prefix(prefix),))


def test_an_operators_block_on_a_translated_range_refuses_its_clients() -> None:
    """An operator's block on 2001:db8:122:c000:2::/80 (192.0.2.0/24 translated through the
    configured prefix) is stored as 192.0.2.0/24 and refuses the translated client and
    192.0.2.200, not 198.51.100.7 behind the same prefix; folded without the prefix it
    would have been a /64 no check ever has."""
    normaliser = build_normaliser(SETTINGS)
    source = check_block_source("2001:db8:122:c000:2::/80", 24, 64, PREFIXES)
    assert check_block_source("2001:db8:122:c000:2::/80", 24, 64) == "2001:db8:122:c000::/64"
    block = manual_decision(
        Target("default", source=source),
        normaliser,
        ttl_ms=3_600_000,
        reason="x",
        operator="op",
        now_ms=T0,
    )
    assert (block.source, block.key) == ("192.0.2.0/24", "source|default|-|192.0.2.0/24|manual")
    view = new_view(settings=SETTINGS)
    assert view.apply(block.key.encode(), encode(block)) == "put"
    peers = [TRANSLATED, "192.0.2.200", "2001:db8:122:c633:64:700::"]
    assert [normaliser.sources.source_of(peer, ()) for peer in peers] == [
        "192.0.2.0/24",
        "192.0.2.0/24",
        "198.51.100.0/24",
    ]
    assert [view.check("default", "a", peer).allowed for peer in peers] == [False, False, True]


@pytest.mark.parametrize(
    ("source", "ok"),
    [
        (TRANSLATED, False),  # ingest counts it as 192.0.2.33
        ("2001:db8:122:c000:2::/80", False),
        ("64:ff9b:1::1.2.3.0/120", False),
        ("64:ff9b:1::/64", True),  # the source of its addresses whose bits 64-71 are set
        ("2001:db8:122:c000::/64", True),
        ("192.0.2.0/24", True),
    ],
)
def test_readers_refuse_a_source_written_in_ipv6_that_ingest_counts_as_ipv4(
    source: str, ok: bool
) -> None:
    """Under the configured prefix, within_grouping, the readers' grouping_check and the
    edge's view agree whether a decision's source is one ingest gives."""
    assert within_grouping(source, 24, 64, PREFIXES) is ok
    assert grouping_check(SETTINGS)(source) is ok
    _, value = message(source_key("198.51.100.0/24"), T0 + 60_000)
    body = orjson.loads(value)
    wire = body["key"].replace("198.51.100.0/24", source)
    body.update(key=wire, source=source)
    view = new_view(settings=SETTINGS)
    assert view.apply(wire.encode(), orjson.dumps(body)) == ("put" if ok else "bad")
    assert view.stats.bad_reasons == ({} if ok else {"bad_source": 1})


def test_decisions_add_folds_a_translated_range_through_the_configured_prefix() -> None:
    """manual_decision given the raw range (as `authpipe decisions add --source` passes it)
    folds it with the deployment's NAT64 prefixes: 192.0.2.0/24, the source its clients'
    attempts count under, not a /64 no check has."""
    block = manual_decision(
        Target("default", source="2001:db8:122:c000:2::/80"),
        build_normaliser(SETTINGS),
        ttl_ms=3_600_000,
        reason="x",
        operator="op",
        now_ms=T0,
    )
    assert (block.source, block.key) == ("192.0.2.0/24", "source|default|-|192.0.2.0/24|manual")


def test_the_audit_sink_refuses_a_source_written_in_ipv6_inside_a_configured_prefix() -> None:
    """The sink decodes decisions with the deployment's grouping check (NAT64 prefixes
    included): a source decision on a translated client's address is bad (invalid_field)
    under SETTINGS (ingest counts it as 192.0.2.33), and a row under the defaults, which
    know no such prefix."""
    key, value = message(source_key(TRANSLATED), T0 + 60_000)
    with pytest.raises(DecodeError) as caught:
        decision_message("auth.throttle-decisions", 0, 1, T0, key, value, grouping_check(SETTINGS))
    assert caught.value.reason == "invalid_field"
    assert len(decision_message("auth.throttle-decisions", 0, 1, T0, key, value).rows) == 1
