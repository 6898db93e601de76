"""The edge service's Prometheus metrics, on their own registry: counters the handlers
and the fast path bump, and gauges read from the view and its feed at scrape time."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pipeline.edge.health import Health
from pipeline.edge.http_input import CHECK_FIELDS, FEED_FIELDS, SESSION_FIELDS
from pipeline.edge.view import DecisionView


class _ViewCollector:
    """Gauges and counters read from the view and the feed at scrape time."""

    def __init__(self, view: DecisionView, health: Health) -> None:
        self.view = view
        self.health = health

    def collect(self) -> Any:
        health = self.health
        yield GaugeMetricFamily(
            "authpipe_edge_ready", "1 once caught up", value=int(health.ready())
        )
        yield GaugeMetricFamily(
            "authpipe_edge_lag_messages", "messages not applied yet", value=health.lag_messages()
        )
        staleness = health.staleness_ms()
        yield GaugeMetricFamily(
            "authpipe_edge_staleness_seconds",
            "seconds since the broker last answered a fetch of every partition (-1: never)",
            value=-1.0 if staleness is None else staleness / 1000,
        )
        active = GaugeMetricFamily(
            "authpipe_edge_active_decisions", "unexpired decisions", labels=["scope", "action"]
        )
        for (scope, action), count in sorted(self.view.counts().items()):
            active.add_metric([scope, action], count)
        yield active
        stats = self.view.stats
        messages = CounterMetricFamily(
            "authpipe_edge_messages", "decision messages applied", labels=["outcome"]
        )
        for outcome, count in stats.outcomes.items():
            messages.add_metric([outcome], count)
        yield messages
        bad = CounterMetricFamily(
            "authpipe_edge_bad_decisions", "invalid decision messages", labels=["reason"]
        )
        for reason, count in sorted(stats.bad_reasons.items()):
            bad.add_metric([reason], count)
        yield bad


class EdgeMetrics:
    """The service's metrics on its own registry."""

    def __init__(self, view: DecisionView, health: Health) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.checks_total = Counter(
            "authpipe_edge_checks_total", "checks answered", ["result"], registry=r
        )
        self.session_reviews_total = Counter(
            "authpipe_edge_session_reviews_total",
            "session reviews answered (result step_up or none)",
            ["result"],
            registry=r,
        )
        self.bad_requests_total = Counter(
            "authpipe_edge_bad_requests_total", "requests answered 400", ["parameter"], registry=r
        )
        self.requests_total = Counter(
            "authpipe_edge_http_requests_total", "HTTP requests", ["endpoint", "status"], registry=r
        )
        self.check_logs_suppressed_total = Counter(
            "authpipe_edge_check_logs_suppressed_total",
            "refusal log lines held back by the per-second budget",
            registry=r,
        )
        self.feed_renders_total = Counter(
            "authpipe_edge_feed_renders_total", "block-list bodies rendered", registry=r
        )
        self.connections_refused_total = Counter(
            "authpipe_edge_connections_refused_total",
            "connections closed at once: edge.max_connections were open",
            registry=r,
        )
        self.head_timeouts_total = Counter(
            "authpipe_edge_head_timeouts_total",
            "connections closed: a request head was not complete within edge.head_timeout_s",
            registry=r,
        )
        self.request_seconds = Histogram(
            "authpipe_edge_http_request_seconds",
            "HTTP request handling time (long polls excluded)",
            ["endpoint"],
            buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=r,
        )
        r.register(_ViewCollector(view, health))
        # labels() takes a lock and builds a tuple: children are looked up once and kept.
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (str(id(metric)), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def request(self, endpoint: str, status: int, seconds: float | None) -> None:
        self._child(self.requests_total, endpoint, str(status)).inc()
        if seconds is not None:
            self._child(self.request_seconds, endpoint).observe(seconds)

    def check_log_suppressed(self) -> None:
        self.check_logs_suppressed_total.inc()

    def feed_rendered(self) -> None:
        self.feed_renders_total.inc()

    def connection_refused(self) -> None:
        self.connections_refused_total.inc()

    def head_timeout(self) -> None:
        self.head_timeouts_total.inc()

    def check(self, applied: str) -> None:
        self._child(self.checks_total, applied).inc()

    def session_review(self, challenge: str | None) -> None:
        self._child(self.session_reviews_total, challenge or "none").inc()

    def bad_request(self, parameter: str) -> None:
        self._child(self.bad_requests_total, _parameter_label(parameter)).inc()

    def render(self) -> bytes:
        data: bytes = generate_latest(self.registry)
        return data


def _parameter_label(parameter: str) -> str:
    """A bounded label: known parameter names only (batch positions dropped)."""
    name = parameter.rsplit(".", 1)[-1]
    return name if name in CHECK_FIELDS | SESSION_FIELDS | FEED_FIELDS | {"body"} else "other"
