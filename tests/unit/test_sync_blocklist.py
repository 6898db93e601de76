"""examples/gateway/sync-blocklist.sh (issue 26 item 14), run against a local HTTP(S)
server on 127.0.0.1: it installs only a list whose every line is the edge's, keeps the
previous file on any failure, writes an empty list on a first run without one, asks for
one tenant, refuses plain http off loopback and verifies https."""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.edge.blocklist import BlockEntry, FeedQuery, render_body

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "gateway" / "sync-blocklist.sh"
OPENSSL = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj"]
OPENSSL += ["/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
PREVIOUS = "# authpipe source block-list: 1 sources, tenant=*, block\n192.0.2.1 1;\n"


def _entries(*sources: str) -> list[BlockEntry]:
    return [BlockEntry("acme", s, "block", "manual", f"d{i}", 0) for i, s in enumerate(sources)]


def edge_body(*sources: str, fmt: str = "nginx-geo", tenant: str | None = None) -> bytes:
    """The body the edge renders for these sources (pipeline.edge.blocklist)."""
    return render_body(_entries(*sources), FeedQuery(fmt=fmt, tenant=tenant))


@dataclass
class FakeEdge:
    """What the server answers (status, body) and the request paths it was asked."""

    status: int = 200
    body: bytes = b""
    paths: list[str] = field(default_factory=list)
    url: str = ""


def _serve(edge: FakeEdge, context: ssl.SSLContext | None) -> Iterator[FakeEdge]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            edge.paths.append(self.path)
            self.send_response(edge.status)
            self.send_header("ETag", '"0123abcd"')
            self.send_header("Content-Length", str(len(edge.body)))
            self.end_headers()
            self.wfile.write(edge.body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    scheme = "https" if context else "http"
    edge.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield edge
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def edge() -> Iterator[FakeEdge]:
    """A plain-HTTP fake edge on 127.0.0.1."""
    yield from _serve(FakeEdge(), None)


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    """A self-signed certificate for 127.0.0.1: the server's context and the CA file."""
    cert, key = tmp_path / "edge.pem", tmp_path / "edge.key"
    subprocess.run(
        [*OPENSSL, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, cert


def sync(
    target: Path,
    url: str,
    *options: str,
    fmt: str = "nginx-geo",
    nginx: str = "true",
    cacert: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """One ``--once`` run of the script against ``url`` (``options``, then the target and
    format as positional arguments), nginx stubbed by the command ``nginx``."""
    env = {"PATH": "/usr/bin:/bin", "AUTHPIPE_EDGE_URL": url, "AUTHPIPE_NGINX": nginx}
    if cacert is not None:
        env["AUTHPIPE_EDGE_CACERT"] = str(cacert)
    return subprocess.run(
        ["bash", str(SCRIPT), "--once", *options, str(target), fmt],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("fmt", ["nginx-geo", "nginx"])
@pytest.mark.parametrize("tenant", [None, "eu-1.prod"])
def test_the_edges_own_list_is_installed(
    edge: FakeEdge, tmp_path: Path, fmt: str, tenant: str | None
) -> None:
    """A list as the edge renders it (either format, any tenant) replaces the file; with
    --tenant the request asks for that tenant."""
    target = tmp_path / "blocklist.conf"
    target.write_text(PREVIOUS)
    edge.body = edge_body(
        "203.0.113.7", "198.51.100.0/24", "2001:db8:1:2::/64", fmt=fmt, tenant=tenant
    )
    args = ["--tenant", tenant] if tenant else []
    done = sync(target, edge.url, *args, fmt=fmt)
    assert (done.returncode, done.stderr) == (0, "")
    assert target.read_bytes() == edge.body
    expected = f"/v1/blocklist?format={fmt}" + (f"&tenant={tenant}" if tenant else "")
    assert edge.paths == [expected + "&wait_ms=0"]


@pytest.mark.parametrize(
    "body",
    [
        PREVIOUS.replace("192.0.2.1", "0.0.0.0/0").encode(),  # a deny-all
        PREVIOUS.replace("192.0.2.1", "2001:db8::/16").encode(),  # an IPv6 /16
        PREVIOUS.replace("192.0.2.1 1;", "192.0.2.1 1; include /etc/passwd;").encode(),
        PREVIOUS.replace("1;", "0;").encode(),  # an allow entry
        PREVIOUS.encode() + b"192.0.2.9 1;\n",  # more entries than the header counts
        PREVIOUS.encode().rstrip(b"\n"),  # cut short
        b"<html>maintenance</html>\n",
        b"",
        edge_body("192.0.2.1", tenant="other"),  # another tenant's list
    ],
)
def test_a_list_with_any_bad_line_keeps_the_previous_file(
    edge: FakeEdge, tmp_path: Path, body: bytes
) -> None:
    """Exit 1, a line saying why, and the previous file byte for byte."""
    target = tmp_path / "blocklist.conf"
    target.write_text('# authpipe source block-list: 0 sources, tenant="acme", block\n')
    before = target.read_bytes()
    edge.body = body
    done = sync(target, edge.url, "--tenant", "acme")
    assert done.returncode == 1
    assert "is not a valid entry; keeping" in done.stderr
    assert target.read_bytes() == before


def test_an_unreachable_edge_or_failed_nginx_test_keeps_the_previous_file(
    edge: FakeEdge, tmp_path: Path
) -> None:
    """A 503, a refused connection and a failing `nginx -t` each leave the file as it was."""
    target = tmp_path / "blocklist.conf"
    target.write_text(PREVIOUS)
    edge.status, edge.body = 503, b"not ready"
    assert sync(target, edge.url).returncode == 1
    assert sync(target, "http://127.0.0.1:1").returncode == 1
    edge.status, edge.body = 200, edge_body("203.0.113.7")
    done = sync(target, edge.url, nginx="false")
    assert (done.returncode, "nginx -t failed" in done.stderr) == (1, True)
    assert target.read_text() == PREVIOUS


def test_a_first_run_without_an_edge_writes_an_empty_list(tmp_path: Path) -> None:
    """No file and no edge: an empty list (header only) so nginx can start; exit 1."""
    target = tmp_path / "blocklist.conf"
    done = sync(target, "http://127.0.0.1:1", "--tenant", "acme")
    assert done.returncode == 1
    assert target.read_text() == '# authpipe source block-list: 0 sources, tenant="acme", block\n'


@pytest.mark.parametrize(
    ("args", "url", "says"),
    [
        ([], "http://edge.internal:8080", "must be https://"),
        (["--tenant", "Acme"], "http://127.0.0.1:1", "is not a tenant"),
        ([], "http://127.0.0.1:1", "format must be nginx-geo or nginx"),
    ],
)
def test_bad_arguments_exit_2_before_fetching(
    tmp_path: Path, args: list[str], url: str, says: str
) -> None:
    """Plain http off loopback, a bad tenant and a bad format exit 2 and write nothing."""
    target = tmp_path / "blocklist.conf"
    extra = ["text"] if "format" in says else []
    done = subprocess.run(
        ["bash", str(SCRIPT), "--once", *args, str(target), *extra],
        env={"PATH": "/usr/bin:/bin", "AUTHPIPE_EDGE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, says in done.stderr, target.exists()) == (2, True, False)


def test_https_is_verified(tls: tuple[ssl.SSLContext, Path], tmp_path: Path) -> None:
    """Against a self-signed edge, without its CA the fetch fails and the file is kept;
    with AUTHPIPE_EDGE_CACERT it is installed."""
    context, cert = tls
    target = tmp_path / "blocklist.conf"
    target.write_text(PREVIOUS)
    for server in _serve(FakeEdge(body=edge_body("203.0.113.7")), context):
        refused = sync(target, server.url)
        assert (refused.returncode, target.read_text()) == (1, PREVIOUS)
        assert sync(target, server.url, cacert=cert).returncode == 0
        assert target.read_bytes() == server.body


def stub_curl(tmp_path: Path) -> tuple[str, Path]:
    """A PATH whose ``curl`` records its arguments and fails (no traffic anywhere), and the
    file it records them in."""
    bin_dir, called = tmp_path / "bin", tmp_path / "curl-args"
    bin_dir.mkdir()
    curl = bin_dir / "curl"
    curl.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {called}\nexit 7\n")
    curl.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin", called


def run_stubbed(tmp_path: Path, url: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    path, called = stub_curl(tmp_path)
    done = subprocess.run(
        ["bash", str(SCRIPT), "--once", str(tmp_path / "blocklist.conf")],
        env={"PATH": path, "AUTHPIPE_EDGE_URL": url, "AUTHPIPE_EDGE_TOKEN": "secret-token"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, called


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1@203.0.113.9:8080",  # userinfo: the host is 203.0.113.9
        "http://127.0.0.1:8080@203.0.113.9",
        "http://127.0.0.1.nip.io",  # a name that starts like loopback
        "http://127.0.0.1.nip.io:8080/",
        "http://localhost.example:8080",
        "http://localhost@203.0.113.9",
        "http://[::1]@203.0.113.9",
        "http://[::1].example",
        "http://127.0.0.1#@203.0.113.9",
        "http://127.0.0.1?@203.0.113.9",
        "http://127.0.0.1%40203.0.113.9",
        "http://127.1",  # curl reads it as 127.0.0.1; not a plain dotted quad
        "http://0177.0.0.1",
        "http://127.0.0.256",
        "http://2130706433",
        "https://user:pw@edge.example:8443",  # userinfo is refused on https too
        "http://127.0.0.1:8080 -k",
        "HTTP://203.0.113.9",
    ],
)
def test_a_url_that_is_not_plainly_loopback_is_refused_before_curl(
    tmp_path: Path, url: str
) -> None:
    """The host is parsed, not matched as text: userinfo, names that only start like
    loopback and odd address forms exit 2, and curl (stubbed) is never run."""
    done, called = run_stubbed(tmp_path, url)
    assert (done.returncode, "AUTHPIPE_EDGE_URL must be" in done.stderr) == (2, True)
    assert not called.exists()
    assert not (tmp_path / "blocklist.conf").exists()


@pytest.mark.parametrize(
    ("url", "fetched", "proto"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1/blocklist", "=http"),
        ("http://127.8.9.10:1/", "http://127.8.9.10:1/v1/blocklist", "=http"),
        ("http://localhost:8080", "http://localhost:8080/v1/blocklist", "=http"),
        ("http://localhost", "http://localhost/v1/blocklist", "=http"),
        ("http://[::1]:8080", "http://[::1]:8080/v1/blocklist", "=http"),
        ("https://edge.example:8443/gw", "https://edge.example:8443/gw/v1/blocklist", "=https"),
    ],
)
def test_loopback_http_and_https_reach_curl(
    tmp_path: Path, url: str, fetched: str, proto: str
) -> None:
    """127.0.0.0/8, ::1 and localhost over http, any host over https: curl (stubbed) is run
    for that URL, limited to its protocol; loopback http bypasses any proxy."""
    done, called = run_stubbed(tmp_path, url)
    assert done.returncode == 1  # the stub fails: the previous (here: empty) list is kept
    args = called.read_text().splitlines()
    assert args[-1].startswith(fetched + "?format=nginx-geo&wait_ms=0")
    assert args[args.index("--proto") + 1] == proto
    assert ("--noproxy" in args) == (proto == "=http")
