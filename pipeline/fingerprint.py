"""The worker's normalisation fingerprint (issue 26 item 2): what the worker, the edge and
``authpipe decisions add`` must agree on for account and source decisions to match.

An account decision matches a check only if both sides compute the same digest (the same
``identity.digest_key``, the same case-sensitive tenants, the same normalisation code) and
a source decision only if both group sources alike (``ingest.trusted_proxies``, the
prefixes, the NAT64 prefixes whose clients count as their IPv4 address); and the edge
verifies unfamiliar sign-ins as the policy's ``[verify]`` says, so it must read the
workers' policy. Nothing fails when they differ: decisions silently never apply. So the worker
publishes ``fingerprint(settings)`` at start to a compacted topic beside its decisions
(``fingerprint_topic``: ``<decisions topic>.normalisation``, keyed by the decisions
topic), and the edge (not ready) and ``decisions add`` (exit 1) refuse with one line
saying what differs (``mismatch``).

The digest key is never published: its part is the keyed digest of a fixed probe, as
any account digest on the decisions topic already is. A missing or unreadable fingerprint
(an older worker, a topic the ACLs do not grant) is logged and not compared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from pipeline.core.normalise import Address, format_source, parse_network
from pipeline.errors import AuthpipeError
from pipeline.logs import get_logger
from pipeline.wiring import build_normaliser, load_policy

if TYPE_CHECKING:
    from pipeline.core.policy import Policy
    from pipeline.settings import Settings

log = get_logger("fingerprint")

NORMALISATION = "2"
"""The normalisation code's own version: bump it when ``normalise_account``,
``client_address``, ``embedded_ipv4`` or the grouping change what they compute (2: RFC
8215's ``64:ff9b:1::/48`` is folded to the IPv4 address it carries)."""
TIMEOUT_S = 15.0
_PROBE = "authpipe normalisation fingerprint"
TOPIC_CONFIG = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.5"}
_LABELS = {
    "normalisation": "the normalisation code (authpipe version)",
    "digest_key": "identity.digest_key",
    "case_sensitive_tenants": "case-sensitive tenants (ingest.case_sensitive_tenants and the policy)",
    "trusted_proxies": "ingest.trusted_proxies",
    "ipv4_prefix": "ingest.ipv4_prefix",
    "ipv6_prefix": "ingest.ipv6_prefix",
    "nat64_prefixes": "ingest.nat64_prefixes",
    "verify": "the policy's [verify] mode per tenant (* = [defaults])",
}
_LISTS = ("case_sensitive_tenants", "trusted_proxies", "nat64_prefixes", "verify")
_ORDERED = {"nat64_prefixes": "the first that holds an address folds it"}
"""List parts whose order counts too, and why."""
_ABSENT = {"nat64_prefixes": "", "verify": "*=off"}
"""Parts an older worker does not publish, as what it computes: no NAT64 prefixes, no
verification of unfamiliar sign-ins."""
_VERSION_ADVICE = "run the same authpipe version on both (upgrade the older one)"
_SETTINGS_ADVICE = "start both with the same identity.digest_key, [ingest] settings and policy"


class FingerprintError(AuthpipeError):
    """The fingerprint could not be published or read."""


def fingerprint_topic(decisions_topic: str) -> str:
    """The compacted topic that holds the fingerprint of the workers writing
    ``decisions_topic``."""
    return f"{decisions_topic}.normalisation"


def _canonical_network(text: str) -> str:
    network = parse_network(text)
    full = 32 if network.version == 4 else 128
    return format_source(
        Address(network.version, network.value),
        ipv4_prefix=network.prefix if network.version == 4 else full,
        ipv6_prefix=network.prefix if network.version == 6 else full,
    )


def fingerprint(settings: Settings, policy: Policy | None = None) -> dict[str, str]:
    """The parts of ``settings`` (and the policy) that decide digests and sources, as text;
    the digest key only as the keyed digest of a fixed probe."""
    if policy is None:
        policy = load_policy(settings.policy_path)
    normaliser = build_normaliser(settings, policy)
    ingest = settings.ingest
    proxies = sorted({_canonical_network(text) for text in ingest.trusted_proxies})
    nat64 = [_canonical_network(text) for text in ingest.nat64_prefixes]  # order counts
    return {
        "normalisation": NORMALISATION,
        "digest_key": normaliser.digester.account("-", _PROBE),
        "case_sensitive_tenants": ",".join(sorted(normaliser.case_sensitive_tenants)),
        "trusted_proxies": ",".join(proxies),
        "ipv4_prefix": str(ingest.ipv4_prefix),
        "ipv6_prefix": str(ingest.ipv6_prefix),
        "nat64_prefixes": ",".join(nat64),
        # The edge answers [verify] itself, from its copy of the policy (issue 44).
        "verify": _verify_modes(policy),
    }


def _verify_modes(policy: Policy) -> str:
    """``*=<the defaults' mode>`` and ``tenant=<mode>`` for each tenant that differs."""
    default = policy.defaults.verify.mode
    tenants = sorted(
        f"{name}={rules.verify.mode}"
        for name, rules in policy.tenants.items()
        if rules.verify.mode != default
    )
    return ",".join([f"*={default}", *tenants])


def encode_fingerprint(decisions_topic: str, parts: Mapping[str, str]) -> bytes:
    return orjson.dumps({"v": 1, "decisions_topic": decisions_topic, "parts": dict(parts)})


def decode_fingerprint(raw: bytes | None) -> dict[str, str] | None:
    """The parts of a fingerprint record; None for anything else (logged by the caller)."""
    try:
        body = orjson.loads(raw or b"")
    except orjson.JSONDecodeError:
        return None
    parts = body.get("parts") if isinstance(body, dict) else None
    if not isinstance(parts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in parts.items()
    ):
        return None
    return parts


def _listed(values: set[str]) -> str:
    if not values:
        return "none"
    return ", ".join(sorted(values)[:5]) + (" …" if len(values) > 5 else "")


def differences(worker: Mapping[str, str], here: Mapping[str, str]) -> list[str]:
    """What differs between the worker's parts and this component's, in words."""
    out: list[str] = []
    for name in sorted(set(worker) | set(here)):
        theirs, ours = worker.get(name, _ABSENT.get(name)), here.get(name, _ABSENT.get(name))
        if theirs == ours:
            continue
        label = _LABELS.get(name, name)
        a = {v for v in (theirs or "").split(",") if v}
        b = {v for v in (ours or "").split(",") if v}
        if name == "digest_key":
            out.append(f"{label} differs")
        elif name in _LISTS and a != b:
            out.append(f"{label}: only the worker has {_listed(a - b)}, only here {_listed(b - a)}")
        elif name in _ORDERED:
            out.append(f"{label} ({_ORDERED[name]}): the worker has {theirs}, here {ours}")
        else:
            out.append(f"{label}: the worker has {theirs}, here {ours}")
    return out


def mismatch(worker: Mapping[str, str] | None, here: Mapping[str, str], who: str) -> str | None:
    """One line saying how ``who``'s normalisation differs from the worker's; None when it
    does not (or there is no worker fingerprint to compare with)."""
    if worker is None:
        return None
    diffs = differences(worker, here)
    if not diffs:
        return None
    version = worker.get("normalisation") != here.get("normalisation")
    advice = [_VERSION_ADVICE] if version else []
    if len(diffs) > int(version):
        advice.append(_SETTINGS_ADVICE)
    return (
        f"the worker's normalisation differs from this {who}'s: {'; '.join(diffs)}; "
        + " and ".join(advice)
    )


# -- the broker -----------------------------------------------------------------------


async def publish_fingerprint(settings: Settings, policy: Policy | None = None) -> None:
    """Create the fingerprint topic if needed and publish this worker's fingerprint;
    raises FingerprintError."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    from pipeline.kafka_admin import TopicSpec, ensure_topics, wait_for_broker
    from pipeline.kafka_client import producer_kwargs, security_kwargs

    kafka = settings.kafka
    topic = fingerprint_topic(kafka.decisions_topic)
    value = encode_fingerprint(kafka.decisions_topic, fingerprint(settings, policy))
    security = security_kwargs(kafka)
    try:
        await wait_for_broker(kafka.bootstrap_servers, TIMEOUT_S, security=security)
        await ensure_topics(
            kafka.bootstrap_servers,
            [TopicSpec(topic, 1, TOPIC_CONFIG)],
            replication_factor=kafka.replication_factor,
            security=security,
        )
        producer = AIOKafkaProducer(**producer_kwargs(kafka))
        try:
            async with asyncio.timeout(TIMEOUT_S):
                await producer.start()
                await producer.send_and_wait(topic, value, key=kafka.decisions_topic.encode())
        finally:
            await producer.stop()
    except (AuthpipeError, KafkaError, OSError, TimeoutError) as exc:
        raise FingerprintError(
            f"could not publish the normalisation fingerprint to {topic}: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    log.info("normalisation_fingerprint_published", topic=topic)


async def read_fingerprint(
    bootstrap: str, decisions_topic: str, security: Mapping[str, Any] | None = None
) -> dict[str, str] | None:
    """The latest fingerprint the workers of ``decisions_topic`` published; None when there
    is none (no topic, no record, unreadable: logged). ``security``:
    ``pipeline.kafka_client.security_kwargs``."""
    from aiokafka.errors import KafkaError

    from pipeline.sim.topics import read_topic

    topic = fingerprint_topic(decisions_topic)
    try:
        read = await read_topic(bootstrap, topic, TIMEOUT_S, dict(security or {}))
    except (AuthpipeError, KafkaError, OSError, TimeoutError) as exc:
        log.warning("normalisation_fingerprint_unread", topic=topic, error=str(exc)[:200])
        return None
    return latest(read.records, decisions_topic)


def latest(
    records: list[tuple[bytes | None, bytes | None]], decisions_topic: str
) -> dict[str, str] | None:
    """The parts of the last fingerprint record for ``decisions_topic`` in ``records``."""
    key = decisions_topic.encode()
    values = [value for k, value in records if k == key]
    if not values:
        return None
    parts = decode_fingerprint(values[-1])
    if parts is None:
        log.warning("normalisation_fingerprint_bad", decisions_topic=decisions_topic)
    return parts
