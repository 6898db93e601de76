"""A tiny SMTP receiver on loopback that keeps what it is sent (development and tests only).

Keycloak's step-up mails a one-time code to a user with no second factor; the local
Keycloak (``authpipe keycloak up``), the tests and the side-by-side bench point the realm's
SMTP server here. ``MailSink`` runs in a thread of the caller (tests read ``messages`` or
``wait_for``); ``python -m pipeline.dev.mailsink --port P --dir D`` runs it alone and
writes each message to ``D/<epoch ms>-<n>.eml``. It speaks just enough SMTP for a client
without TLS or authentication (HELO/EHLO, MAIL, RCPT, DATA, RSET, NOOP, QUIT), accepts
every recipient and delivers nothing onwards. No dependency beyond asyncio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email
import email.policy
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

from pipeline.dev.errors import StackError
from pipeline.dev.processes import pid_alive, port_free, process_cmdline, wait_gone

MAX_MESSAGE_BYTES = 1 << 20
MAX_LINE_BYTES = 8192
HOST = "127.0.0.1"
_ADDRESS = re.compile(rb"<([^>]*)>")


class MailSinkError(StackError):
    """The mail sink could not start, or an awaited message did not come."""


@dataclass(frozen=True)
class Mail:
    """One message as received: the envelope and the raw bytes."""

    sender: str
    recipients: tuple[str, ...]
    data: bytes

    def parsed(self) -> EmailMessage:
        message = email.message_from_bytes(self.data, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        return message

    @property
    def text(self) -> str:
        """The plain-text body (transfer encoding undone)."""
        body = self.parsed().get_body(("plain",))
        return "" if body is None else str(body.get_content())


class MailSink:
    """An SMTP receiver on ``127.0.0.1:port`` (0: a free port) in a thread of its own."""

    def __init__(self, port: int = 0, directory: Path | None = None) -> None:
        self.port = port
        self.directory = directory
        self.messages: list[Mail] = []
        self._changed = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MailSink:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._session, HOST, self.port)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except OSError as exc:
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            self._server.close()
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=run, name="mailsink", daemon=True)
        self._thread.start()
        started.wait(10)
        if failure:
            raise MailSinkError(
                f"the mail sink could not listen on {HOST}:{self.port}: {failure[0]}; "
                "pick another port"
            )

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None

    def wait_for(self, recipient: str, since: int = 0, timeout_s: float = 15.0) -> Mail:
        """The first message from index ``since`` on addressed to ``recipient``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for mail in self.messages[since:]:
                    if recipient.lower() in (r.lower() for r in mail.recipients):
                        return mail
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MailSinkError(
                        f"no mail to {recipient} within {timeout_s:.0f}s "
                        f"({len(self.messages)} received); is the realm's SMTP server "
                        f"{HOST}:{self.port}?"
                    )
                self._changed.wait(left)

    def _keep(self, mail: Mail) -> None:
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            name = f"{int(time.time() * 1000)}-{len(self.messages)}.eml"
            (self.directory / name).write_bytes(mail.data)
        with self._changed:
            self.messages.append(mail)
            self._changed.notify_all()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def say(line: str) -> None:
            writer.write(line.encode() + b"\r\n")
            await writer.drain()

        sender, recipients = "", list[str]()
        try:
            await say("220 authpipe-mailsink ESMTP")
            while True:
                line = await reader.readuntil(b"\n")
                if len(line) > MAX_LINE_BYTES:
                    await say("500 line too long")
                    break
                verb = line[:4].upper()
                if verb == b"EHLO":
                    await say("250-authpipe-mailsink\r\n250-8BITMIME\r\n250 SIZE 1048576")
                elif verb == b"HELO":
                    await say("250 authpipe-mailsink")
                elif verb == b"MAIL":
                    found = _ADDRESS.search(line)
                    sender, recipients = (found.group(1).decode() if found else ""), []
                    await say("250 OK")
                elif verb == b"RCPT":
                    found = _ADDRESS.search(line)
                    recipients.append(found.group(1).decode() if found else "")
                    await say("250 OK")
                elif verb == b"DATA":
                    await say("354 end with <CRLF>.<CRLF>")
                    data = await _read_data(reader)
                    if data is None:
                        await say("552 message too large")
                        break
                    self._keep(Mail(sender, tuple(recipients), data))
                    sender, recipients = "", list[str]()
                    await say("250 OK kept")
                elif verb in (b"RSET", b"NOOP"):
                    sender, recipients = ("", []) if verb == b"RSET" else (sender, recipients)
                    await say("250 OK")
                elif verb == b"QUIT":
                    await say("221 bye")
                    break
                else:
                    await say("502 not implemented")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()


async def _read_data(reader: asyncio.StreamReader) -> bytes | None:
    """The DATA section up to the lone dot, dot-unstuffed; None past MAX_MESSAGE_BYTES."""
    lines: list[bytes] = []
    size = 0
    while True:
        line = await reader.readuntil(b"\n")
        if line in (b".\r\n", b".\n"):
            return b"".join(lines)
        size += len(line)
        if size > MAX_MESSAGE_BYTES:
            return None
        lines.append(line[1:] if line.startswith(b"..") else line)


PID_FILE = "mailsink.pid"


def sink_process_up(state_dir: Path, port: int) -> Path:
    """``python -m pipeline.dev.mailsink`` detached, unless ours already runs (pid in
    ``state_dir/mailsink.pid``); the directory its messages go to."""
    directory = state_dir / "mail"
    pid_path = state_dir / PID_FILE
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_path.read_text())
        if pid_alive(pid) and "pipeline.dev.mailsink" in " ".join(process_cmdline(pid)):
            return directory
    if not port_free(port):
        raise MailSinkError(
            f"port {port} on {HOST} is in use; the mail sink takes the Keycloak port + 2: "
            "pick another --port or stop what holds it"
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / "mailsink.log").open("ab") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline.dev.mailsink",
                "--port",
                str(port),
                "--dir",
                str(directory),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pid_path.write_text(f"{process.pid}\n")
    deadline = time.monotonic() + 10
    while port_free(port):
        if process.poll() is not None or time.monotonic() > deadline:
            raise MailSinkError(f"the mail sink did not start; see {state_dir / 'mailsink.log'}")
        time.sleep(0.05)
    return directory


def sink_process_down(state_dir: Path) -> None:
    """Stop the sink ``sink_process_up`` started here, if it runs."""
    pid_path = state_dir / PID_FILE
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_path.read_text())
        if pid_alive(pid) and "pipeline.dev.mailsink" in " ".join(process_cmdline(pid)):
            os.kill(pid, signal.SIGTERM)
            wait_gone(pid, 10.0)
    pid_path.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="an SMTP receiver on 127.0.0.1 that keeps mail")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True, help="where each message is written")
    args = parser.parse_args()
    sink = MailSink(args.port, args.dir)
    sink.start()
    print(f"mail sink on {HOST}:{sink.port}, messages in {args.dir}", flush=True)
    assert sink._thread is not None
    sink._thread.join()


if __name__ == "__main__":
    main()
