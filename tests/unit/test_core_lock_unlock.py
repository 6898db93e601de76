"""An operator lifts a rule's lock, audited (issue 46, item 1): ``authpipe decisions unlock``
publishes a reset attempt the worker's own decode, normalisation and account stage apply;
and ``decisions list`` never prints the topic's control characters (item 10)."""

from __future__ import annotations

import pytest

from pipeline import cli
from pipeline.contracts.codec import decode_attempt, dumps, encode
from pipeline.contracts.models import AUDIT_COLUMNS, Decision, ms_to_datetime
from pipeline.core.attempt import Normaliser
from pipeline.core.decision_keys import keys_for
from pipeline.core.engine import Engine
from pipeline.core.keys import Digester
from pipeline.core.normalise import NetworkSet, SourceRules
from pipeline.core.policy import DEFAULT_POLICY
from pipeline.manual import attempts_topic, render, unlock_attempt
from pipeline.settings import Settings
from pipeline.stream.ingest import Record
from pipeline.stream.memory import MemoryPipeline
from tests.unit.test_core_support import HOUR, SEC, T0, att, policy
from tests.unit.test_edge_support import DIGEST_KEY

NOW_MS = 1_790_000_100_000
NORM = Normaliser(digester=Digester("k" * 32), sources=SourceRules(trusted_proxies=NetworkSet()))


def test_an_operators_unlock_lifts_the_lifetime_bound_through_the_worker_path() -> None:
    """An account under the lifetime bound (threshold 6): the unlock's bytes, decoded and
    normalised as ingest does, are a reset the account stage applies: the lock is
    tombstoned and the owner's next untrusted sign-in is allowed; the audit row's service
    names who and why."""
    digest = NORM.account_digest("acme", "Alice@Example.com")
    engine = Engine(policy(lifetime={"threshold": 6}))
    engine.step_batch([att(i * SEC, digest, tenant="acme") for i in range(5)])
    engine.step_batch([att(HOUR + 5 * SEC, digest, tenant="acme")])
    wire = unlock_attempt(
        "acme",
        "Alice@Example.com",
        operator="bob",
        reason="owner on the phone",
        now_ms=T0 + 2 * HOUR,
    )
    attempt = NORM.normalise(decode_attempt(encode(wire)))
    assert (attempt.account, attempt.flow, attempt.success) == (digest, "reset", True)
    mark = len(engine.out.decisions)
    engine.step_batch([attempt])
    lifted = [key for key, value in engine.out.decisions[mark:] if value is None]
    assert lifted == [f"lock|acme|{digest}|-|-"]
    later = att(2 * HOUR + SEC, digest, tenant="acme", success=True)
    assert engine.accounts.index.check(keys_for(later), later.occurred_ms).allowed
    assert wire.service == "authpipe-unlock by bob: owner on the phone"


def test_the_worker_twin_lifts_the_lock_and_audits_the_unlock() -> None:
    """Through the worker's own ingest and stages (``MemoryPipeline``): five wrong passwords
    lock the account; the unlock's bytes on the input topic tombstone the lock, and its
    audit row names the operator and the reason."""
    twin = MemoryPipeline(Settings(identity={"digest_key": DIGEST_KEY}), DEFAULT_POLICY)
    failures = [
        {
            "event_id": f"e{i}",
            "occurred_at": f"2026-09-21T14:13:{i:02d}Z",
            "service": "web",
            "account": "Alice@Example.com",
            "peer_ip": "203.0.113.9",
            "outcome": "failure",
            "failure_reason": "bad_password",
        }
        for i in range(5)
    ]
    records = [Record("auth.login-attempts", 0, i, None, dumps(e)) for i, e in enumerate(failures)]
    wire = unlock_attempt(
        "default", "Alice@Example.com", operator="bob", reason="ticket 7", now_ms=NOW_MS
    )
    records.append(Record("auth.login-attempts", 0, 5, b"Alice@Example.com", encode(wire)))
    twin.feed(records, NOW_MS)
    twin.finish()
    locks = [(key, value is None) for key, value in twin.out.decisions if key.startswith(b"lock|")]
    assert [lifted for _, lifted in locks] == [False, True]
    assert locks[0][0] == locks[1][0]
    service = AUDIT_COLUMNS.index("service")
    assert twin.out.audit_rows[-1][service] == "authpipe-unlock by bob: ticket 7"


def test_an_unlock_goes_to_the_tenants_own_topic_when_one_is_bound() -> None:
    """ingest.tenant_topics binds acme to its topic: the unlock is published there (on
    the shared input topic ingest would dead-letter it tenant_not_allowed)."""
    settings = Settings(ingest={"tenant_topics": {"acme.attempts": "acme"}})
    assert attempts_topic(settings, "acme") == "acme.attempts"
    assert attempts_topic(settings, "other") == "auth.login-attempts"


@pytest.mark.parametrize(
    "args",
    [
        ["decisions", "unlock", "--reason", "x"],  # no --account
        ["decisions", "unlock", "--account", "alice"],  # no --reason
        ["decisions", "unlock", "--account", "alice", "--reason", "x", "--tenant", "a|b"],
        ["decisions", "unlock", "--account", "alice", "--reason", "\x1b[2J"],
    ],
)
def test_bad_unlock_flags_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed unlock is an argparse error (exit 2) and nothing is published."""
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_list_strips_control_characters_from_the_topic() -> None:
    """A decision whose operator and reason carry terminal escapes (written to the topic
    by anything with write access) is listed without a single control character."""
    decision = Decision(
        decision_id="d" * 32,
        key="account|acme|" + "a" * 32 + "|-|manual",
        tenant="acme",
        scope="account",
        account_digest="a" * 32,
        source=None,
        device_id="manual",
        applies_to="all",
        action="block",
        rule="manual",
        count=0,
        threshold=0,
        window_ms=60_000,
        issued_at=ms_to_datetime(T0),
        expires_at=ms_to_datetime(T0 + 60_000),
        policy_version="manual",
        operator="eve\x1b]0;owned\x07",
        reason="\x1b[2J\x1b[31mred\u202eevil\r\n",
    )
    text = render([decision], manual_only=True)
    assert text.splitlines()[1].endswith("eve]0;owned: [2J[31mredevil")
    assert all(ch.isprintable() for line in text.splitlines() for ch in line)
