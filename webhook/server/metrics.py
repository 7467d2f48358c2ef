"""Prometheus metrics of the webhook, correct across several gunicorn worker processes.

A scrape reaches one worker, so every worker writes its samples to files in
``PROMETHEUS_MULTIPROC_DIR`` and ``/metrics`` sums them over all workers (prometheus-client's
multiprocess mode). prometheus-client picks its storage when it is first imported, so the
server sets that variable before anything imports this module.

Without a multiprocess directory (tests, one process), each :class:`Metrics` keeps its own
registry, so two apps in one process never share counters.

Each request is counted as it is answered, through prometheus-client's documented API
(``inc``, ``observe``): a scrape sees every worker's requests up to the moment it reads the
files.
"""

from __future__ import annotations

import os
from datetime import datetime

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

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
    """The webhook's metrics, registered in a private registry or written for a multiprocess scrape.

    ``multiprocess_dir`` is the directory shared by the workers; it must be the
    ``PROMETHEUS_MULTIPROC_DIR`` that was set before prometheus-client was imported.
    """

    def __init__(self, *, multiprocess_dir: str | None = None) -> None:
        self._multiprocess_dir = multiprocess_dir
        # In multiprocess mode the samples live in files; a registry would only be read by
        # this process, so the metrics are not registered anywhere.
        self._registry = None if multiprocess_dir else CollectorRegistry()
        registry = self._registry

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
        # Written by the worker once a second, with its log line on them (a flood decides how
        # many it closes, never how often the files are written).
        self.connections_closed = Counter(
            "gpu_admission_connections_closed",
            "Connections a full worker closed to make room for new ones: each waited on its "
            "client (idle, or stalled in a handshake, head or body, or not reading its answer).",
            registry=registry,
        )
        # One series per worker (liveall): during a reload the workers can briefly disagree,
        # and that should be visible rather than averaged away.
        self.policy_info = Gauge(
            "gpu_admission_policy_info",
            "1 for the sha256 of the policy in force, 0 for a policy replaced since.",
            ["sha256"],
            multiprocess_mode="liveall",
            registry=registry,
        )
        # Entries of the policy in force dropped at load (an allowed host path that touches a
        # node-control path): the policy serves without them, and `policy validate` refuses
        # them. The most any live worker has is the one to alert on.
        self.policy_dropped_entries = Gauge(
            "gpu_admission_policy_dropped_entries",
            "Entries of the policy in force that were dropped at load because they can never "
            "be allowed (see the policy lint errors in the log).",
            multiprocess_mode="livemax",
            registry=registry,
        )
        # The earliest expiry served by any live worker is the one to alert on.
        self.certificate_expiry = Gauge(
            "gpu_admission_certificate_expiry_timestamp_seconds",
            "Expiry (notAfter, Unix time) of the serving certificate.",
            multiprocess_mode="livemin",
            registry=registry,
        )
        for endpoint in ENDPOINTS:
            for verdict in VERDICTS:
                self.requests.labels(endpoint, verdict)
        for outcome in MUTATIONS:
            self.mutations.labels(outcome)
        if multiprocess_dir is not None and not _writes_files(multiprocess_dir):
            # prometheus-client chose where samples live when it was imported: before the
            # directory was set, it keeps them in this process, and a scrape misses them.
            raise RuntimeError(
                "PROMETHEUS_MULTIPROC_DIR must be set before prometheus_client is imported"
            )
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
        """Mark ``sha256`` as the policy in force in this process."""
        if self._policy_sha256 == sha256:
            return
        # A multiprocess gauge cannot delete a series from its file: zero it instead.
        if self._policy_sha256 is not None:
            self.policy_info.labels(self._policy_sha256).set(0)
        self.policy_info.labels(sha256).set(1)
        self._policy_sha256 = sha256

    def set_certificate_expiry(self, not_after: datetime) -> None:
        """Record the expiry of the certificate chain now being served."""
        self.certificate_expiry.set(not_after.timestamp())

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of all workers' samples, and its content type."""
        registry = self._registry
        if registry is None:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self._multiprocess_dir)
        return generate_latest(registry), CONTENT_TYPE_LATEST


def _writes_files(multiprocess_dir: str) -> bool:
    """Whether this process's samples are written to ``multiprocess_dir``, as multiprocess
    mode does for every labelled series as soon as it exists."""
    own = f"_{os.getpid()}.db"
    return any(entry.name.endswith(own) for entry in os.scandir(multiprocess_dir))


def mark_process_dead(pid: int, multiprocess_dir: str) -> None:
    """Drop a dead worker's live gauges, so its last policy and certificate stop counting."""
    multiprocess.mark_process_dead(pid, multiprocess_dir)


def clear_multiprocess_dir(multiprocess_dir: str) -> None:
    """Remove samples a previous run left, as prometheus-client requires before start-up."""
    for entry in os.scandir(multiprocess_dir):
        if entry.name.endswith(".db") and entry.is_file():
            os.unlink(entry.path)
