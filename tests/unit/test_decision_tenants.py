"""One tenant validator on every path a decision's tenant takes (issue 26 item 6): the
operator's ``--tenant``, the edge's decisions decoder and the sink's decoder refuse a
tenant that ``contracts.models.valid_tenant`` refuses, with a clear error, never a crash
and never applied."""

from __future__ import annotations

import orjson
import pytest

from pipeline import cli
from pipeline.contracts.codec import DecodeError
from pipeline.manual import Target, manual_decision
from pipeline.sinks.rows import decision_message
from tests.unit.test_edge_support import T0, account_key, message, new_view, normaliser

ADD = ["decisions", "add", "--source", "1.2.3.4", "--ttl", "1h", "--reason", "x"]
BAD_TENANTS = ["Acme", "a\x1b[2Jb", "acme corp", "-", "caf\u00e9"]


def _with_tenant(tenant: str) -> tuple[bytes, bytes]:
    """A worker's decision whose key and value both name ``tenant``."""
    _, value = message(account_key(), T0 + 60_000)
    body = orjson.loads(value)
    wire = body["key"].replace("|default|", f"|{tenant}|", 1)
    body.update(key=wire, tenant=tenant)
    return wire.encode(), orjson.dumps(body)


@pytest.mark.parametrize("tenant", BAD_TENANTS)
def test_decisions_add_refuses_a_tenant_ingest_would_refuse(
    tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--tenant Acme (and control characters) exit 2 with the tenant rule, nothing sent."""
    with pytest.raises(SystemExit) as exited:
        cli.main([*ADD, "--tenant", tenant])
    assert exited.value.code == 2
    assert "tenant must match [a-z0-9][a-z0-9._-]{0,63}" in capsys.readouterr().err


def test_manual_decision_refuses_a_bad_tenant() -> None:
    """The library call behind the CLI validates the tenant too (ValueError, one rule)."""
    with pytest.raises(ValueError, match=r"'Acme': tenant must match"):
        manual_decision(
            Target("Acme", source="1.2.3.4"),
            normaliser(),
            ttl_ms=60_000,
            reason="x",
            operator="op",
            now_ms=T0,
        )


@pytest.mark.parametrize("tenant", BAD_TENANTS)
def test_the_edge_counts_a_bad_tenant_key_and_applies_nothing(tenant: str) -> None:
    """A decision keyed by a bad tenant is outcome 'bad' (reason bad_key): not indexed, its
    tenant not learned for the block-list's tenant= check."""
    view = new_view()
    assert view.apply(*_with_tenant(tenant)) == "bad"
    assert view.stats.bad_reasons == {"bad_key": 1}
    assert (len(view), tenant in view.tenants) == (0, False)


@pytest.mark.parametrize("tenant", BAD_TENANTS)
def test_the_sink_refuses_a_bad_tenant_key(tenant: str) -> None:
    """The sink's decoder raises bad_key for a value or a tombstone under such a key."""
    key, value = _with_tenant(tenant)
    for body in (value, None):
        with pytest.raises(DecodeError) as caught:
            decision_message("auth.throttle-decisions", 0, 1, T0, key, body)
        assert (caught.value.reason, caught.value.detail[:13]) == ("bad_key", "decision key ")


def test_the_sink_pairs_a_value_with_its_kafka_key_and_tenant() -> None:
    """A value under another message's key is key_mismatch; a value whose tenant differs
    from its (valid) key's is tenant_mismatch."""
    key, value = message(account_key(), T0 + 60_000)
    other, _ = message(account_key(tenant="globex"), T0 + 60_000)
    with pytest.raises(DecodeError) as caught:
        decision_message("auth.throttle-decisions", 0, 1, T0, other, value)
    assert caught.value.reason == "key_mismatch"
    body = orjson.loads(value)
    body["tenant"] = "globex"
    with pytest.raises(DecodeError) as caught:
        decision_message("auth.throttle-decisions", 0, 1, T0, key, orjson.dumps(body))
    assert caught.value.reason == "tenant_mismatch"
    assert decision_message("auth.throttle-decisions", 0, 1, T0, key, value).rows[0][2] == "default"
