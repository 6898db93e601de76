"""The faust app is built from settings: bind address and port reach faust's web server."""

from __future__ import annotations

from pipeline.core.policy import DEFAULT_POLICY
from pipeline.settings import Settings, WorkerSettings
from pipeline.stream.app import Worker


def test_worker_web_host_and_port_reach_faust() -> None:
    """worker.web_host and worker.web_port become faust's web_bind/web_host and web_port."""
    settings = Settings(worker=WorkerSettings(web_host="0.0.0.0", web_port=7077))
    conf = Worker(settings, DEFAULT_POLICY).app.conf
    assert (conf.web_bind, conf.web_host, conf.web_port) == ("0.0.0.0", "0.0.0.0", 7077)


def test_tune_gc_sets_the_worker_thresholds_and_returns_the_old_ones() -> None:
    """tune_gc() installs GC_THRESHOLDS and hands back what was in force, to restore."""
    import gc

    from pipeline.runtime import GC_THRESHOLDS, tune_gc

    before = gc.get_threshold()
    try:
        assert tune_gc() == before
        assert gc.get_threshold() == GC_THRESHOLDS == (50_000, 20, 100)
    finally:
        gc.set_threshold(*before)


def test_worker_web_binds_loopback_and_serves_no_faust_pages() -> None:
    """By default the web server binds 127.0.0.1, and faust's router, table, stats, graph and
    performance pages are off (they expose internal state without auth)."""
    worker = Worker(Settings(), DEFAULT_POLICY)
    conf = worker.app.conf
    assert conf.web_bind == "127.0.0.1"
    assert (
        conf.web_router_enabled,
        conf.web_tables_enabled,
        conf.web_stats_enabled,
        conf.web_graph_enabled,
        conf.web_metrics_enabled,
    ) == (False,) * 5
    mounted = sorted(prefix for prefix, _ in worker.app.web.blueprints._enabled)
    assert mounted == [""]  # faust's production index: {"status": "OK"} at /


async def test_stage_fetch_wait_reaches_the_consumer_faust_builds() -> None:
    """worker.stage_fetch_wait_ms replaces faust's fixed 1,500 ms fetch wait on the
    aiokafka consumer of the stages (the one faust's consumer thread creates)."""
    settings = Settings(worker=WorkerSettings(stage_fetch_wait_ms=35))
    app = Worker(settings, DEFAULT_POLICY).app
    consumer = app.consumer._thread._create_worker_consumer(app.transport)
    try:
        assert consumer._fetch_max_wait_ms == 35
    finally:
        await consumer.stop()
