"""``authpipe decisions add|list|remove|unlock``: the operator's block-list (seed 001's
"manual blacklist") and the operator's lift of a rule's lock.

An operator's decision is an ordinary decision on the decisions topic (rule ``manual``,
action ``block``, with ``operator`` and ``reason``), so the edge enforces it, the nginx
feed serves it (sources) and the audit sink writes it to ClickHouse like any other. Its
key has ``manual`` in the device slot (``source|t|-|<source>|manual``,
``account|t|<digest>|-|manual``): the rules never write those keys, so a rule's tombstone
cannot lift an operator's block and ``decisions remove`` cannot lift a rule's.

* a source is one group of the ingest settings (``pipeline.core.grouping``): a wider
  prefix is refused, an address is stored as the group the pipeline gives its attempts;
* an account is digested by the same normaliser as ingest (no plain identifier is ever
  published);
* ``list`` and ``remove`` read the compacted topic to its end (no consumer group);
* every connection takes the shared client options (``pipeline.kafka_client``: TLS and
  SASL), so an operator connects as its own principal (docs/security.md's ``authpipe-operator``
  row: read and write the decisions topic, read its normalisation fingerprint).

``unlock`` lifts what the rules hold on an account (seed 002's lock, the lifetime bound,
the mfa bound, the device bound: a rule's tombstone is the worker's to write, or the next
event would contradict it): it publishes to the attempts topic (the tenant's own topic when
``ingest.tenant_topics`` binds it) one ``login_attempt`` with ``flow = "reset"``, outcome
success, from ``127.0.0.1``, which the account stage treats like the owner's reset through
the mailbox (``AccountShard._reset``), so it goes through the real worker and is audited
in auth.audit like every attempt: its ``service`` says ``authpipe-unlock``, who and why.

``list`` prints only printable characters of what the topic holds (``printable``): a
decision's free text never reaches the terminal as an escape sequence.

Exit codes: 0 done, 1 a runtime problem (one line: broker unreachable, no such id),
2 bad flags (argparse).
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.contracts.codec import DecodeError, decision_model, decode_decision, encode
from pipeline.contracts.models import (
    TENANT_RULE,
    Decision,
    LoginAttempt,
    datetime_to_ms,
    format_utc_ms,
    ms_to_datetime,
    valid_tenant,
)
from pipeline.core.decision_keys import MANUAL
from pipeline.core.errors import InvalidAttempt
from pipeline.core.grouping import check_block_source, within_grouping
from pipeline.core.keys import decision_key, format_key, parse_wire_key, stable_id
from pipeline.core.policy_rules import MAX_BLOCK_MS
from pipeline.errors import AuthpipeError
from pipeline.wiring import build_normaliser, grouping_check

if TYPE_CHECKING:
    from pipeline.core.attempt import Normaliser
    from pipeline.settings import Settings

RULE = "manual"
UNLOCK_SERVICE = "authpipe-unlock"
UNLOCK_PEER = "127.0.0.1"
"""The ``peer_ip`` of an operator's unlock (the account becomes familiar there, nowhere
a stranger signs in from)."""
TIMEOUT_S = 30.0
_TTL = re.compile(r"([1-9][0-9]{0,8})(s|m|h|d)")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class ManualError(AuthpipeError):
    """A runtime problem of ``authpipe decisions`` (broker, topic, unknown id)."""


def parse_ttl(text: str) -> int:
    """``90s``, ``30m``, ``1h``, ``7d`` in milliseconds, 1 s to 366 days; ValueError otherwise."""
    match = _TTL.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration; write it like 90s, 30m, 1h or 7d")
    ms = int(match.group(1)) * _UNIT_MS[match.group(2)]
    if ms > MAX_BLOCK_MS:
        raise ValueError(f"{text} is longer than 366 days")
    return ms


def check_tenant(text: str) -> str:
    """``text`` if the one tenant validator (``contracts.models.valid_tenant``) passes it;
    ValueError otherwise (what ingest would dead-letter can never be blocked)."""
    if not valid_tenant(text):
        raise ValueError(f"{text[:70]!r}: {TENANT_RULE}")
    return text


def default_operator() -> str:
    """Who is deciding: ``$USER``, else the login name."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@dataclass(frozen=True, slots=True)
class Target:
    """What to block: exactly one of ``source`` (CIDR text) or ``account`` (as typed)."""

    tenant: str
    source: str | None = None
    account: str | None = None


def manual_decision(
    target: Target,
    normaliser: Normaliser,
    *,
    ttl_ms: int,
    reason: str,
    operator: str,
    now_ms: int,
) -> Decision:
    """The operator's block as a decision. Raises ValueError for a source wider than the
    grouping, an account that is blank after normalisation or a tenant the one tenant
    validator refuses."""
    check_tenant(target.tenant)
    rules = normaliser.sources
    source = digest = None
    if target.source is not None:
        source = check_block_source(
            target.source, rules.ipv4_prefix, rules.ipv6_prefix, rules.nat64_prefixes
        )
        key = format_key(decision_key("source", target.tenant, None, source, MANUAL))
    else:
        assert target.account is not None
        try:
            digest = normaliser.account_digest(target.tenant, target.account)
        except InvalidAttempt:
            raise ValueError("the account is blank after normalisation") from None
        key = format_key(decision_key("account", target.tenant, digest, None, MANUAL))
    expires_ms = now_ms + ttl_ms
    return Decision(
        decision_id=stable_id(key, now_ms, expires_ms, RULE, operator),
        key=key,
        tenant=target.tenant,
        scope="source" if source is not None else "account",
        account_digest=digest,
        source=source,
        device_id=MANUAL,
        applies_to="all",
        action="block",
        rule=RULE,
        count=0,
        threshold=0,
        window_ms=ttl_ms,
        issued_at=ms_to_datetime(now_ms),
        expires_at=ms_to_datetime(expires_ms),
        policy_version=RULE,
        operator=operator,
        reason=reason,
    )


def active_decisions(
    records: list[tuple[bytes | None, bytes | None]],
    now_ms: int,
    source_ok: Callable[[str], bool] = within_grouping,
) -> list[Decision]:
    """The decisions a compacted topic holds now: the latest value per Kafka key, not a
    tombstone, not expired, in key order. Each value is paired with the key it was
    published under: a value whose own ``key`` differs (``key_mismatch``), a key that is
    not a decision key with a valid tenant (``parse_wire_key``) and records that are not
    decisions are skipped, so what ``remove`` lifts is always the key that holds it."""
    latest: dict[bytes, bytes | None] = {}
    for key, value in records:
        if key:
            latest[key] = value
    out: list[Decision] = []
    for key in sorted(latest):
        value = latest[key]
        if value is None:
            continue
        try:
            text = key.decode("utf-8")
            parse_wire_key(text)
            decision = decision_model(decode_decision(value, source_ok=source_ok, key=text))
        except (UnicodeDecodeError, ValueError, DecodeError):
            continue
        if datetime_to_ms(decision.expires_at) > now_ms:
            out.append(decision)
    return out


def printable(text: str) -> str:
    """``text`` without the characters a terminal could act on (control characters,
    escape sequences' introducers, bidirectional overrides: ``str.isprintable``)."""
    return "".join(ch for ch in text if ch.isprintable())


def render(decisions: list[Decision], *, manual_only: bool) -> str:
    """The table ``decisions list`` prints; every field read from the topic goes
    through ``printable``."""
    rows = [d for d in decisions if d.rule == RULE or not manual_only]
    if not rows:
        return "no active operator decisions" if manual_only else "no active decisions"
    lines = [f"{'id':<32}  {'tenant':<10} {'subject':<44} {'rule':<14} {'expires':<24} by / reason"]
    for d in rows:
        subject = f"source {d.source}" if d.source else f"account {d.account_digest}"
        expires = format_utc_ms(d.expires_at)
        who = f"{d.operator}: {d.reason}" if d.rule == RULE else d.action
        cells = [printable(text) for text in (d.decision_id, d.tenant, subject, d.rule, who)]
        ident, tenant, subject, rule, who = cells
        lines.append(f"{ident:<32}  {tenant:<10} {subject:<44} {rule:<14} {expires:<24} {who}")
    return "\n".join(lines)


def unlock_attempt(
    tenant: str, account: str, *, operator: str, reason: str, now_ms: int
) -> LoginAttempt:
    """The operator's unlock of ``account`` as the attempt the worker reads: a reset
    proven, as the owner's through the mailbox would be (``flow = "reset"``, success).
    Raises ValueError for a tenant the one tenant validator refuses or a blank account."""
    check_tenant(tenant)
    if not account.strip():
        raise ValueError("the account is blank")
    event_id = "unlock-" + stable_id(tenant, account, now_ms, operator, reason)
    service = printable(f"{UNLOCK_SERVICE} by {operator}: {reason}")[:128]
    return LoginAttempt(
        event_id=event_id,
        occurred_at=ms_to_datetime(now_ms),
        tenant=tenant,
        service=service,
        flow="reset",
        account=account,
        peer_ip=UNLOCK_PEER,
        outcome="success",
        user_agent=service,
    )


def attempts_topic(settings: Settings, tenant: str) -> str:
    """Where ingest reads ``tenant``'s attempts: its own topic when one is bound to it."""
    for topic, bound in settings.ingest.tenant_topics.items():
        if bound == tenant:
            return topic
    return settings.kafka.input_topic


# -- the broker ------------------------------------------------------------------------


async def _read(settings: Settings) -> list[tuple[bytes | None, bytes | None]]:
    from aiokafka.errors import KafkaError

    from pipeline.kafka_client import security_kwargs
    from pipeline.sim.topics import read_topic

    kafka = settings.kafka
    try:
        read = await read_topic(
            kafka.bootstrap_servers, kafka.decisions_topic, TIMEOUT_S, security_kwargs(kafka)
        )
        return read.records
    except AuthpipeError as exc:
        raise ManualError(str(exc)) from None
    except (KafkaError, OSError, TimeoutError) as exc:
        raise ManualError(
            f"could not read {kafka.decisions_topic} at {kafka.bootstrap_servers}: "
            f"{type(exc).__name__} (is the broker up? authpipe stack status; on a secured "
            "cluster, does kafka.sasl_username hold the operator's ACLs? docs/security.md)"
        ) from None


async def _publish(
    settings: Settings, key: str, value: bytes | None, topic: str | None = None
) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    from pipeline.kafka_client import producer_kwargs

    topic = topic or settings.kafka.decisions_topic
    producer = AIOKafkaProducer(
        **producer_kwargs(settings.kafka),
        request_timeout_ms=int(TIMEOUT_S * 1000),
    )
    try:
        async with asyncio.timeout(TIMEOUT_S):
            await producer.start()
            await producer.send_and_wait(topic, value, key=key.encode())
    except (KafkaError, TimeoutError, OSError) as exc:
        raise ManualError(
            f"could not publish to {topic} at "
            f"{settings.kafka.bootstrap_servers}: {type(exc).__name__} "
            "(is the broker up? authpipe stack status; on a secured cluster, does "
            "kafka.sasl_username hold the operator's ACLs? docs/security.md)"
        ) from None
    finally:
        await producer.stop()


async def _check_normalisation(settings: Settings) -> None:
    """Raise ManualError when the worker's normalisation fingerprint differs from this
    command's (``pipeline.fingerprint``): its digests or sources would never match."""
    from pipeline.fingerprint import fingerprint, mismatch, read_fingerprint
    from pipeline.kafka_client import security_kwargs

    kafka = settings.kafka
    worker = await read_fingerprint(
        kafka.bootstrap_servers, kafka.decisions_topic, security_kwargs(kafka)
    )
    line = mismatch(worker, fingerprint(settings), "command")
    if line is not None:
        raise ManualError(f"{line}; nothing was published")


async def _add(settings: Settings, decision: Decision) -> None:
    await _check_normalisation(settings)
    await _publish(settings, decision.key, encode(decision))


def add(settings: Settings, target: Target, *, ttl_ms: int, reason: str, operator: str) -> Decision:
    decision = manual_decision(
        target,
        build_normaliser(settings),
        ttl_ms=ttl_ms,
        reason=reason,
        operator=operator,
        now_ms=time.time_ns() // 1_000_000,
    )
    asyncio.run(_add(settings, decision))
    return decision


def remove(settings: Settings, decision_id: str) -> Decision:
    """Lift an active operator decision by id (a tombstone on its key)."""
    now_ms = time.time_ns() // 1_000_000
    active = active_decisions(asyncio.run(_read(settings)), now_ms, grouping_check(settings))
    found = [d for d in active if d.decision_id == decision_id]
    if not found:
        raise ManualError(f"no active decision has id {decision_id}; see authpipe decisions list")
    decision = found[0]
    if decision.rule != RULE or parse_wire_key(decision.key)[4] != MANUAL:
        raise ManualError(
            f"decision {decision_id} was issued by rule {decision.rule}, not by an operator; "
            "it ends at its expiry (tune the policy or its allowlist to change that)"
        )
    asyncio.run(_publish(settings, decision.key, None))
    return decision


def unlock(
    settings: Settings, tenant: str, account: str, *, operator: str, reason: str
) -> tuple[LoginAttempt, str]:
    """Publish the operator's unlock of ``account``; returns it and the topic."""
    attempt = unlock_attempt(
        tenant, account, operator=operator, reason=reason, now_ms=time.time_ns() // 1_000_000
    )
    topic = attempts_topic(settings, tenant)
    asyncio.run(_publish(settings, account, encode(attempt), topic))
    return attempt, topic


def run_decisions_command(
    settings: Settings,
    action: str,
    *,
    target: Target | None = None,
    ttl_ms: int = 0,
    reason: str = "",
    operator: str = "",
    decision_id: str = "",
    show_all: bool = False,
) -> int:
    """The CLI's handler: prints what was done; ManualError/ValueError exit 1 with one
    line (aiokafka's own error logging is silenced: the line says it all)."""
    for name in ("aiokafka", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        if action == "add":
            assert target is not None
            d = add(settings, target, ttl_ms=ttl_ms, reason=reason, operator=operator)
            subject = f"source {d.source}" if d.source else f"account {d.account_digest}"
            print(
                f"added {d.decision_id}: block {subject} in tenant {d.tenant} until "
                f"{format_utc_ms(d.expires_at)} (by {operator}: {reason})"
            )
        elif action == "unlock":
            assert target is not None and target.account is not None
            attempt, topic = unlock(
                settings, target.tenant, target.account, operator=operator, reason=reason
            )
            print(
                f"published {attempt.event_id} to {topic}: the worker lifts the lock, the "
                f"lifetime, mfa and device bounds of the account in tenant {target.tenant} "
                f"(by {operator}: {reason}; audited in {settings.kafka.audit_topic})"
            )
        elif action == "list":
            now_ms = time.time_ns() // 1_000_000
            print(
                render(
                    active_decisions(
                        asyncio.run(_read(settings)), now_ms, grouping_check(settings)
                    ),
                    manual_only=not show_all,
                )
            )
        else:
            d = remove(settings, decision_id)
            print(f"removed {d.decision_id} ({d.key})")
    except (ManualError, ValueError) as exc:
        print(f"authpipe decisions {action}: {exc}", file=sys.stderr)
        return 1
    return 0
