"""bench.b8_familiar's check variant: the known users' records answer as their kind, over
the view and over HTTP, with generated records beside them."""

from __future__ import annotations

from bench.b8_familiar import KINDS, WorkerExempts, _edge_view, bench_check, known_records


def test_known_records_are_the_worker_encoding_of_each_kind() -> None:
    """Of 20 users, 16 familiar and 2 at a new place have a record (the unknown 2 none),
    each the worker's own encoding of its key in tenant default."""
    maker = WorkerExempts(tenant="default")
    keys, values = known_records(_edge_view(), maker, 20)
    assert len(keys) == 18 == sum(kind != "unknown" for kind in KINDS * 2)
    assert all(key is not None and key.startswith(b"familiar|default|") for key in keys)
    maker.check(keys, values)


def test_check_answers_by_kind_in_process_and_over_http() -> None:
    """3,000 records (2,250 known, 750 generated): the warm and first-sight checks are
    timed for each kind (asserted familiar or step_up inside), the fast path's bodies say
    so, and one short HTTP round at 200 requests/s answers every request, each request
    (and each of the 500 warm-up requests) asking for a different known user."""
    result = bench_check(3_000, known=2_500, rates=(200,), rounds=1, duration_s=0.5, calls=2_000)
    assert (result["records"], result["known_records"], result["generated_records"]) == (
        3_000,
        2_250,
        750,
    )
    assert result["check_first_sight"] == {}  # all 2,500 known users are the warm set
    warm = result["check_warm"]
    assert (warm["users"], warm["calls"]) == (2_500, 12_500)
    assert (warm["familiar"]["calls"], warm["new_place"]["calls"], warm["unknown"]["calls"]) == (
        10_000,
        1_250,
        1_250,
    )
    assert result["http_bodies"]["familiar"] == (
        '{"allowed":true,"retry_after_ms":0,"challenge":null,"step_up":false}'
    )
    assert '"challenge":"step_up"' in result["http_bodies"]["unknown"]
    http = result["http"]["200"]
    assert (http["http_requests"], http["http_errors"], http["http_distinct_users"]) == (
        100,
        0,
        600,
    )
