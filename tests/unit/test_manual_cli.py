"""``authpipe decisions`` on the command line (issue 14): flags, the decision it builds,
exit codes (2 for bad flags, 1 with one line for a broker that cannot be reached)."""

from __future__ import annotations

import pytest

from pipeline import cli
from pipeline.contracts.codec import encode
from pipeline.core.attempt import Normaliser
from pipeline.core.keys import Digester
from pipeline.core.normalise import NetworkSet, SourceRules
from pipeline.manual import Target, active_decisions, manual_decision, parse_ttl

NOW_MS = 1_790_000_000_000


def _normaliser() -> Normaliser:
    return Normaliser(
        digester=Digester("k" * 32), sources=SourceRules(trusted_proxies=NetworkSet())
    )


@pytest.mark.parametrize(
    ("text", "ms"), [("90s", 90_000), ("30m", 1_800_000), ("1h", 3_600_000), ("7d", 604_800_000)]
)
def test_ttl_units(text: str, ms: int) -> None:
    """Seconds, minutes, hours and days."""
    assert parse_ttl(text) == ms


@pytest.mark.parametrize(
    "args",
    [
        ["decisions", "add", "--ttl", "1h", "--reason", "x"],  # neither --source nor --account
        [
            "decisions",
            "add",
            "--source",
            "1.2.3.4",
            "--account",
            "a",
            "--ttl",
            "1h",
            "--reason",
            "x",
        ],
        ["decisions", "add", "--source", "1.2.3.4", "--ttl", "1y", "--reason", "x"],
        ["decisions", "add", "--source", "1.2.3.4", "--ttl", "0s", "--reason", "x"],
        ["decisions", "add", "--source", "1.2.3.4", "--ttl", "400d", "--reason", "x"],
        ["decisions", "add", "--source", "1.2.3.4", "--ttl", "1h"],  # no --reason
        ["decisions", "add", "--source", "1.2.3.4", "--ttl", "1h", "--reason", " "],
        [
            "decisions",
            "add",
            "--source",
            "1.2.3.4",
            "--ttl",
            "1h",
            "--reason",
            "x",
            "--tenant",
            "a|b",
        ],
        ["decisions", "remove"],
        ["decisions"],
    ],
)
def test_bad_flags_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Every malformed invocation is an argparse error (exit 2) with a message."""
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("source", ["0.0.0.0/0", "10.0.0.0/8", "2001:db8::/48", "example.com"])
def test_a_source_wider_than_one_source_exits_2(
    source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Prefixes shorter than the grouping (or not addresses) are refused before anything is sent."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["decisions", "add", "--source", source, "--ttl", "1h", "--reason", "x"])
    assert exited.value.code == 2
    assert "--source" in capsys.readouterr().err


def test_an_unreachable_broker_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """list against a closed port: exit 1, one line naming the topic and the broker."""
    monkeypatch.setenv("AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    assert cli.main(["decisions", "list"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith(
        "authpipe decisions list: could not read auth.throttle-decisions at 127.0.0.1:1"
    )


def test_manual_decisions_are_digested_grouped_and_recorded() -> None:
    """An account is published as its ingest digest only; an IPv6 address as its /64; the
    decision records rule manual, who and why, and is active until its ttl."""
    norm = _normaliser()
    account = manual_decision(
        Target("acme", account="  Alice@Example.COM "),
        norm,
        ttl_ms=60_000,
        reason="compromised",
        operator="bob",
        now_ms=NOW_MS,
    )
    assert account.account_digest == norm.account_digest("acme", "alice@example.com")
    assert account.key == f"account|acme|{account.account_digest}|-|manual"
    assert b"alice" not in encode(account).lower()
    assert (account.rule, account.action, account.applies_to, account.operator, account.reason) == (
        "manual",
        "block",
        "all",
        "bob",
        "compromised",
    )
    source = manual_decision(
        Target("acme", source="2001:db8:1:2::99"),
        norm,
        ttl_ms=60_000,
        reason="r",
        operator="bob",
        now_ms=NOW_MS,
    )
    assert (source.source, source.key) == (
        "2001:db8:1:2::/64",
        "source|acme|-|2001:db8:1:2::/64|manual",
    )
    records = [
        (account.key.encode(), encode(account)),
        (source.key.encode(), encode(source)),
        (source.key.encode(), None),
        (b"x", b"not json"),
    ]
    assert active_decisions(records, NOW_MS) == [account]
    assert active_decisions(records, NOW_MS + 60_000) == []
