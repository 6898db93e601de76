"""Keys: keyed digests per tenant and kind, the decision key's wire form, stable ids."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.keys import Digester, decision_key, format_key, parse_key, stable_id

D = Digester("shared-secret")


def test_account_digest_is_keyed_blake2b_128_hex() -> None:
    """The account digest is BLAKE2b-128 keyed with the secret over namespace, tenant, id."""
    expected = hashlib.blake2b(
        b"acct\x00" + b"default" + b"\x00" + b"alice", digest_size=16, key=b"shared-secret"
    ).hexdigest()
    assert D.account("default", "alice") == expected
    assert len(expected) == 32


def test_digests_differ_across_tenants() -> None:
    """The same account in two tenants has two digests."""
    assert D.account("t1", "alice") != D.account("t2", "alice")


def test_digests_differ_across_kinds() -> None:
    """Account, device and session digests of one value never coincide."""
    values = {D.account("t", "x"), D.device("t", "x"), D.session("t", "x")}
    assert len(values) == 3


def test_digests_differ_across_secrets() -> None:
    """Another secret gives another digest (gateways need the same key)."""
    assert Digester("other").account("t", "alice") != D.account("t", "alice")


def test_long_secret_is_hashed_down() -> None:
    """A secret over 64 bytes is accepted (hashed to a BLAKE2b key)."""
    long = Digester("k" * 200)
    assert long.account("t", "a") == Digester(hashlib.blake2b(b"k" * 200).digest()).account(
        "t", "a"
    )


def test_lone_surrogates_never_raise() -> None:
    """A lone surrogate in tenant or value still gives a digest."""
    assert len(D.account("t\ud800", "a\udfff")) == 32


def test_format_key_and_parse_key_round_trip() -> None:
    """format_key writes scope|tenant|account|source|device with '-' for none."""
    key = decision_key("account_source", "default", "ab" * 16, "203.0.113.5", None)
    text = format_key(key)
    assert text == f"account_source|default|{'ab' * 16}|203.0.113.5|-"
    assert parse_key(text) == key


def test_format_key_ipv6_source() -> None:
    """An IPv6 /64 source (with colons and a slash) survives the round trip."""
    key = decision_key("source", "t", None, "2001:db8::/64", None)
    assert format_key(key) == "source|t|-|2001:db8::/64|-"
    assert parse_key(format_key(key)) == key


@pytest.mark.parametrize("bad", ["a|b|c", "a|b|c|d|e|f", "-|t|-|-|-", "s|-|-|-|-", ""])
def test_parse_key_rejects_malformed(bad: str) -> None:
    """Malformed keys raise ValueError."""
    with pytest.raises(ValueError, match="decision key"):
        parse_key(bad)


@given(
    scope=st.sampled_from(["account_source", "account", "device", "uia", "mfa", "source"]),
    tenant=st.text(min_size=1, max_size=64).filter(lambda t: "|" not in t and t != "-"),
    account=st.none() | st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
    source=st.none() | st.ip_addresses().map(str),
    device=st.none() | st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
)
def test_key_round_trip_property(
    scope: str, tenant: str, account: str | None, source: str | None, device: str | None
) -> None:
    """parse_key inverts format_key for every valid key."""
    key = decision_key(scope, tenant, account, source, device)
    assert parse_key(format_key(key)) == key


def test_stable_id_is_deterministic_and_part_sensitive() -> None:
    """stable_id depends only on its parts, and on their boundaries."""
    assert stable_id("a", 1, "b") == stable_id("a", 1, "b")
    assert stable_id("ab", "c") != stable_id("a", "bc")
    assert len(stable_id("x")) == 32
