"""Shared ALTCHA test vectors (tests/vectors/altcha.json): the example login service's
verifier (Python) and the Keycloak provider's AltchaVerifier (Java, compiled here with the
JDK's javac) give every payload the same verdict, in order, at the vectors' clock; and a
challenge either side issues, solved by the altcha library, passes both.

The vectors are written by this module, by hand, when a case is added:
``.venv/bin/python -m tests.unit.test_altcha_vectors`` (challenges are random, so the file
changes on every run; the verdicts do not).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import altcha
import pytest

from tests.unit.test_edge_examples import login_service

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "altcha.json"
KEY = "altcha-vectors-hmac-key-0123456789abcdef"
OTHER_KEY = "another-deployments-key-0123456789abcdef"
NOW_S = 1_796_000_000  # 2026-11-29T01:33:20Z
FAR_S = 4_102_444_800  # 2100-01-01: live in every real clock too (the library checks it)
ALGORITHM, COST, PREFIX = "PBKDF2/SHA-256", 5_000, "00"


def b64(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.b64encode(raw).decode()


def solved(
    *, key: str = KEY, expires: int | None = FAR_S, data: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A signed challenge and its solution, as the widget's payload (decoded)."""
    challenge = altcha.create_challenge(
        ALGORITHM, COST, key_prefix=PREFIX, expires_at=expires, data=data, hmac_secret=key
    )
    solution = altcha.solve_challenge(challenge)
    assert solution is not None
    solution.time = 412.0  # what the widget reports; not signed, not checked
    return {"challenge": challenge.to_dict(), "solution": solution.to_dict()}


def resigned(payload: dict[str, Any], **parameters: Any) -> dict[str, Any]:
    """The payload with its parameters changed and signed again with KEY (a challenge
    this deployment could have issued), the solution kept."""
    params = {**payload["challenge"]["parameters"], **parameters}
    params = {k: v for k, v in params.items() if v is not None}
    canonical = altcha.v2._canonical_json(params)
    signature = altcha.v2._hmac_v2("SHA-256", canonical, KEY).hex()
    return {**payload, "challenge": {"parameters": params, "signature": signature}}


def urlsafe(payload: dict[str, Any]) -> str:
    """The payload in base64's URL-safe alphabet, padded until it holds a '-' or a '_'."""
    for pad in range(64):
        standard = b64({**payload, "pad": "~" * pad})
        if "+" in standard or "/" in standard:
            return standard.replace("+", "-").replace("/", "_")
    raise AssertionError("no padding gave a '+' or a '/'")


def cases() -> list[dict[str, str]]:
    good, second = solved(), solved()
    ch, sol = good["challenge"], good["solution"]
    counter, derived = sol["counter"], sol["derivedKey"]
    tampered = {**ch, "parameters": {**ch["parameters"], "cost": 1}}
    data = {"z": '\u00e9t\u00e9 \u2028 "q" \\', "a": [1, "x", {"b": None}], "10": True, "2": 0}
    deep = "[" * 1500 + "]" * 1500
    out: list[tuple[str, str, str]] = [
        ("a solved challenge", b64(good), "ok"),
        ("the same payload again", b64(good), "replayed"),
        ("another solved challenge", b64(second), "ok"),
        ("signed with another key", b64(solved(key=OTHER_KEY)), "bad_signature"),
        ("cost lowered after signing", b64({**good, "challenge": tampered}), "bad_signature"),
        (
            "no signature",
            b64({**good, "challenge": {"parameters": ch["parameters"]}}),
            "bad_signature",
        ),
        (
            "signature in upper case",
            b64({**good, "challenge": {**ch, "signature": ch["signature"].upper()}}),
            "bad_signature",
        ),
        (
            "signature not a string",
            b64({**good, "challenge": {**ch, "signature": 7}}),
            "bad_signature",
        ),
        (
            "the next counter",
            b64({**good, "solution": {**sol, "counter": counter + 1}}),
            "bad_solution",
        ),
        (
            "derived key changed",
            b64({**good, "solution": {**sol, "derivedKey": "00" + derived[2:-2] + "ff"}}),
            "bad_solution",
        ),
        (
            "derived key in upper case",
            b64({**good, "solution": {**sol, "derivedKey": derived.upper()}}),
            "bad_solution",
        ),
        (
            "counter as a string",
            b64({**good, "solution": {**sol, "counter": str(counter)}}),
            "bad_solution",
        ),
        ("counter negative", b64({**good, "solution": {**sol, "counter": -1}}), "bad_solution"),
        (
            "counter past uint32",
            b64({**good, "solution": {**sol, "counter": 2**32 + counter}}),
            "bad_solution",
        ),
        (
            "derived key not a string",
            b64({**good, "solution": {**sol, "derivedKey": 5}}),
            "bad_solution",
        ),
        ("expired a second ago", b64(solved(expires=NOW_S - 1)), "expired"),
        ("expires this second", b64(solved(expires=NOW_S)), "expired"),
        ("signed data, unicode and nested keys", b64(solved(data=data)), "ok"),
        ("no expiry, signed", b64(resigned(solved(), expiresAt=None)), "malformed"),
        ("expiry a string, signed", b64(resigned(solved(), expiresAt=str(FAR_S))), "malformed"),
        ("extra top-level field", b64({**solved(), "his": {"x": [1, None]}}), "ok"),
        (
            "cost 5000.0, its signature still good",
            b64({**good, "challenge": {**ch, "parameters": {**ch["parameters"], "cost": 5000.0}}}),
            "malformed",
        ),
        (
            "cost 5000.5",
            b64({**good, "challenge": {**ch, "parameters": {**ch["parameters"], "cost": 5000.5}}}),
            "bad_signature",
        ),
        (
            "the widget's test mode",
            b64({"challenge": None, "solution": None, "test": True}),
            "malformed",
        ),
        (
            "a PoW v1 payload",
            b64(
                {
                    "algorithm": "SHA-256",
                    "challenge": "ab",
                    "number": 1,
                    "salt": "s?expires=9",
                    "signature": "ab",
                }
            ),
            "malformed",
        ),
        ("no solution", b64({"challenge": ch}), "malformed"),
        ("solution not an object", b64({**good, "solution": [1]}), "malformed"),
        (
            "parameters missing nonce",
            b64(
                {
                    **good,
                    "challenge": {
                        **ch,
                        "parameters": {k: v for k, v in ch["parameters"].items() if k != "nonce"},
                    },
                }
            ),
            "malformed",
        ),
        ("a JSON array", b64([1, 2]), "malformed"),
        ("not JSON", b64(b"not json"), "malformed"),
        ("not UTF-8", b64(b'{"challenge": "\xff"}'), "malformed"),
        ("nested 1500 deep", b64(('{"challenge":' + deep + "}").encode()), "malformed"),
        ("not base64", "not base64!", "malformed"),
        ("base64 without its padding", b64(good).rstrip("="), "malformed"),
        ("base64 with a newline", b64(good)[:40] + "\n" + b64(good)[40:], "malformed"),
        ("URL-safe base64", urlsafe(good), "malformed"),
        ("empty", "", "malformed"),
        ("over 4096 characters", b64({**good, "pad": "x" * 3100}), "malformed"),
    ]
    return [{"name": n, "payload": p, "verdict": v} for n, p, v in out]


def write() -> None:
    made = cases()
    assert b64(solved()).rstrip("=") != b64(solved())  # the padding case must have padding
    document = {
        "about": "ALTCHA (PoW v2) payloads as the widget posts them, and the verdict a verifier"
        " owes each: run in order by one verifier whose clock reads now_s (epoch seconds)",
        "made_with": f"altcha {altcha_version()} (PyPI): create_challenge, solve_challenge",
        "hmac_key": KEY,
        "now_s": NOW_S,
        "algorithm": ALGORITHM,
        "cost": COST,
        "key_prefix": PREFIX,
        "max_payload_chars": 4096,
        "cases": made,
    }
    VECTORS.parent.mkdir(parents=True, exist_ok=True)
    VECTORS.write_text(json.dumps(document, indent=1, ensure_ascii=True) + "\n")
    print(f"{VECTORS}: {len(made)} cases")


def altcha_version() -> str:
    from importlib.metadata import version

    return version("altcha")


# -- the tests ----------------------------------------------------------------------------

JAVA_SOURCES = (
    Path(__file__).resolve().parents[2] / "integrations" / "keycloak" / "src" / "main" / "java"
)
VERIFIER = JAVA_SOURCES / "io" / "authpipe" / "keycloak" / "captcha"
HARNESS = """
import io.authpipe.keycloak.captcha.AltchaVerifier;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;

public class VectorsCheck {
  public static void main(String[] args) throws Exception {
    long nowMs = Long.parseLong(args[2]);
    AltchaVerifier verifier =
        new AltchaVerifier(args[1], Integer.parseInt(args[3]), args[4], 600, () -> nowMs, 1000);
    if (args[0].equals("make")) {
      System.out.println(verifier.newChallengeJson());
      return;
    }
    for (String line : Files.readAllLines(Path.of(args[5]))) {
      byte[] payload = Base64.getDecoder().decode(line);
      System.out.println(verifier.check(new String(payload, StandardCharsets.UTF_8)));
    }
  }
}
"""


def vectors() -> dict[str, Any]:
    return dict(json.loads(VECTORS.read_text()))


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: install a JDK 17+ (the project needs Java 17)", pytrace=False
        )
    return path


@pytest.fixture(scope="module")
def java(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[str]]:
    """The Java AltchaVerifier, compiled with the harness: ``java("check", payloads)`` its
    verdicts, ``java("make")`` a challenge it issued (one fresh verifier per call)."""
    out = tmp_path_factory.mktemp("altcha-java")
    (out / "VectorsCheck.java").write_text(HARNESS)
    sources = [*map(str, sorted(VERIFIER.glob("*.java"))), str(out / "VectorsCheck.java")]
    built = subprocess.run(
        [tool("javac"), "-Xlint:all", "-Werror", "-d", str(out), *sources],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    v = vectors()

    def run(mode: str, payloads: list[str] = (), now_s: int = v["now_s"]) -> list[str]:
        lines = out / "payloads.txt"
        lines.write_text("".join(base64.b64encode(p.encode()).decode() + "\n" for p in payloads))
        done = subprocess.run(
            [
                tool("java"),
                "-cp",
                str(out),
                "VectorsCheck",
                mode,
                v["hmac_key"],
                str(now_s * 1000),
                str(v["cost"]),
                v["key_prefix"],
                str(lines),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    return run


def python_verifier(v: dict[str, Any], now_s: float) -> Any:
    return login_service.AltchaCaptcha(
        v["hmac_key"], cost=v["cost"], key_prefix=v["key_prefix"], clock=lambda: now_s
    )


def test_the_vectors_cover_every_verdict() -> None:
    """The file holds each verdict at least once, and the widget's parameters."""
    v = vectors()
    assert {c["verdict"] for c in v["cases"]} == set(login_service.ALTCHA_VERDICTS)
    assert (v["algorithm"], v["cost"], v["key_prefix"]) == (
        login_service.ALTCHA_ALGORITHM,
        login_service.ALTCHA_COST,
        login_service.ALTCHA_KEY_PREFIX,
    )
    assert v["max_payload_chars"] == login_service.ALTCHA_MAX_PAYLOAD


def test_the_python_verifier_gives_every_vector_its_verdict() -> None:
    """The login service's AltchaCaptcha, one instance, the cases in order: each verdict."""
    v = vectors()
    verifier = python_verifier(v, v["now_s"])
    got = [(c["name"], verifier.check(c["payload"])) for c in v["cases"]]
    assert got == [(c["name"], c["verdict"]) for c in v["cases"]]


def test_the_java_verifier_gives_every_vector_its_verdict(java: Callable[..., list[str]]) -> None:
    """The Keycloak provider's AltchaVerifier, one instance, the cases in order: each verdict."""
    cases = vectors()["cases"]
    got = java("check", [c["payload"] for c in cases])
    assert list(zip([c["name"] for c in cases], got, strict=True)) == [
        (c["name"], c["verdict"]) for c in cases
    ]


def test_a_challenge_either_side_issues_passes_both(java: Callable[..., list[str]]) -> None:
    """A Java challenge solved by the altcha library passes Java once (then replayed) and
    Python; a Python one passes Java. Both sign the same parameters: PBKDF2/SHA-256, cost
    5,000, prefix 00, 32-byte key, expiry 10 minutes ahead."""
    v = vectors()
    now_s = int(time.time())
    (made,) = java("make", now_s=now_s)
    from_java = json.loads(made)
    params = from_java["parameters"]
    assert {k: params[k] for k in ("algorithm", "cost", "keyLength", "keyPrefix")} == {
        "algorithm": ALGORITHM,
        "cost": COST,
        "keyLength": 32,
        "keyPrefix": PREFIX,
    }
    assert params["expiresAt"] == now_s + 600 and len(params["nonce"]) == len(params["salt"]) == 32
    python = python_verifier(v, now_s)
    from_python = python.challenge()
    payloads = []
    for challenge in (from_java, from_python):
        parsed = altcha.Challenge.from_dict(challenge)
        solution = altcha.solve_challenge(parsed)
        assert solution is not None
        payloads.append(altcha.Payload(parsed, solution).to_base64())
    assert java("check", [payloads[0], payloads[0], payloads[1]], now_s=now_s) == [
        "ok",
        "replayed",
        "ok",
    ]
    assert [python.check(p) for p in payloads] == ["ok", "ok"]
    assert java("check", [payloads[0]], now_s=now_s + 600) == ["expired"]


if __name__ == "__main__":
    write()
