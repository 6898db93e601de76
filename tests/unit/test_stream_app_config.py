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
