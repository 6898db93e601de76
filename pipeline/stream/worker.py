"""``authpipe worker``: create the topics, then run the faust worker until stopped."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace

from pipeline.kafka_admin import ensure_topics, wait_for_broker
from pipeline.kafka_client import security_kwargs
from pipeline.logs import get_logger, stdlib_logging_config
from pipeline.runtime import tune_allocator, tune_gc
from pipeline.settings import Settings
from pipeline.topics import Topics
from pipeline.wiring import load_policy

log = get_logger("worker")


async def prepare_topics(settings: Settings, timeout_s: float = 30.0) -> None:
    kafka = settings.kafka
    security = security_kwargs(kafka)
    await wait_for_broker(kafka.bootstrap_servers, timeout_s, security=security)
    specs = Topics.from_settings(kafka).specs(kafka.partitions)
    # Tenant topics (ingest.tenant_topics) are input topics: the input's partitions and configs.
    specs += [
        replace(spec, name=topic)
        for spec in specs
        if spec.name == kafka.input_topic
        for topic in sorted(settings.ingest.tenant_topics)
    ]
    await ensure_topics(
        kafka.bootstrap_servers,
        specs,
        replication_factor=kafka.replication_factor,
        security=security,
    )


def run_worker(settings: Settings) -> int:
    """Run the stream processors in the foreground; returns the exit code."""
    from faust import Worker as FaustWorker

    from pipeline.stream.app import Worker

    policy = load_policy(settings.policy_path)
    tune_gc()
    allocator = tune_allocator()  # before faust starts its threads
    asyncio.run(prepare_topics(settings))
    (settings.state_dir / "faust").mkdir(parents=True, exist_ok=True)
    worker = Worker(settings, policy)
    worker.metrics.watch_gc()
    log.info(
        "worker_starting",
        policy_version=policy.policy_version,
        allocator=allocator,
        partitions=settings.kafka.partitions,
        web_port=settings.worker.web_port,
    )
    faust_worker = FaustWorker(
        worker.app,
        loglevel="WARNING",
        quiet=True,
        redirect_stdouts=False,
        logging_config=stdlib_logging_config(settings.log.level, settings.log.format),
    )
    if not sys.stdout.isatty():
        # faust's startup spinner writes cursor escape codes even into a log file.
        faust_worker.spinner = None
    faust_worker.execute_from_commandline()
    return 0
