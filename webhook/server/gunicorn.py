"""The webhook app behind gunicorn, over TLS (``webhook.server.tls``): what ``serve`` runs.

Processes
    gunicorn's arbiter and one worker (:class:`~webhook.server.worker.AdmissionWorker`). The
    manifests give the container one CPU, where a second worker adds no throughput, only
    switching between processes (measured in ``settings.py``): the server scales with
    replicas. The worker serves every connection, owns the policy, the metrics and the node
    inventory, whose list and watch run in a process the worker starts
    (``webhook.server.inventory``); long decisions run in forked children
    (``webhook.server.child``). The arbiter only starts the worker, replaces it within about
    0.2 s if it dies (meanwhile the Service sends reviews to the other replicas) and passes
    the stop signals on.

Worker and keep-alive
    A greenlet per connection with a deadline for each phase of it (see the worker for why).
    The API server keeps its connections to a webhook pooled and lets them sit idle for up
    to 90 s (Go's ``IdleConnTimeout``). A server that closes an idle connection sooner races
    the next request the API server writes on it, and that request fails, which counts
    against the webhook's failurePolicy; the idle deadline is therefore 120 s, so the client
    is the one that closes an idle connection, at a moment it chooses.

Drain on SIGTERM
    The kubelet sends SIGTERM while the Pod is still an endpoint of the Service and while the
    API server still holds pooled connections to it. The arbiter passes SIGTERM on to the
    worker (gunicorn's graceful stop) and waits for it; the worker drains: /readyz answers
    503 from then on, so the endpoint is removed, and every answer carries
    ``Connection: close``, so the API server re-dials, through the Service, to a ready
    replica. After ``drain_seconds`` the worker accepts no new connection and finishes the
    requests already written within ``GRACEFUL_TIMEOUT`` (``webhook.server.settings``).
    SIGINT or SIGQUIT (Ctrl-C sends SIGINT to the arbiter and the worker) stops at once.
"""

from __future__ import annotations

import gc
import logging
import math
import ssl
from datetime import datetime
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from webhook.server.child import run_in_child
from webhook.server.inventory import NodeInventory
from webhook.server.logs import (
    SERVER_LOGGER,
    NoAccessLogger,
    configure_logging,
    gunicorn_logconfig,
)
from webhook.server.metrics import Metrics
from webhook.server.settings import GRACEFUL_TIMEOUT, Deadlines, ServeSettings, SettingsError
from webhook.server.tls import CertificateReloader, build_server_context
from webhook.server.worker import AdmissionWorker

log = logging.getLogger(SERVER_LOGGER)

# Beyond the worker's own drain and graceful timeout, the time it may take to close what is
# left (about 2 s: its servers' stop) before the arbiter kills it. 15 s of drain, 20 s of
# graceful timeout and this fit the manifests' terminationGracePeriodSeconds of 40.
STOP_MARGIN_SECONDS = 4


class AdmissionServer(BaseApplication):
    """gunicorn configured in code: one worker, TLS, the drain.

    The worker reads ``deadlines`` and ``drain_seconds`` and sets ``draining`` (gunicorn
    hands a worker the application object); the app's readiness check reads ``draining``."""

    def __init__(self, settings: ServeSettings) -> None:
        self._settings = settings
        self.deadlines: Deadlines = settings.deadlines
        self.drain_seconds = settings.drain_seconds
        self.draining = False
        self.inventory: NodeInventory | None = None
        self._metrics: Metrics | None = None
        self._tls = (
            CertificateReloader(settings.cert, settings.key, on_load=self._certificate_loaded)
            if settings.cert and settings.key
            else None
        )
        super().__init__(prog="gpu-admission serve")

    def load_config(self) -> None:
        settings = self._settings
        options: dict[str, Any] = {
            "bind": [settings.bind],
            "workers": 1,
            "worker_class": AdmissionWorker,
            "worker_connections": settings.deadlines.max_connections,
            # The worker's own idle deadline replaces gunicorn's keep-alive timeout; nonzero
            # keeps gunicorn from closing a connection after each response.
            "keepalive": math.ceil(settings.deadlines.idle),
            # How long the arbiter waits for the worker after passing SIGTERM on: the drain,
            # then the requests in flight.
            "graceful_timeout": math.ceil(settings.drain_seconds)
            + GRACEFUL_TIMEOUT
            + STOP_MARGIN_SECONDS,
            "proc_name": "gpu-admission",
            # gunicorn's lines as JSON too, through its public logging configuration.
            "errorlog": None,
            "logconfig_dict": gunicorn_logconfig(),
            # One line per decision comes from the app; an access log would double it.
            "accesslog": None,
            "logger_class": NoAccessLogger,
            "control_socket_disable": True,
        }
        if self._tls is not None:
            options.update(
                certfile=self._tls.cert_path,
                keyfile=self._tls.key_path,
                ssl_context=self._tls.ssl_context_hook,
            )
        for name, value in options.items():
            self.cfg.set(name, value)

    @property
    def metrics(self) -> Metrics | None:
        """The worker's metrics, once its app is built (see :meth:`load`)."""
        return self._metrics

    def load(self) -> Flask:
        """Build the app in the worker, after fork: the store, its watch and the metrics
        belong to the process that serves."""
        from webhook.server.app import create_app
        from webhook.server.store import PolicyStore

        configure_logging()
        # The JSON lines carry no thread or process: each record stops looking them up.
        logging.logThreads = False
        logging.logProcesses = False
        logging.logMultiprocessing = False
        metrics = self._metrics = Metrics()
        store = PolicyStore(self._settings.policy, metrics=metrics)
        store.watch()
        if self._settings.inventory:
            # The worker owns the node inventory; its process lists and watches, one per
            # replica, off the request path.
            self.inventory = NodeInventory(lambda: store.policy)
            metrics.watch_inventory(self.inventory.figures)
            self.inventory.start()
        checks = [self._draining]
        if self._tls is not None:
            self._tls.context()  # the first handshake should not pay for loading the key
            self._tls.watch()
            checks.append(self._tls.problem)
        return create_app(
            store,
            mutation_enabled=self._settings.mutation == "apply",
            metrics=metrics,
            readiness_checks=checks,
            run_long=run_in_child,
            node_snapshot=self.inventory.snapshot if self.inventory is not None else None,
        )

    def wsgi(self) -> Any:
        """The app of this worker (gunicorn calls this once, after fork)."""
        app = super().wsgi()
        # What exists now (modules, the compiled policy, the app) lives as long as the worker:
        # moved out of the collector's reach, a full collection no longer walks it, and
        # requests, which allocate thousands of short-lived objects each, stop paying for it.
        gc.collect()
        gc.freeze()
        return app

    def _draining(self) -> str | None:
        return "draining: the server is shutting down" if self.draining else None

    def _certificate_loaded(self, not_after: datetime) -> None:
        if self._metrics is not None:
            self._metrics.set_certificate_expiry(not_after)


def serve(settings: ServeSettings) -> None:
    """Run the server until it is stopped; a certificate that does not load stops it before
    start-up."""
    configure_logging()
    if settings.cert and settings.key:
        try:
            build_server_context(settings.cert, settings.key)
        except (OSError, ssl.SSLError) as exc:
            raise SettingsError(
                f"cannot load TLS certificate {settings.cert} with key {settings.key}: {exc}"
            ) from None
    else:
        log.warning(
            "INSECURE: serving plain HTTP without TLS. The API server only calls webhooks "
            "over HTTPS, and admission reviews would cross the network in clear text. "
            "Use --insecure for local experiments only."
        )
    for warning in settings.warnings:
        log.warning(warning)
    AdmissionServer(settings).run()
