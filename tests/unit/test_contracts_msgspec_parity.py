"""The msgspec fast path of decode_attempt against the pydantic model alone: the same events
accepted with the same values and normalised attempts, the same dead letters (reason and
detail), the same ingest rows; and the Struct's schema is the model's."""

from __future__ import annotations

import json
import string
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pipeline.contracts.codec import DecodeError, decode_attempt
from pipeline.contracts.fast_attempt import LoginAttemptStruct, decode_fast
from pipeline.contracts.models import TENANT_PATTERN, LoginAttempt
from pipeline.core.errors import InvalidAttempt
from pipeline.errors import ConfigError
from pipeline.settings import Settings
from pipeline.stream.ingest import Ingest, Record
from pipeline.wiring import build_normaliser

SETTINGS = Settings(ingest={"trusted_proxies": ("10.0.0.0/8",)})  # type: ignore[arg-type]
NORMALISER = build_normaliser(SETTINGS)
FIELDS = tuple(LoginAttempt.model_fields)
NOW_MS = 1_793_000_000_000  # 2026-10-26; generated times fall on both sides of the skews
EXAMPLES = settings(max_examples=3000, suppress_health_check=[HealthCheck.too_slow])

# -- what one raw value becomes --------------------------------------------------------


def fields(event: Any) -> dict[str, Any]:
    """Every field's value, and occurred_at's offset (equal datetimes may differ in it)."""
    values = {name: getattr(event, name) for name in FIELDS}
    return values | {"utcoffset": event.occurred_at.utcoffset()}


def outcome(raw: bytes, *, fast: bool) -> tuple[Any, ...]:
    """Accepted (fields and normalised attempt), refused by normalisation, or dead-lettered."""
    try:
        event = decode_attempt(raw, fast=fast)
    except DecodeError as exc:
        return ("dead", exc.reason, exc.detail)
    try:
        return ("ok", fields(event), NORMALISER.normalise(event))
    except InvalidAttempt as exc:
        return ("invalid", fields(event), exc.reason, exc.detail)


def ingested(raws: list[bytes], decoder: str) -> tuple[Any, ...]:
    """Ingest's rows and dead letters (reason, detail, offset) for the values in order."""
    ingest = Ingest(NORMALISER, partitions=8, decoder=decoder, tenants=frozenset())
    records = [Record("auth.login-attempts", 0, i, None, raw) for i, raw in enumerate(raws)]
    result = ingest.process(records, now_ms=NOW_MS)
    dead = [(d.reason, d.detail, d.record.offset) for d in result.dead]
    return result.rows, dead, dict(result.reasons)


# -- strategies ------------------------------------------------------------------------

ODD = "\u200b\u00ad\ufeff\u202e\u0430\uff41\u00df\u0130\u1e9e\ufb01\u0000\u001f\u007f\U0001f600"
TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(string.ascii_letters + string.digits + "@.-_:/ "),
        st.sampled_from(ODD),
        st.characters(),  # any code point but surrogates
        st.characters(categories=["Cs"]),  # lone surrogates: escaped, or invalid UTF-8
    ),
    max_size=40,
)
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)
JSON_VALUE = st.recursive(
    JSON_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3)
)


def moments(low: datetime, high: datetime) -> st.SearchStrategy[datetime]:
    """Aware datetimes from ``low`` to ``high``, to the microsecond."""
    span = (high - low) // timedelta(microseconds=1)
    return st.integers(0, span).map(lambda us: low + timedelta(microseconds=us))


@st.composite
def times(draw: st.DrawFn) -> str:
    """occurred_at text: RFC 3339 and its neighbours, in range and out of it."""
    if draw(st.booleans()):
        minutes = draw(st.integers(-23 * 60 - 59, 23 * 60 + 59))
        moment = draw(
            moments(datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC))
        ).astimezone(timezone(timedelta(minutes=minutes)))
        text = moment.isoformat(timespec=draw(st.sampled_from(["seconds", "milliseconds", "auto"])))
        return text.replace("+00:00", draw(st.sampled_from(["Z", "+00:00", "-00:00", "z"])))

    def pick(*choices: str) -> str:
        return draw(st.sampled_from(choices))

    year = pick("2026", "1970", "1969", "0001", "9999", "0000", "10000", "26", "+2026")
    date = f"{year}-{pick('10', '02', '12', '1', '00', '13')}-{pick('26', '29', '31', '00', '32')}"
    clock = f"{pick('00', '12', '23', '24', '1')}:{pick('00', '59', '60')}"
    clock += pick(":00", ":59", ":60", ":61", "", ":5")
    fraction = pick("", "", ".", ",") + draw(st.text("0123456789", max_size=12))
    offset = pick("Z", "+01:00", "-23:59", "+24:00", "+00:60", "+0100", "+01", "z", "", "-00:00")
    separator = pick("T", "T", "t", " ", "_", "X", "")
    return pick(
        f"{date}{separator}{clock}{fraction}{offset}",
        f"{date}{separator}{clock}{fraction}{offset}",
        f"{date}{separator}{clock}{fraction}{offset}",
        date,
        f"{date}{offset}",
        "1700000000",
        "1700000000.5",
        " 2026-10-26T00:00:00Z",
        "2026-10-26T00:00:00Z\n",
        "2026-W43-1T00:00:00Z",
        "20261026T000000Z",
        "\uff12026-10-26T00:00:00Z",  # a full-width digit
    )


IPS = st.sampled_from(["192.0.2.1", "10.1.2.3", "2001:db8::1", "::ffff:10.0.0.1", "[2001:db8::2]"])
VALID_TEXT = st.text(min_size=1, max_size=40)  # any code point but surrogates
GOOD: dict[str, st.SearchStrategy[Any]] = {
    "event_id": st.text(min_size=1, max_size=128),
    "occurred_at": moments(datetime(2026, 10, 18, tzinfo=UTC), datetime(2026, 10, 27, tzinfo=UTC))
    .map(datetime.isoformat)
    .map(lambda text: text.replace("+00:00", "Z") if len(text) % 2 else text),
    "tenant": st.sampled_from(["default", "acme", "a.b-c_d", "0", "x" * 64]),
    "service": VALID_TEXT,
    "flow": st.sampled_from(["login", "uia", "mfa", "recovery", "token", "reset", "challenge"]),
    "account": VALID_TEXT | st.text(alphabet=ODD, min_size=1, max_size=8),
    "peer_ip": IPS,
    "forwarded_for": st.lists(IPS | VALID_TEXT, max_size=4),
    "device_id": st.none() | VALID_TEXT,
    "device_trusted": st.booleans(),
    "session_id": st.none() | VALID_TEXT,
    "outcome": st.sampled_from(["success", "failure"]),
    "failure_reason": st.none() | st.sampled_from(["bad_password", "refused", "other"]),
    "challenge": st.none() | st.sampled_from(["captcha", "step_up"]),
    "user_agent": st.none() | TEXT | st.text(min_size=510, max_size=520),
}
EDGE: dict[str, st.SearchStrategy[Any]] = {
    "event_id": st.sampled_from(["", "e" * 128, "e" * 129]),
    "occurred_at": times(),
    "tenant": st.sampled_from(["Acme", "-x", "x" * 65, "abc\n", "", "\u00e9", "a|b"]),
    "service": st.sampled_from(["", "s" * 128, "s" * 129]),
    "flow": st.sampled_from(["LOGIN", "", "login "]),
    "account": st.sampled_from(["", " ", "\u200b", "a" * 320, "a" * 321, "\u00ad\u200b"]),
    "peer_ip": st.sampled_from(["", "x", "999.1.1.1", "1" * 64, "1" * 65, " 10.1.2.3"]),
    "forwarded_for": st.lists(IPS, min_size=63, max_size=66) | st.lists(TEXT, max_size=3),
    "device_id": st.sampled_from(["", "d" * 256, "d" * 257]),
    "device_trusted": st.sampled_from([0, 1, "true", None]),
    "session_id": st.sampled_from(["", "s" * 257]),
    "outcome": st.sampled_from(["maybe", "", "Success"]),
    "failure_reason": st.sampled_from(["nope", ""]),
    "challenge": st.sampled_from(["sms", ""]),
    "user_agent": st.sampled_from(["", "u" * 512, "u" * 513]),
}
REQUIRED = ("event_id", "occurred_at", "service", "account", "peer_ip", "outcome")
MUTATIONS = ("drop", "retype", "edge", "edge", "edge", "unknown", "repeat")


@st.composite
def pairs(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """An event's (key, value) pairs: valid, then 0-3 mutations (a field dropped, retyped
    or at an edge of its range, an unknown field, a key repeated)."""
    out = [
        (name, draw(values))
        for name, values in GOOD.items()
        if name in REQUIRED or draw(st.booleans())  # else the default
    ]
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2, 3]))):
        kind = draw(st.sampled_from(MUTATIONS))
        at = draw(st.integers(0, len(out)))
        name = draw(st.sampled_from(list(GOOD)))
        if kind == "drop" and out:
            del out[min(at, len(out) - 1)]
        elif kind == "retype":
            out = [(k, draw(JSON_VALUE) if k == name else v) for k, v in out]
        elif kind == "edge":
            out = [(k, v) for k, v in out if k != name]
            out.insert(min(at, len(out)), (name, draw(EDGE[name])))
        elif kind == "unknown":
            key = draw(st.sampled_from(["brand_new", "Event_id", "tenant ", "x"]) | TEXT)
            out.insert(at, (key, draw(JSON_VALUE)))
        else:  # a repeated key: the last one counts, for both parsers
            out.insert(at, (name, draw(GOOD[name] | EDGE[name] | JSON_VALUE)))
    return out


def _escape_key(key: str) -> str:
    return "".join(f"\\u{ord(c):04x}" if c in "ae" else c for c in json.dumps(key))


@st.composite
def encoded(draw: st.DrawFn) -> bytes:
    """Pairs as JSON text (repeated keys kept), ASCII-escaped or raw UTF-8 (a lone
    surrogate then being invalid UTF-8), sometimes with escaped keys, wrapped in other
    JSON or with bytes inserted, deleted or replaced."""
    items = draw(pairs())
    ascii_only = draw(st.booleans())
    escape = draw(st.integers(0, 9)) == 9  # integers lean to 0: the rare case is 9

    def dumps(value: Any) -> str:
        return json.dumps(value, ensure_ascii=ascii_only)

    body = ",".join(f"{_escape_key(k) if escape else dumps(k)}:{dumps(v)}" for k, v in items)
    text = draw(
        st.sampled_from(["{%s}"] * 6 + [" {%s} ", "{%s}\n", "\ufeff{%s}", "[{%s}]", "{%s}{}"])
    )
    raw = (text % body).encode("utf-8", "surrogatepass")
    for _ in range(draw(st.sampled_from([0] * 7 + [1, 2]))):
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(max_size=2)) + raw[at + draw(st.integers(0, 2)) :]
    if draw(st.integers(0, 29)) == 29:
        raw = draw(st.sampled_from([b"", b"null", b"[]", b'"s"', b"1e999", b"true", b"\xff"]))
    return raw


CANONICAL = st.fixed_dictionaries(
    {
        "event_id": st.text(min_size=1, max_size=128),
        "occurred_at": moments(
            datetime(2026, 10, 20, tzinfo=UTC), datetime(2026, 10, 27, tzinfo=UTC)
        ).map(datetime.isoformat),
        "service": st.text(min_size=1, max_size=20),
        "account": st.text(min_size=1, max_size=40),
        "peer_ip": st.sampled_from(["192.0.2.1", "10.1.2.3", "2001:db8::1"]),
        "outcome": st.sampled_from(["success", "failure"]),
    },
    optional={
        "tenant": st.sampled_from(["default", "acme", "t-2"]),
        "flow": st.sampled_from(["login", "uia", "mfa", "challenge"]),
        # Within the schema's bound on hops (longer chains are the hostile strategy's).
        "forwarded_for": st.lists(
            st.sampled_from(["198.51.100.7", "10.0.0.9", "junk"]), max_size=16
        ),
        "device_id": st.none() | st.text(min_size=1, max_size=30),
        "device_trusted": st.booleans(),
        "failure_reason": st.none() | st.sampled_from(["bad_password", "refused"]),
        "challenge": st.none() | st.sampled_from(["captcha", "step_up"]),
        "user_agent": st.none() | st.text(max_size=600),
    },
)

# -- the properties --------------------------------------------------------------------


@EXAMPLES
@given(encoded())
def test_any_value_decodes_alike_with_and_without_msgspec(raw: bytes) -> None:
    """Hostile and valid values alike: accepted with the same fields and normalised attempt,
    or dead-lettered with the same reason and detail, with the fast path as without it."""
    assert outcome(raw, fast=True) == outcome(raw, fast=False)


@settings(max_examples=400)
@given(st.lists(encoded() | CANONICAL.map(orjson.dumps), min_size=1, max_size=8))
def test_ingest_batches_are_alike_with_either_decoder(raws: list[bytes]) -> None:
    """Ingest with ingest.decoder msgspec and pydantic: the same rows by partition and the
    same dead letters (reason, detail, offset), skews and tenant checks included."""
    assert ingested(raws, "msgspec") == ingested(raws, "pydantic")


@settings(max_examples=500)
@given(CANONICAL)
def test_schema_exact_events_take_the_fast_path(body: dict[str, Any]) -> None:
    """A valid event with only known fields and a canonical time is read by msgspec, with
    the model's values (so the fast path is what the differential test exercises)."""
    raw = orjson.dumps(body)
    event = decode_fast(raw)
    assert event is not None
    assert fields(event) == fields(LoginAttempt.model_validate_json(raw))


def test_the_fast_path_defers_where_msgspec_and_pydantic_part() -> None:
    """A seventh fractional digit (msgspec rounds, pydantic truncates), an unknown field,
    a bad tenant and bytes msgspec skips unchecked go to the model, which decides."""
    base = {
        "event_id": "e1",
        "occurred_at": "2026-10-26T00:00:00.0009999Z",
        "service": "web",
        "account": "alice",
        "peer_ip": "192.0.2.1",
        "outcome": "success",
    }
    deferred = [
        orjson.dumps(base),
        orjson.dumps(base | {"occurred_at": "2026-10-26T00:00Z"}),
        orjson.dumps(base | {"occurred_at": "2026-02-29T00:00:00Z"}),
        orjson.dumps(base | {"brand_new": 1}),
        orjson.dumps(base | {"tenant": "abc\n"}),
        orjson.dumps(base)[:-1] + b',"x":"\xff"}',
        orjson.dumps(base)[:-1] + b',"x":' + b"[" * 250 + b"]" * 250 + b"}",
    ]
    assert [decode_fast(raw) for raw in deferred] == [None] * len(deferred)
    assert [outcome(raw, fast=True)[:2] for raw in deferred] == [
        ("ok", fields(LoginAttempt.model_validate_json(deferred[0]))),
        ("ok", fields(LoginAttempt.model_validate_json(deferred[1]))),
        ("dead", "invalid_field"),
        ("ok", fields(LoginAttempt.model_validate_json(deferred[3]))),
        ("dead", "invalid_field"),
        ("dead", "bad_utf8"),
        ("dead", "not_json"),
    ]
    assert outcome(deferred[0], fast=True)[2].occurred_ms == 1_792_972_800_000  # truncated


def test_a_bad_decoder_setting_is_one_clear_error() -> None:
    """ingest.decoder takes msgspec or pydantic; another value fails in settings and in Ingest."""
    with pytest.raises(ValidationError, match="Input should be 'msgspec' or 'pydantic'"):
        Settings(ingest={"decoder": "fast"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        Ingest(NORMALISER, partitions=8, decoder="fast")
    assert str(caught.value) == "ingest.decoder is 'fast'; use one of msgspec, pydantic"


def _comparable(schema: dict[str, Any]) -> dict[str, Any]:
    """A property's schema without prose (title, description) and with enums as sets."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("title", "description"):
            continue
        if key == "anyOf":
            value = [_comparable(part) for part in value]
        if key == "enum":
            out["type"] = "string"
            value = sorted(value)
        out[key] = value
    return out


def test_the_struct_has_the_models_schema() -> None:
    """Field for field, LoginAttemptStruct's JSON schema is LoginAttempt's (types, bounds,
    enums, defaults, required), except the tenant pattern the fast path checks in code."""
    model = LoginAttempt.model_json_schema(mode="validation")
    struct = json.loads(msgspec.json.encode(msgspec.json.schema(LoginAttemptStruct)))
    struct = struct["$defs"]["LoginAttemptStruct"]
    assert model["properties"]["tenant"].pop("pattern") == f"^{TENANT_PATTERN}$"
    assert list(struct["properties"]) == list(model["properties"])
    assert {name: _comparable(s) for name, s in struct["properties"].items()} == {
        name: _comparable(s) for name, s in model["properties"].items()
    }
    assert sorted(struct["required"]) == sorted(model["required"])
