"""Block-list sources that carry an IPv4 address (issue 26 item 7): ``authpipe decisions
add --source`` folds them as ingest folds a peer (or refuses a range it cannot fold), and
every reader of the decisions topic refuses a source in a form ingest never gives."""

from __future__ import annotations

import re

import orjson
import pytest

from pipeline import cli
from pipeline.contracts.codec import DecodeError, encode
from pipeline.core.grouping import check_block_source, within_grouping
from pipeline.edge.blocklist import valid_source
from pipeline.sinks.rows import decision_message
from tests.unit.test_edge_support import T0, message, new_view, normaliser, source_key
from tests.unit.test_manual_remove import operator_block

PEERS = [
    "64:ff9b::1.2.3.4",  # NAT64
    "64:ff9b::102:304",
    "::ffff:1.2.3.4",  # IPv4-mapped
    "::ffff:0:1.2.3.4",  # IPv4-translated
    "::1.2.3.4",  # IPv4-compatible
    "2002:102:304::5",  # 6to4
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo (client 192.0.2.45)
    "2001:db8::7",  # plain IPv6: its /64
    "::1",
    "1.2.3.4",
]


@pytest.mark.parametrize("peer", PEERS)
def test_a_source_is_stored_as_ingest_counts_a_peer_of_it(peer: str) -> None:
    """check_block_source(address) is the source ingest gives an attempt from that peer."""
    assert check_block_source(peer) == normaliser().sources.source_of(peer, ())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64:ff9b::1.2.3.0/120", "1.2.3.0/24"),
        ("2002:102:304::/48", "1.2.3.4"),
        ("2002:102:304:5::/64", "1.2.3.4"),
        ("::ffff:0:1.2.3.4/128", "1.2.3.4"),
    ],
)
def test_an_embedded_range_folds_to_its_ipv4_network(text: str, expected: str) -> None:
    """With IPv4 grouped by /24, an IPv6 range inside an embedded range is its IPv4 network."""
    assert check_block_source(text, ipv4_prefix=24 if "/120" in text else 32) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("64:ff9b::/64", "holds the NAT64 range 64:ff9b::/96"),
        ("::/64", "holds the IPv4-translated range ::ffff:0:0:0/96"),
        ("2001:0:4136:e378::/64", "spans many clients of the Teredo range 2001::/32"),
        ("64:ff9b::1.2.3.0/120", "is wider than one source: IPv4 sources are grouped by /32"),
    ],
)
def test_a_range_it_cannot_fold_is_refused(text: str, says: str) -> None:
    """Ranges over whole embedded ranges, over many Teredo clients, or wider than the IPv4
    grouping once folded raise ValueError saying so."""
    with pytest.raises(ValueError, match=re.escape(says)):
        check_block_source(text)


def test_the_cli_refuses_a_nat64_slash_64(capsys: pytest.CaptureFixture[str]) -> None:
    """decisions add --source 64:ff9b::/64 exits 2 naming --source and NAT64."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["decisions", "add", "--source", "64:ff9b::/64", "--ttl", "1h", "--reason", "x"])
    assert exited.value.code == 2
    assert "--source 64:ff9b::/64 holds the NAT64 range" in capsys.readouterr().err


def test_a_nat64_block_refuses_the_translated_client_at_the_edge() -> None:
    """The operator's block on 64:ff9b::1.2.3.4 is stored as 1.2.3.4 and refuses a check
    from that NAT64 peer and from 1.2.3.4, not from 1.2.3.5."""
    block = operator_block("64:ff9b::1.2.3.4")
    assert (block.source, block.key) == ("1.2.3.4", "source|default|-|1.2.3.4|manual")
    view = new_view()
    assert view.apply(block.key.encode(), encode(block)) == "put"
    allowed = [view.check("default", "a", ip).allowed for ip in [*PEERS[:2], "1.2.3.4", "1.2.3.5"]]
    assert allowed == [False, False, False, True]


@pytest.mark.parametrize("source", ["64:ff9b::102:304", "::ffff:1.2.3.4", "2002:102:304::/48"])
def test_readers_refuse_a_source_written_in_ipv6_that_carries_ipv4(source: str) -> None:
    """Ingest never gives such a source: within_grouping and the edge's valid_source say
    no, the edge counts the decision bad_source, the sink invalid_field."""
    assert (within_grouping(source), valid_source(source)) == (False, False)
    _, value = message(source_key("198.51.100.9"), T0 + 60_000)
    body = orjson.loads(value)
    wire = body["key"].replace("198.51.100.9", source)
    body.update(key=wire, source=source)
    view = new_view()
    assert view.apply(wire.encode(), orjson.dumps(body)) == "bad"
    assert view.stats.bad_reasons == {"bad_source": 1}
    with pytest.raises(DecodeError) as caught:
        decision_message("auth.throttle-decisions", 0, 1, T0, wire.encode(), orjson.dumps(body))
    assert caught.value.reason == "invalid_field"


@pytest.mark.parametrize("source", ["64:ff9b::/64", "2001:db8::/64", "::1", "1.2.3.4"])
def test_readers_accept_the_sources_ingest_gives(source: str) -> None:
    """A /64 that holds the NAT64 range is still the source of its other addresses."""
    assert within_grouping(source) is True
