"""The worker's normalisation fingerprint (issue 26 item 2): the worker publishes it, the
edge refuses readiness and ``decisions add`` refuses to publish when their normalisation
differs, each with one line saying what differs; the digest key itself is never in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from pipeline import cli, fingerprint, manual
from pipeline.edge import feed as feed_module
from pipeline.edge.feed import DecisionFeed
from pipeline.edge.handlers import create_app
from pipeline.settings import Settings
from pipeline.stream import worker as worker_module
from tests.unit.test_edge_support import DIGEST_KEY

SETTINGS = Settings(identity={"digest_key": DIGEST_KEY})
OTHER_KEY = "another-digest-key-0123456789abcdefgh"


def _parts(**kw: Any) -> dict[str, str]:
    return fingerprint.fingerprint(Settings(identity={"digest_key": DIGEST_KEY}, **kw))


def test_the_fingerprint_names_each_part_and_never_the_key() -> None:
    """Eight parts; the key is present only as a keyed digest of a fixed probe."""
    parts = _parts(ingest={"trusted_proxies": ["10.1.2.3/8", "2001:db8::/32"]})
    assert sorted(parts) == [
        "case_sensitive_tenants",
        "digest_key",
        "ipv4_prefix",
        "ipv6_prefix",
        "nat64_prefixes",
        "normalisation",
        "trusted_proxies",
        "verify",
    ]
    assert DIGEST_KEY not in orjson.dumps(parts).decode()
    assert len(parts["digest_key"]) == 32
    assert parts["trusted_proxies"] == "10.0.0.0/8,2001:db8::/32"
    assert (
        fingerprint.mismatch(
            parts, _parts(ingest={"trusted_proxies": ["10.0.0.0/8", "2001:db8::/32"]}), "edge"
        )
        is None
    )


def test_one_line_says_what_differs(tmp_path: Path) -> None:
    """A policy making acme case-sensitive, another key, another /64 and proxies: each named."""
    policy = tmp_path / "policy.toml"
    policy.write_text("[tenants.acme]\ncase_sensitive = true\n")
    worker = fingerprint.fingerprint(
        Settings(
            identity={"digest_key": OTHER_KEY},
            policy_path=policy,
            ingest={"ipv6_prefix": 56, "trusted_proxies": ["10.0.0.0/8"]},
        )
    )
    line = fingerprint.mismatch(worker, _parts(), "edge")
    assert line == (
        "the worker's normalisation differs from this edge's: case-sensitive tenants "
        "(ingest.case_sensitive_tenants and the policy): only the worker has acme, only here "
        "none; identity.digest_key differs; ingest.ipv6_prefix: the worker has 56, here 64; "
        "ingest.trusted_proxies: only the worker has 10.0.0.0/8, only here none; start both "
        "with the same identity.digest_key, [ingest] settings and policy"
    )


def test_nat64_prefixes_are_part_of_the_fingerprint() -> None:
    """Settings differing only in ingest.nat64_prefixes differ, in one line naming the
    setting and each side's prefixes (canonical, in the order configured)."""
    worker = _parts(ingest={"nat64_prefixes": ["2001:DB8:122::/48", "2001:db8:64::/96"]})
    assert (worker["nat64_prefixes"], worker["normalisation"]) == (
        "2001:db8:122::/48,2001:db8:64::/96",
        "2",
    )
    assert worker != _parts()
    assert fingerprint.mismatch(worker, _parts(), "edge") == (
        "the worker's normalisation differs from this edge's: ingest.nat64_prefixes: only the "
        "worker has 2001:db8:122::/48, 2001:db8:64::/96, only here none; start both with the "
        "same identity.digest_key, [ingest] settings and policy"
    )
    swapped = _parts(ingest={"nat64_prefixes": ["2001:db8:64::/96", "2001:db8:122::/48"]})
    assert fingerprint.mismatch(worker, swapped, "command") == (
        "the worker's normalisation differs from this command's: ingest.nat64_prefixes (the "
        "first that holds an address folds it): the worker has "
        "2001:db8:122::/48,2001:db8:64::/96, here 2001:db8:64::/96,2001:db8:122::/48; start "
        "both with the same identity.digest_key, [ingest] settings and policy"
    )


def test_an_older_worker_is_named_by_its_normalisation_version() -> None:
    """A worker from before NAT64 prefixes (normalisation 1, no nat64_prefixes part) differs
    only in the code's version, and the line says to run one authpipe version."""
    old = {k: v for k, v in _parts().items() if k != "nat64_prefixes"} | {"normalisation": "1"}
    assert fingerprint.mismatch(old, _parts(), "edge") == (
        "the worker's normalisation differs from this edge's: the normalisation code "
        "(authpipe version): the worker has 1, here 2; run the same authpipe version on both "
        "(upgrade the older one)"
    )


def test_the_latest_record_for_the_decisions_topic_counts() -> None:
    """Of the records on the fingerprint topic, the last one keyed by our decisions topic;
    a record that is not a fingerprint is none."""
    old, new = _parts(), _parts(ingest={"ipv4_prefix": 24})
    records: list[tuple[bytes | None, bytes | None]] = [
        (b"auth.throttle-decisions", fingerprint.encode_fingerprint("d", old)),
        (
            b"other-decisions",
            fingerprint.encode_fingerprint("o", _parts(ingest={"ipv6_prefix": 48})),
        ),
        (b"auth.throttle-decisions", fingerprint.encode_fingerprint("d", new)),
    ]
    assert fingerprint.latest(records, "auth.throttle-decisions") == new
    assert (
        fingerprint.latest([(b"auth.throttle-decisions", b"[1]")], "auth.throttle-decisions")
        is None
    )
    assert fingerprint.fingerprint_topic("auth.throttle-decisions") == (
        "auth.throttle-decisions.normalisation"
    )


async def test_the_edge_is_not_ready_while_the_worker_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caught-up feed whose worker published another key answers /readyz 503 with the
    line; once the worker's fingerprint matches it is ready; an unreadable one changes
    nothing."""
    worker: list[dict[str, str] | None] = [_parts()]

    async def read(*_args: object) -> dict[str, str] | None:
        return worker[0]

    monkeypatch.setattr(feed_module, "read_fingerprint", read)
    feed = DecisionFeed.from_settings(SETTINGS)
    feed._ready.set()  # caught up with the decisions topic
    assert (feed.ready(), feed.not_ready_reason()) == (
        False,
        "reading the worker's normalisation fingerprint beside 'auth.throttle-decisions'",
    )
    worker[0] = fingerprint.fingerprint(Settings(identity={"digest_key": OTHER_KEY}))
    await feed.check_fingerprint()
    line = (
        "the worker's normalisation differs from this edge's: identity.digest_key differs; "
        "start both with the same identity.digest_key, [ingest] settings and policy"
    )
    assert (feed.ready(), feed.not_ready_reason()) == (False, line)
    async with TestClient(TestServer(create_app(feed.view, feed))) as client:
        response = await client.get("/readyz")
        assert (response.status, (await response.json())["reason"]) == (503, line)
    worker[0] = None
    await feed.check_fingerprint()
    assert feed.ready() is False
    worker[0] = _parts()
    await feed.check_fingerprint()
    assert (feed.ready(), feed.not_ready_reason()) == (True, None)


@pytest.mark.parametrize("same", [True, False])
def test_decisions_add_refuses_when_the_worker_differs(
    same: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """decisions add --account under another digest key than the worker's: exit 1, one
    line, nothing published; under the same key it publishes."""
    monkeypatch.setenv("AUTHPIPE_IDENTITY_DIGEST_KEY", DIGEST_KEY)
    worker = (
        _parts() if same else fingerprint.fingerprint(Settings(identity={"digest_key": OTHER_KEY}))
    )
    published: list[str] = []

    async def read(*_args: object) -> dict[str, str] | None:
        return worker

    async def publish(_settings: object, key: str, value: bytes | None) -> None:
        published.append(key)

    monkeypatch.setattr(fingerprint, "read_fingerprint", read)
    monkeypatch.setattr(manual, "_publish", publish)
    code = cli.main(["decisions", "add", "--account", "alice", "--ttl", "1h", "--reason", "x"])
    err = capsys.readouterr().err
    if same:
        assert (code, len(published)) == (0, 1)
        return
    assert (code, published, err.count("\n")) == (1, [], 1)
    assert err.startswith(
        "authpipe decisions add: the worker's normalisation differs from this command's: "
        "identity.digest_key differs;"
    )
    assert err.rstrip().endswith("; nothing was published")


def test_the_worker_publishes_its_fingerprint_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`authpipe worker --policy P` publishes the fingerprint of its settings and that
    policy, then runs; a broker refusing it (FingerprintError) does not stop the worker."""
    policy = tmp_path / "policy.toml"
    policy.write_text("[tenants.acme]\ncase_sensitive = true\n")
    monkeypatch.setenv("AUTHPIPE_IDENTITY_DIGEST_KEY", DIGEST_KEY)
    sent: list[dict[str, str]] = []
    ran: list[Path | None] = []

    async def publish(settings: Settings, policy: Any = None) -> None:
        sent.append(fingerprint.fingerprint(settings, policy))
        if len(sent) > 1:
            raise fingerprint.FingerprintError("TopicAuthorizationFailedError")

    def run(settings: Settings) -> int:
        ran.append(settings.policy_path)
        return 0

    monkeypatch.setattr(fingerprint, "publish_fingerprint", publish)
    monkeypatch.setattr(worker_module, "run_worker", run)
    assert cli.main(["worker", "--policy", str(policy)]) == 0
    assert cli.main(["worker", "--policy", str(policy)]) == 0
    assert [parts["case_sensitive_tenants"] for parts in sent] == ["acme", "acme"]
    assert ran == [policy, policy]


def test_the_policys_verify_modes_are_part_of_the_fingerprint(tmp_path: Path) -> None:
    """The edge answers [verify] from its own copy of the policy: a worker verifying
    unfamiliar sign-ins only for acme and an edge that verifies them for every tenant are
    told apart in one line; a tenant at the defaults' mode is not listed, and an older
    worker (no part) counts as verifying nothing."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[defaults.verify]\nmode = "off"\n[tenants.acme.verify]\nmode = "enforce"\n')
    worker = fingerprint.fingerprint(
        Settings(identity={"digest_key": DIGEST_KEY}, policy_path=policy)
    )
    assert (worker["verify"], _parts()["verify"]) == ("*=off,acme=enforce", "*=enforce")
    assert fingerprint.mismatch(worker, _parts(), "edge") == (
        "the worker's normalisation differs from this edge's: the policy's [verify] mode per "
        "tenant (* = [defaults]): only the worker has *=off, acme=enforce, only here *=enforce; "
        "start both with the same identity.digest_key, [ingest] settings and policy"
    )
    older = {k: v for k, v in worker.items() if k != "verify"}
    assert fingerprint.mismatch(older, worker, "edge") is not None
    off = tmp_path / "off.toml"
    off.write_text('[defaults.verify]\nmode = "off"\n')
    here = fingerprint.fingerprint(Settings(identity={"digest_key": DIGEST_KEY}, policy_path=off))
    assert fingerprint.mismatch(older, here, "edge") is None
