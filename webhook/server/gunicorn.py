"""The webhook app behind gunicorn, over TLS (``webhook.server.tls``): what ``serve`` runs.

Worker and keep-alive
    :class:`~webhook.server.worker.AdmissionWorker`: gunicorn's gevent worker, a greenlet per
    connection with a deadline for each phase of it (see there for why). The API server
    keeps its connections to a webhook pooled and lets them sit idle for up to 90 s (Go's
    ``IdleConnTimeout``). A server that closes an idle connection sooner races the next
    request the API server writes on it, and that request fails, which counts against the
    webhook's failurePolicy; the idle deadline is therefore 120 s, so the client is the one
    that closes an idle connection, at a moment it chooses.

Drain on SIGTERM
    The kubelet sends SIGTERM while the Pod is still an endpoint of the Service and while the
    API server still holds pooled connections to it. The arbiter therefore first sets a flag
    shared with the workers (one byte of anonymous shared memory mapped before fork): /readyz
    answers 503 from then on, so the endpoint is removed, and every response carries
    ``Connection: close``, so the API server re-dials, through the Service, to a ready
    replica. The workers go on serving for ``drain_seconds``; then gunicorn's graceful stop
    begins: workers accept no new connection and finish their in-flight requests within
    ``GRACEFUL_TIMEOUT``.
    A second SIGTERM, or SIGINT/SIGQUIT, ends the drain at once.

Metrics
    Each worker writes its samples to the shared metrics files as it counts them
    (``webhook.server.metrics``); ``/metrics`` sums every worker's.
"""

from __future__ import annotations

import gc
import logging
import math
import mmap
import os
import shutil
import signal
import ssl
import tempfile
import time
from collections.abc import MutableMapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from flask import Flask
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

from webhook.server.balance import ConnectionShares
from webhook.server.child import run_in_child
from webhook.server.logs import SERVER_LOGGER, configure_logging, gunicorn_logconfig
from webhook.server.settings import Deadlines, ServeSettings, SettingsError
from webhook.server.tls import CertificateReloader, build_server_context
from webhook.server.worker import AdmissionWorker

# Nothing that imports prometheus_client is imported here at module level: it picks its
# multiprocess storage when first imported, and ``serve`` sets PROMETHEUS_MULTIPROC_DIR
# only after this module was loaded by the command line.
if TYPE_CHECKING:
    from webhook.server.metrics import Metrics

log = logging.getLogger(SERVER_LOGGER)

# The API server waits for a webhook 30 s at most (10 s by default): a request still running
# this long after the drain has been given up by its caller. 15 s of drain plus this fits
# the manifests' terminationGracePeriodSeconds of 40.
GRACEFUL_TIMEOUT = 20


# --------------------------------------------------------------------------- drain


class DrainFlag:
    """One byte of anonymous shared memory: set by the arbiter, read by every worker.

    Mapped before the workers fork, so the arbiter's write is visible to all of them without
    a file, a pipe or a lock (a single byte is written atomically).
    """

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, 1, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)

    def set(self) -> None:
        self._memory[0] = 1

    def is_set(self) -> bool:
        return self._memory[0] == 1


class DrainingArbiter(Arbiter):
    """gunicorn's arbiter, with a drain period between SIGTERM and the graceful stop."""

    def __init__(self, app: BaseApplication, *, drain_seconds: float, drain: DrainFlag) -> None:
        self._drain_seconds = drain_seconds
        self._drain = drain
        super().__init__(app)

    def handle_term(self) -> None:
        if self._drain_seconds <= 0 or self._drain.is_set():
            raise StopIteration
        self._drain.set()
        self.log.info("SIGTERM received: not ready, draining for %g s", self._drain_seconds)
        deadline = time.monotonic() + self._drain_seconds
        while (remaining := deadline - time.monotonic()) > 0:
            # The arbiter's own loop is suspended here, so do its work: reap and respawn
            # workers, and honour the signals that mean "stop now".
            for sig in self.wait_for_signals(timeout=min(remaining, 1.0)):
                if sig == signal.SIGCHLD:
                    self.handle_chld()
                elif sig == signal.SIGTERM:
                    self.log.info("second SIGTERM: ending the drain")
                    raise StopIteration
                elif sig in (signal.SIGINT, signal.SIGQUIT):
                    self.log.info("SIGINT/SIGQUIT during the drain: stopping at once")
                    self.stop(graceful=False)
                    raise StopIteration
                else:
                    self.log.info("ignoring signal %s during the drain", sig)
            self.murder_workers()
            self.manage_workers()
        self.log.info("drain over: stopping gracefully")
        raise StopIteration


# --------------------------------------------------------------------------- gunicorn


class AdmissionServer(BaseApplication):
    """gunicorn configured in code: the worker, TLS, drain and metrics hooks.

    ``deadlines`` and ``connection_shares`` are read by each worker (gunicorn hands a worker
    the application object)."""

    def __init__(
        self, settings: ServeSettings, *, metrics_dir: str, owns_metrics_dir: bool
    ) -> None:
        self._settings = settings
        self._metrics_dir = metrics_dir
        self._owns_metrics_dir = owns_metrics_dir
        self.deadlines: Deadlines = settings.deadlines
        self._drain = DrainFlag()
        # Room for a full set of workers and their replacements starting while they stop.
        self.connection_shares = ConnectionShares(2 * settings.workers)
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
            "workers": settings.workers,
            "worker_class": AdmissionWorker,
            "worker_connections": settings.deadlines.max_connections,
            # The worker's own idle deadline replaces gunicorn's keep-alive timeout; nonzero
            # keeps gunicorn from closing a connection after each response.
            "keepalive": math.ceil(settings.deadlines.idle),
            "graceful_timeout": GRACEFUL_TIMEOUT,
            "proc_name": "gpu-admission",
            # gunicorn's lines as JSON too, through its public logging configuration.
            "errorlog": None,
            "logconfig_dict": gunicorn_logconfig(),
            # One line per decision comes from the app; an access log would double it.
            "accesslog": None,
            "control_socket_disable": True,
            "pre_fork": self._pre_fork,
            "child_exit": self._child_exit,
            "worker_exit": self._worker_exit,
            "pre_request": self._pre_request,
            "on_exit": self._on_exit,
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
        """This worker's metrics, once its app is built (see :meth:`load`)."""
        return self._metrics

    def load(self) -> Flask:
        """Build the app in a worker, after fork: each worker has its own store and metrics."""
        from webhook.server.app import create_app
        from webhook.server.metrics import Metrics
        from webhook.server.store import PolicyStore

        configure_logging()
        metrics = self._metrics = Metrics(multiprocess_dir=self._metrics_dir)
        store = PolicyStore(self._settings.policy, metrics=metrics)
        store.watch()
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

    def run(self) -> None:
        DrainingArbiter(self, drain_seconds=self._settings.drain_seconds, drain=self._drain).run()

    # gunicorn hooks -------------------------------------------------------------------

    def _pre_request(self, worker: Any, req: Any) -> None:
        if self._drain.is_set():
            # Makes gunicorn answer with "Connection: close" and close after the response.
            req.must_close = True

    def _pre_fork(self, server: Any, worker: Any) -> None:
        taken = {w.connection_slot for w in server.WORKERS.values()}
        worker.connection_slot = self.connection_shares.claim(taken)

    def _child_exit(self, server: Any, worker: Any) -> None:
        from webhook.server.metrics import mark_process_dead

        self.connection_shares.release(worker.connection_slot)
        mark_process_dead(worker.pid, self._metrics_dir)

    def _worker_exit(self, server: Any, worker: Any) -> None:
        # gunicorn also calls this in the arbiter for a worker that was already gone, for
        # which child_exit is not called: its slot is freed here.
        self.connection_shares.release(worker.connection_slot)

    def _on_exit(self, server: Any) -> None:
        if self._owns_metrics_dir:
            shutil.rmtree(self._metrics_dir, ignore_errors=True)

    # readiness and metrics -------------------------------------------------------------

    def _draining(self) -> str | None:
        return "draining: the server is shutting down" if self._drain.is_set() else None

    def _certificate_loaded(self, not_after: datetime) -> None:
        if self._metrics is not None:
            self._metrics.set_certificate_expiry(not_after)


# --------------------------------------------------------------------------- serve


def _prepare_metrics_dir(environ: MutableMapping[str, str]) -> tuple[str, bool]:
    """The multiprocess metrics directory, created when unset; True when this run owns it.

    Must run before prometheus_client is imported: it reads the variable at import time.
    """
    configured = environ.get("PROMETHEUS_MULTIPROC_DIR")
    if configured:
        os.makedirs(configured, exist_ok=True)
        from webhook.server.metrics import clear_multiprocess_dir

        clear_multiprocess_dir(configured)
        return configured, False
    created = tempfile.mkdtemp(prefix="gpu-admission-metrics-")
    environ["PROMETHEUS_MULTIPROC_DIR"] = created
    return created, True


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
    metrics_dir, owns_metrics_dir = _prepare_metrics_dir(os.environ)
    AdmissionServer(settings, metrics_dir=metrics_dir, owns_metrics_dir=owns_metrics_dir).run()
