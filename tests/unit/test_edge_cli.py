"""``authpipe edge serve`` on the command line (issue 6): flags, defaults, exit codes."""

from __future__ import annotations

import asyncio
import socket

import pytest

from pipeline import cli
from pipeline.edge import service
from pipeline.settings import Settings


@pytest.mark.parametrize("port", ["x", "-1", "65536", "²", "1" * 3000])
def test_bad_port_is_an_argparse_error(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A port that is not 0-65535 exits 2 with argparse's message naming --port."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["edge", "serve", "--port", port])
    assert exited.value.code == 2
    assert "argument --port" in capsys.readouterr().err


def test_edge_needs_the_serve_action(capsys: pytest.CaptureFixture[str]) -> None:
    """`authpipe edge` alone is an argparse error."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["edge"])
    assert exited.value.code == 2


def test_flags_reach_run_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    """--host and --port go to run_edge; without them it gets None (settings decide)."""
    calls: list[tuple[str | None, int | None]] = []

    def fake_run(settings: Settings, host: str | None = None, port: int | None = None) -> int:
        calls.append((host, port))
        return 0

    monkeypatch.setattr(service, "run_edge", fake_run)
    assert cli.main(["edge", "serve", "--host", "::1", "--port", "0"]) == 0
    assert cli.main(["edge", "serve"]) == 0
    assert calls == [("::1", 0), (None, None)]


def test_edge_error_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An AuthpipeError from the service (a port in use) exits 1 with its message."""

    def busy(settings: Settings, host: str | None = None, port: int | None = None) -> int:
        raise service.EdgeBindError("cannot listen on 127.0.0.1:8080 (in use); pick another --port")

    monkeypatch.setattr(service, "run_edge", busy)
    assert cli.main(["edge", "serve"]) == 1
    assert "pick another --port" in capsys.readouterr().err


async def test_port_in_use_is_an_edge_bind_error() -> None:
    """serve() on a port another socket holds raises EdgeBindError with advice."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(service.EdgeBindError, match="pick another --port"):
            await service.serve(Settings(), "127.0.0.1", port, asyncio.Event())
