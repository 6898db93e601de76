"""New topics count as ready only once metadata lists a leader for every partition."""

from __future__ import annotations

from pipeline.kafka_admin import _leaderless


def test_a_topic_is_leaderless_until_every_partition_has_a_leader() -> None:
    """Missing, erroring, partitionless or leader -1 topics are waited for; led ones are not."""
    described = [
        {
            "topic": "led",
            "error_code": 0,
            "partitions": [{"partition": 0, "leader": 1}, {"partition": 1, "leader": 1}],
        },
        {
            "topic": "half",
            "error_code": 0,
            "partitions": [{"partition": 0, "leader": 1}, {"partition": 1, "leader": -1}],
        },
        {"topic": "unknown", "error_code": 3, "partitions": []},
        {"topic": "empty", "error_code": 0, "partitions": []},
    ]
    names = ["led", "half", "unknown", "empty", "absent"]
    assert _leaderless(names, described) == ["half", "unknown", "empty", "absent"]
