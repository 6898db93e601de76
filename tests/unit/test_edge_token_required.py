"""The edge refuses to listen off loopback without a token (issue 26 item 10): exit 1 with
one line, before connecting anywhere; loopback stays open."""

from __future__ import annotations

import pytest

from pipeline import cli
from pipeline.edge import service
from pipeline.edge.service import EdgeTokenRequired, require_token
from pipeline.settings import Settings
from tests.unit.test_edge_support import DIGEST_KEY

SETTINGS = Settings(identity={"digest_key": DIGEST_KEY})


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.0.2.10", "edge.internal"])
def test_off_loopback_without_a_token_is_refused(host: str) -> None:
    """Every address that is not loopback needs edge.token."""
    with pytest.raises(
        EdgeTokenRequired, match=r"edge\.token is not set and the edge would listen"
    ):
        require_token(SETTINGS, host)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.9.9", "::1", "localhost"])
def test_loopback_needs_no_token(host: str) -> None:
    """A gateway on the same host may call the edge without a token."""
    require_token(SETTINGS, host)


def test_a_token_allows_any_address() -> None:
    """With edge.token set the edge may listen on 0.0.0.0."""
    require_token(
        Settings(identity={"digest_key": DIGEST_KEY}, edge={"token": "t" * 32}), "0.0.0.0"
    )


def test_the_command_exits_1_with_one_line_before_connecting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`edge serve --host 0.0.0.0` without AUTHPIPE_EDGE_TOKEN: exit 1, one line, and the
    decision feed is never built."""
    monkeypatch.setenv("AUTHPIPE_IDENTITY_DIGEST_KEY", DIGEST_KEY)
    monkeypatch.delenv("AUTHPIPE_EDGE_TOKEN", raising=False)

    def no_feed(_settings: Settings) -> None:
        raise AssertionError("the feed was built")

    monkeypatch.setattr(service.DecisionFeed, "from_settings", no_feed)
    assert cli.main(["edge", "serve", "--host", "0.0.0.0", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("authpipe: edge.token is not set and the edge would listen on 0.0.0.0")
