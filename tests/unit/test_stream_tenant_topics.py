"""Tenant topics (issue 26 item 9): an event on a tenant's own input topic must name that
tenant, a bound tenant's event on any other topic is refused (``tenant_not_allowed``, no
tenant-cap slot taken), other tenants on the input topic are as before; each input topic's
partitions have stable slots of their own."""

from __future__ import annotations

import pytest

from pipeline.errors import ConfigError
from pipeline.settings import IngestSettings
from pipeline.stream.ingest import Ingest, Record, input_slot_base, input_slots
from pipeline.wiring import build_normaliser
from tests.unit.test_edge_support import SETTINGS
from tests.unit.test_stream_tenant_cap import NOW_MS, _record

INPUT, ACME, GLOBEX = "auth.login-attempts", "in.acme", "in.globex"


def confined(max_tenants: int = 1000) -> Ingest:
    return Ingest(
        normaliser=build_normaliser(SETTINGS),
        partitions=4,
        max_tenants=max_tenants,
        input_topic=INPUT,
        tenant_topics={ACME: "acme", GLOBEX: "globex"},
    )


def on(topic: str, partition: int, offset: int, tenant: str) -> Record:
    record = _record(offset, tenant=tenant)
    return Record(topic, partition, offset, None, record.value)


def test_each_topic_takes_only_its_tenant_and_bound_tenants_only_their_topics() -> None:
    """acme on in.acme and shop on the input topic are rows; globex on in.acme and acme on
    the input topic are dead-lettered tenant_not_allowed."""
    ingest = confined()
    records = [
        on(ACME, 2, 0, "acme"),
        on(ACME, 2, 1, "globex"),
        on(INPUT, 1, 0, "acme"),
        on(INPUT, 1, 1, "shop"),
    ]
    result = ingest.process(records, NOW_MS)
    assert [(d.record.topic, d.record.offset, d.reason) for d in result.dead] == [
        (ACME, 1, "tenant_not_allowed"),
        (INPUT, 0, "tenant_not_allowed"),
    ]
    assert "is bound to tenant acme" in result.dead[0].detail
    slots = sorted((row[0], row[1]) for rows in result.rows.values() for row in rows)
    assert slots == [(1, 1), (input_slot_base(ACME) + 2, 0)]
    assert ingest.admitted == {"acme", "shop"}


def test_a_refused_tenant_takes_no_tenant_cap_slot() -> None:
    """With max_tenants=1, globex forged into in.acme is refused and acme still admitted."""
    ingest = confined(max_tenants=1)
    result = ingest.process([on(ACME, 0, 0, "globex"), on(ACME, 0, 1, "acme")], NOW_MS)
    assert [d.reason for d in result.dead] == ["tenant_not_allowed"]
    assert (result.valid, ingest.admitted) == (1, {"acme"})


def test_without_tenant_topics_nothing_changes() -> None:
    """No tenant topics: any tenant on the input topic, slots are the partitions."""
    ingest = Ingest(normaliser=build_normaliser(SETTINGS), partitions=4)
    result = ingest.process([on(INPUT, 3, 7, "acme")], NOW_MS)
    assert (result.dead, [row[0] for rows in result.rows.values() for row in rows]) == ([], [3])
    assert ingest.input_topics == [INPUT]


def test_slots_are_stable_per_name_and_counted_over_every_input_topic() -> None:
    """A topic's base depends on its name only; input_count sums every input topic."""
    assert input_slot_base(ACME) == input_slot_base(ACME) == input_slots(INPUT, [ACME])[ACME]
    assert input_slots(INPUT, [ACME, GLOBEX])[ACME] == input_slots(INPUT, [ACME])[ACME]
    assert input_slot_base(ACME) % 1024 == 0 and input_slot_base(ACME) >= 1024
    counts = {INPUT: {0, 1, 2, 3}, ACME: {0, 1}, GLOBEX: None}
    assert confined().input_count(counts.get, 4) == 4 + 2 + 4


def test_binding_the_input_topic_or_two_topics_on_one_slot_is_a_config_error() -> None:
    """The input topic cannot be bound; two names on one base are refused with both named."""
    with pytest.raises(ConfigError, match=r"which is kafka\.input_topic"):
        input_slots(INPUT, [INPUT])
    seen: dict[int, str] = {}
    for i in range(2000):  # 2,000 names over 1,023 bases: a clash is certain
        name = f"t{i}"
        if (base := input_slot_base(name)) in seen:
            clash = (seen[base], name)
            break
        seen[base] = name
    with pytest.raises(ConfigError, match=f"{clash[0]} and {clash[1]} share input slots"):
        input_slots(INPUT, list(clash))


def test_settings_refuse_a_bad_tenant_or_topic_name() -> None:
    """ingest.tenant_topics takes only valid tenants and Kafka topic names."""
    assert IngestSettings(tenant_topics={ACME: "acme"}).tenant_topics == {ACME: "acme"}
    with pytest.raises(ValueError, match="Acme"):
        IngestSettings(tenant_topics={ACME: "Acme"})
    with pytest.raises(ValueError, match="not a Kafka topic name"):
        IngestSettings(tenant_topics={"in acme": "acme"})
