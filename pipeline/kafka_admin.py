"""Small async helpers around aiokafka's admin client: wait for a broker, ensure topics.

``ensure_topics`` is idempotent: missing topics are created with their configs; an
existing topic is left as it is, unless it has fewer partitions than asked for, which
is an error (keys would hash to other partitions than the code expects).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from pipeline.errors import AuthpipeError
from pipeline.logs import get_logger

log = get_logger("kafka_admin")

_POLL_INTERVAL_S = 0.25
_ADMIN_TRIES = 12
_NO_ERROR = 0


class KafkaAdminError(AuthpipeError):
    """A topic could not be created or does not match what the code needs."""


class BrokerUnavailableError(KafkaAdminError):
    """No broker answered a metadata request in time."""


class TopicMismatchError(KafkaAdminError):
    """An existing topic has fewer partitions than its spec asks for."""


@dataclass(frozen=True)
class TopicSpec:
    """What a topic must look like: name, partition count and topic-level configs."""

    name: str
    partitions: int
    configs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise KafkaAdminError(
                f"topic {self.name!r}: partitions={self.partitions}; ask for at least 1"
            )


_PLAIN: Mapping[str, Any] = MappingProxyType({})
T = TypeVar("T")


async def _retrying(call: Callable[[], Awaitable[T]], tries: int = _ADMIN_TRIES) -> T:
    """``call()``, asked again after a retriable error (a broker of a cluster that just died
    is still in the metadata until the cluster fences it, and the admin client picks a
    random known broker), at most ``tries`` times."""
    for attempt in range(tries):
        try:
            return await call()
        except KafkaError as exc:
            if not exc.retriable or attempt == tries - 1:
                raise
            await asyncio.sleep(_POLL_INTERVAL_S)
    raise AssertionError("unreachable")  # pragma: no cover


def _admin(
    bootstrap: str, request_timeout_ms: int, security: Mapping[str, Any]
) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="authpipe-admin",
        request_timeout_ms=request_timeout_ms,
        **security,
    )


async def _broker_count(
    bootstrap: str, request_timeout_ms: int, security: Mapping[str, Any]
) -> int:
    admin = _admin(bootstrap, request_timeout_ms, security)
    try:
        await admin.start()
        cluster: dict[str, Any] = await admin.describe_cluster()
        return len(cluster.get("brokers") or [])
    finally:
        await admin.close()


async def wait_for_broker(
    bootstrap: str, timeout_s: float, *, security: Mapping[str, Any] = _PLAIN
) -> None:
    """Return once a broker at ``bootstrap`` answers a metadata request listing a broker.

    ``security`` is ``pipeline.kafka_client.security_kwargs`` (TLS/SASL). Raises
    BrokerUnavailableError after ``timeout_s`` seconds with the last failure.
    """
    deadline = time.monotonic() + timeout_s
    last_problem = "no answer yet"
    while True:
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            hint = (
                "check kafka.security_protocol and the SASL user and password or TLS files "
                "(a refused login is logged by aiokafka just above)"
                if security
                else "start one with `authpipe stack up` or fix AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS"
            )
            raise BrokerUnavailableError(
                f"no Kafka broker answered at {bootstrap} within {timeout_s:.0f}s "
                f"(last problem: {last_problem}); {hint}"
            )
        request_timeout_ms = max(500, int(min(remaining_s, 5.0) * 1000))
        try:
            async with asyncio.timeout(max(remaining_s, 0.5)):
                brokers = await _broker_count(bootstrap, request_timeout_ms, security)
            if brokers > 0:
                return
            last_problem = "metadata listed no broker yet"
        except (KafkaError, OSError, TimeoutError) as exc:
            last_problem = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(min(_POLL_INTERVAL_S, max(deadline - time.monotonic(), 0.0)))


def _topic_partitions(described: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Partition counts of the topics that exist, from a metadata ``describe_topics``."""
    return {
        str(topic["topic"]): len(topic.get("partitions") or [])
        for topic in described
        if topic.get("error_code", _NO_ERROR) == _NO_ERROR
    }


def _check_partitions(specs: Sequence[TopicSpec], existing: Mapping[str, int]) -> None:
    for spec in specs:
        have = existing.get(spec.name)
        if have is not None and have < spec.partitions:
            raise TopicMismatchError(
                f"topic {spec.name!r} exists with {have} partitions but {spec.partitions} "
                "are needed; add partitions (kafka-topics --alter --partitions) or delete "
                "the topic on a dev broker"
            )


def _leaderless(names: Sequence[str], described: Sequence[Mapping[str, Any]]) -> list[str]:
    """The topics of ``names`` that metadata does not list yet with a leader per partition."""
    ready = {
        str(topic["topic"])
        for topic in described
        if topic.get("error_code", _NO_ERROR) == _NO_ERROR
        and topic.get("partitions")
        and all(p.get("leader", -1) >= 0 for p in topic["partitions"])
    }
    return [name for name in names if name not in ready]


async def _wait_for_leaders(
    admin: AIOKafkaAdminClient, names: Sequence[str], timeout_ms: int
) -> None:
    """Wait until new topics have leaders in the broker's metadata. A client that asks
    sooner (a broker still loading its logs answers late) caches "unknown topic" and may
    not fetch those partitions until its next metadata refresh, minutes later."""
    deadline = time.monotonic() + timeout_ms / 1000
    waiting = list(names)
    while waiting and time.monotonic() < deadline:
        waiting = _leaderless(waiting, await _retrying(admin.describe_topics))
        if waiting:
            await asyncio.sleep(_POLL_INTERVAL_S)
    if waiting:
        log.warning("kafka_topics_without_leader", topics=waiting, waited_ms=timeout_ms)


def _creation_failures(response: Any) -> list[str]:
    """Problems reported per topic by a CreateTopics response, ignoring 'already exists'."""
    problems: list[str] = []
    for entry in response.topic_errors:
        topic, code = entry[0], entry[1]
        message = entry[2] if len(entry) > 2 else None
        if code in (_NO_ERROR, TopicAlreadyExistsError.errno):
            continue
        problems.append(f"{topic}: {for_code(code).__name__} {message or ''}".strip())
    return problems


async def ensure_topics(
    bootstrap: str,
    specs: Sequence[TopicSpec],
    replication_factor: int = 1,
    request_timeout_ms: int = 30_000,
    *,
    security: Mapping[str, Any] = _PLAIN,
) -> None:
    """Create the topics of ``specs`` that do not exist yet; check the ones that do."""
    if not specs:
        return
    admin = _admin(bootstrap, request_timeout_ms, security)
    try:
        await admin.start()
        # All topics, not by name: a by-name metadata request may auto-create topics.
        existing = _topic_partitions(await _retrying(admin.describe_topics))
        _check_partitions(specs, existing)
        missing = [spec for spec in specs if spec.name not in existing]
        if missing:
            new_topics = [
                NewTopic(
                    name=spec.name,
                    num_partitions=spec.partitions,
                    replication_factor=replication_factor,
                    topic_configs=dict(spec.configs),
                )
                for spec in missing
            ]
            # A retry after a lost answer finds the topics created: TopicAlreadyExists,
            # which _creation_failures ignores.
            response = await _retrying(
                lambda: admin.create_topics(new_topics, timeout_ms=request_timeout_ms)
            )
            problems = _creation_failures(response)
            if problems:
                raise KafkaAdminError(
                    f"could not create topics at {bootstrap}: {'; '.join(problems)}; "
                    "fix the topic spec or the broker configuration"
                )
            # A topic created concurrently by someone else may have other partitions.
            _check_partitions(specs, _topic_partitions(await _retrying(admin.describe_topics)))
            await _wait_for_leaders(admin, [spec.name for spec in missing], request_timeout_ms)
        if missing:
            # One line for the lot (a worker creates about eleven at its first start).
            log.info(
                "kafka_topics_created",
                count=len(missing),
                topics=",".join(spec.name for spec in missing),
                partitions=sorted({spec.partitions for spec in missing}),
                replication_factor=replication_factor,
            )
    except KafkaError as exc:
        raise KafkaAdminError(
            f"Kafka admin request to {bootstrap} failed ({type(exc).__name__}: {exc}); "
            "check that the broker is up (`authpipe stack status`)"
        ) from exc
    finally:
        await admin.close()


@dataclass(frozen=True, order=True)
class PartitionReplicas:
    """Where one partition lives: its leader (-1: none), replicas and in-sync replicas."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


async def describe_partitions(
    bootstrap: str, request_timeout_ms: int = 10_000, *, security: Mapping[str, Any] = _PLAIN
) -> list[PartitionReplicas]:
    """Every partition of every topic the cluster at ``bootstrap`` has, from its metadata.

    A request that fails on a broker that just died is asked again (``_retrying``)."""
    admin = _admin(bootstrap, request_timeout_ms, security)
    try:
        await admin.start()
        described = await _retrying(admin.describe_topics)
    except KafkaError as exc:
        raise KafkaAdminError(
            f"could not describe the topics at {bootstrap} ({type(exc).__name__}: {exc}); "
            "check that a broker is up (`authpipe stack status`)"
        ) from exc
    finally:
        await admin.close()
    return sorted(
        PartitionReplicas(
            topic=str(topic["topic"]),
            partition=int(p["partition"]),
            leader=int(p.get("leader", -1)),
            replicas=tuple(p.get("replicas") or ()),
            isr=tuple(p.get("isr") or ()),
        )
        for topic in described
        if topic.get("error_code", _NO_ERROR) == _NO_ERROR
        for p in topic.get("partitions") or ()
    )
