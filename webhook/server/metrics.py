"""Prometheus metrics of the webhook, through prometheus-client's documented API.

The server has one worker process (``webhook.server.gunicorn``), which counts every request
as it answers it (``inc``, ``observe``) and renders ``/metrics`` from its own registry. Each
:class:`Metrics` has a registry of its own, so two apps in one process (tests) never share
counters. A replaced worker starts its counters at zero, as any restarted process does:
Prometheus' ``rate`` and ``increase`` take such resets in their stride.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import datetime

# prometheus-client keeps its samples in files when this is set as it is imported: the
# manifests of releases that ran several workers set it. One process keeps them in memory,
# and a directory that is gone (their emptyDir removed) would stop the worker from booting.
os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)

from prometheus_client import (  # noqa: E402 (after the line above, by design)
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# A decision takes tens of microseconds; the buckets resolve that range, and reach the
# webhook's 5 s timeout for the largest reviews (decided in a child) and stalled workers.
DECISION_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.25, 1.0, 2.5, 5.0,
)  # fmt: skip

ENDPOINTS = ("validate", "mutate")
# Outcomes of an admission request: a decision (allowed/denied), or the reason there was none.
VERDICTS = ("allowed", "denied", "invalid", "unavailable", "error")
# What /mutate did with a patch: returned it, or only recorded it in an audit annotation.
MUTATIONS = ("applied", "recorded")


class Metrics:
    """The webhook's metrics, in a registry of their own."""

    def __init__(self) -> None:
        registry = self._registry = CollectorRegistry()

        self.requests = Counter(
            "gpu_admission_requests",
            "Admission requests answered, by endpoint and verdict.",
            ["endpoint", "verdict"],
            registry=registry,
        )
        self.violations = Counter(
            "gpu_admission_violations",
            "Policy violations found by /validate, by rule id and mode.",
            ["rule", "mode"],
            registry=registry,
        )
        self.mutations = Counter(
            "gpu_admission_mutations",
            "Patches returned by /mutate (applied) or only recorded in audit annotations.",
            ["outcome"],
            registry=registry,
        )
        self.decision_seconds = Histogram(
            "gpu_admission_decision_seconds",
            "Time to parse and decide one admission review: the app's share, without HTTP and TLS.",
            ["endpoint"],
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        self.policy_reloads = Counter(
            "gpu_admission_policy_reloads",
            "Policy files loaded after start-up because the file changed.",
            registry=registry,
        )
        self.policy_reload_errors = Counter(
            "gpu_admission_policy_reload_errors",
            "Policy files refused because they were missing or invalid.",
            registry=registry,
        )
        # Counted by the worker once a second, with its log line on them.
        self.connections_closed = Counter(
            "gpu_admission_connections_closed",
            "Connections a full worker closed to make room for new ones: each waited on its "
            "client (idle, or stalled in a handshake, head or body, or not reading its answer).",
            registry=registry,
        )
        self.policy_info = Gauge(
            "gpu_admission_policy_info",
            "1 for the sha256 of the policy in force, 0 for a policy replaced since.",
            ["sha256"],
            registry=registry,
        )
        # Entries of the policy in force dropped at load (an allowed host path that touches a
        # node-control path): the policy serves without them, and `policy validate` refuses
        # them.
        self.policy_dropped_entries = Gauge(
            "gpu_admission_policy_dropped_entries",
            "Entries of the policy in force that were dropped at load because they can never "
            "be allowed (see the policy lint errors in the log).",
            registry=registry,
        )
        self.certificate_expiry = Gauge(
            "gpu_admission_certificate_expiry_timestamp_seconds",
            "Expiry (notAfter, Unix time) of the serving certificate.",
            registry=registry,
        )
        for endpoint in ENDPOINTS:
            for verdict in VERDICTS:
                self.requests.labels(endpoint, verdict)
        for outcome in MUTATIONS:
            self.mutations.labels(outcome)
        self._policy_sha256: str | None = None

    def answered(
        self,
        endpoint: str,
        verdict: str,
        seconds: float | None = None,
        violations: tuple[tuple[str, str], ...] = (),
        mutation: str = "none",
    ) -> None:
        """Count a request answered with ``verdict``; a decision also has its ``seconds``, its
        violations as (rule, mode) pairs and what it did with a patch (see MUTATIONS)."""
        self.requests.labels(endpoint, verdict).inc()
        if seconds is not None:
            self.decision_seconds.labels(endpoint).observe(seconds)
        for rule, mode in violations:
            self.violations.labels(rule, mode).inc()
        if mutation != "none":
            self.mutations.labels(mutation).inc()

    def set_policy(self, sha256: str) -> None:
        """Mark ``sha256`` as the policy in force; the one it replaces goes to 0."""
        if self._policy_sha256 == sha256:
            return
        if self._policy_sha256 is not None:
            self.policy_info.labels(self._policy_sha256).set(0)
        self.policy_info.labels(sha256).set(1)
        self._policy_sha256 = sha256

    def set_certificate_expiry(self, not_after: datetime) -> None:
        """Record the expiry of the certificate chain now being served."""
        self.certificate_expiry.set(not_after.timestamp())

    def watch_inventory(self, figures: Callable[[], tuple[int, float, int]]) -> None:
        """Expose the node inventory's figures (``NodeInventory.figures``), read at scrape."""
        self._registry.register(_InventoryCollector(figures))

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of the metrics, and its content type."""
        return generate_latest(self._registry), CONTENT_TYPE_LATEST


class _InventoryCollector(Collector):
    """The node inventory's figures, read as a scrape asks for them (prometheus-client's
    custom collector): nodes known, age, watch restarts."""

    def __init__(self, figures: Callable[[], tuple[int, float, int]]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        nodes, age, restarts = self._figures()
        yield GaugeMetricFamily(
            "gpu_admission_inventory_nodes", "Nodes in the node inventory.", value=nodes
        )
        yield GaugeMetricFamily(
            "gpu_admission_inventory_age_seconds",
            "Seconds since the node inventory last heard from the API server (a list, an "
            "event or a bookmark; since start before its first list).",
            value=age,
        )
        yield CounterMetricFamily(
            "gpu_admission_inventory_watch_restarts",
            "Lists and watches of Nodes started again after a failure, an expired "
            "resourceVersion or a policy that changed what is kept.",
            value=restarts,
        )
