"""``gpu-admission serve``: the webhook app behind gunicorn, over TLS.

Worker class and keep-alive
    The API server keeps its connections to a webhook pooled and lets them sit idle for up
    to 90 s (Go's ``IdleConnTimeout``). A server that closes an idle connection sooner races
    the next request the API server writes on it, and that request fails, which counts
    against the webhook's failurePolicy. gunicorn's ``sync`` workers close the connection
    after every response, so every admission call would pay a TCP and TLS handshake.
    ``gthread`` workers park idle keep-alive connections in a selector, which costs a file
    descriptor and no thread, and hand a connection to the thread pool only when a request
    arrives. ``keepalive`` is 120 s, longer than the client's 90 s, so the client is the one
    that closes an idle connection, at a moment it chooses. (:class:`AdmissionWorker` is
    gthread with one accounting fix, see there.)

TLS and certificate rotation
    TLS 1.2 at least; TLS 1.2 suites limited to ECDHE with AES-GCM or ChaCha20 (every TLS 1.3
    suite is an AEAD already); ALPN offers http/1.1 only. gunicorn asks the ``ssl_context``
    hook for a context each time it wraps a new connection. The hook answers with a cached
    context and, at most every ``CERT_CHECK_INTERVAL`` seconds, stats the certificate and key:
    when they changed (a Secret update swaps the mounted files), a fresh context is loaded
    and used for the handshakes that follow. Open connections keep the context they were
    made with and go on working. A pair that does not load (a certificate written before
    its key) is logged and the previous context stays in use. gunicorn's own default would
    re-read the files for every connection, which costs a key parse per handshake and fails
    handshakes while a rotation is half done.

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
"""

from __future__ import annotations

import argparse
import logging
import mmap
import os
import shutil
import signal
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cryptography import x509
from flask import Flask
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.workers.gthread import ThreadWorker

from webhook import default_policy_path
from webhook.logs import GunicornJsonLogger, configure_logging

# Nothing that imports prometheus_client is imported here at module level: it picks its
# multiprocess storage when first imported, and ``serve`` sets PROMETHEUS_MULTIPROC_DIR
# only after this module was loaded by the command line.
if TYPE_CHECKING:
    from webhook.metrics import Metrics

log = logging.getLogger(__name__)

DEFAULT_BIND = "0.0.0.0:8443"
DEFAULT_WORKERS = 2
DEFAULT_DRAIN_SECONDS = 15.0
MUTATION_MODES = ("apply", "record")

KEEPALIVE_SECONDS = 120
# Decisions take microseconds; threads cover concurrent handshakes and slow uploads. gunicorn
# completes a TLS handshake on a pool thread, so a connection that never sends a byte holds a
# thread until it times out: an idle thread costs little, a stalled admission costs a lot.
THREADS_PER_WORKER = 32
# The API server waits for a webhook 30 s at most (10 s by default): a request still running
# this long after the drain has been given up by its caller. 15 s of drain plus this fits
# the manifests' terminationGracePeriodSeconds of 40.
GRACEFUL_TIMEOUT = 20
CERT_CHECK_INTERVAL = 2.0
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class ServeSettings:
    """What ``serve`` runs with, after command line, environment and defaults are merged."""

    policy: str
    cert: str | None
    key: str | None
    bind: str
    workers: int
    insecure: bool
    drain_seconds: float
    mutation: str


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> ServeSettings:
    """Merge the command line over the environment over the defaults, and check the result."""

    def pick(value: Any, variable: str) -> Any:
        if value is not None:
            return value
        from_env = environ.get(variable)
        return from_env if from_env not in (None, "") else None

    def number(
        value: Any, option: str, variable: str, convert: Callable[[str], Any], default: Any
    ) -> Any:
        raw = pick(value, variable)
        if raw is None:
            return default
        try:
            return convert(raw)
        except ValueError:
            raise ValueError(f"{option} ({variable}): expected a number, got {raw!r}") from None

    workers = number(args.workers, "--workers", "GPU_ADMISSION_WORKERS", int, DEFAULT_WORKERS)
    if workers < 1:
        raise ValueError(f"--workers (GPU_ADMISSION_WORKERS) must be at least 1, got {workers}")
    drain = number(
        args.drain_seconds,
        "--drain-seconds",
        "GPU_ADMISSION_DRAIN_SECONDS",
        float,
        DEFAULT_DRAIN_SECONDS,
    )
    if not 0 <= drain < float("inf"):
        raise ValueError(
            f"--drain-seconds (GPU_ADMISSION_DRAIN_SECONDS) must be 0 or more, got {drain}"
        )
    mutation = (pick(args.mutation, "GPU_ADMISSION_MUTATION") or "apply").lower()
    if mutation not in MUTATION_MODES:
        raise ValueError(
            f"--mutation (GPU_ADMISSION_MUTATION) must be apply or record, got {mutation!r}"
        )

    cert = pick(args.cert, "GPU_ADMISSION_CERT")
    key = pick(args.key, "GPU_ADMISSION_KEY")
    if not args.insecure and not (cert and key):
        raise ValueError("--cert and --key are required (or --insecure for plain HTTP)")

    return ServeSettings(
        policy=pick(args.policy, "GPU_ADMISSION_POLICY") or str(default_policy_path()),
        cert=None if args.insecure else cert,
        key=None if args.insecure else key,
        bind=pick(args.bind, "GPU_ADMISSION_BIND") or DEFAULT_BIND,
        workers=workers,
        insecure=args.insecure,
        drain_seconds=drain,
        mutation=mutation,
    )


_SERVE_EPILOG = f"""\
examples:
  # local development: certificates for 127.0.0.1 first (see `gpu-admission certs --help`)
  gpu-admission certs generate --out certs --host 127.0.0.1
  gpu-admission serve --cert certs/tls.crt --key certs/tls.key --bind 127.0.0.1:8443

  # a stricter policy, and mutations only recorded in audit annotations, not applied
  gpu-admission serve --policy policies/examples/strict.yaml --mutation record \\
      --cert /tls/tls.crt --key /tls/tls.key

  # configured by the environment instead (each option names its variable)
  GPU_ADMISSION_CERT=/tls/tls.crt GPU_ADMISSION_KEY=/tls/tls.key gpu-admission serve

An option wins over its environment variable. The policy and the certificate are reloaded
when their files change; SIGTERM reports not-ready, keeps serving for --drain-seconds
(default {DEFAULT_DRAIN_SECONDS:g}), then stops.
"""


def add_subcommands(subparsers: Any) -> None:
    """Register ``serve``."""
    parser = subparsers.add_parser(
        "serve",
        help="run the admission webhook server",
        description="Serve /validate, /mutate, /healthz, /readyz and /metrics over HTTPS.",
        epilog=_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--policy",
        metavar="PATH",
        help="policy file, reloaded when it changes "
        "(env GPU_ADMISSION_POLICY; default: the packaged default policy)",
    )
    parser.add_argument(
        "--cert", metavar="PATH", help="TLS certificate chain, PEM (env GPU_ADMISSION_CERT)"
    )
    parser.add_argument(
        "--key", metavar="PATH", help="TLS private key, PEM (env GPU_ADMISSION_KEY)"
    )
    parser.add_argument(
        "--bind",
        metavar="HOST:PORT",
        help=f"address to listen on (env GPU_ADMISSION_BIND; default {DEFAULT_BIND})",
    )
    parser.add_argument(
        "--workers",
        metavar="N",
        help=f"worker processes (env GPU_ADMISSION_WORKERS; default {DEFAULT_WORKERS})",
    )
    parser.add_argument(
        "--drain-seconds",
        metavar="SECONDS",
        help="after SIGTERM, report not-ready but keep serving this long before stopping "
        f"(env GPU_ADMISSION_DRAIN_SECONDS; default {DEFAULT_DRAIN_SECONDS:g})",
    )
    parser.add_argument(
        "--mutation",
        choices=MUTATION_MODES,
        help="apply patches on /mutate, or only record them in audit annotations "
        "(env GPU_ADMISSION_MUTATION; default apply)",
    )
    # Deliberately no environment variable: turning TLS off must be visible in the command.
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="serve plain HTTP without TLS, for local experiments only",
    )
    parser.set_defaults(func=serve)


# --------------------------------------------------------------------------- TLS


def build_server_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    """A server-side TLS context: TLS 1.2+, forward-secret AEAD suites, HTTP/1.1."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(cert_path, key_path)
    return context


def _file_signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class CertificateReloader:
    """The TLS context to serve with, rebuilt when the certificate or key file changes.

    ``context()`` is called for every new connection, from several threads: between checks
    it returns the cached context without touching the file system.
    """

    def __init__(
        self,
        cert_path: str,
        key_path: str,
        *,
        on_load: Callable[[datetime], None] | None = None,
        check_interval: float = CERT_CHECK_INTERVAL,
    ) -> None:
        self.cert_path = cert_path
        self.key_path = key_path
        self._on_load = on_load
        self._check_interval = check_interval
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._signature: tuple[Any, Any] | None = None
        self._next_check = float("-inf")

    def context(self) -> ssl.SSLContext:
        """The current context, reloaded first if the files changed since the last check."""
        context = self._context
        if context is not None and time.monotonic() < self._next_check:
            return context
        with self._lock:
            context = self._context
            if context is not None and time.monotonic() < self._next_check:
                return context
            return self._refresh(context)

    def ssl_context_hook(self, conf: Any, default_ssl_context_factory: Any) -> ssl.SSLContext:
        """gunicorn's ``ssl_context`` setting: its default factory is not used."""
        return self.context()

    def _refresh(self, current: ssl.SSLContext | None) -> ssl.SSLContext:
        self._next_check = time.monotonic() + self._check_interval
        # Taken before reading: a change during the load is seen again at the next check.
        signature = (_file_signature(self.cert_path), _file_signature(self.key_path))
        if current is not None and signature == self._signature:
            return current
        try:
            context = build_server_context(self.cert_path, self.key_path)
            with open(self.cert_path, "rb") as handle:
                certificate = x509.load_pem_x509_certificate(handle.read())
        except (OSError, ValueError, ssl.SSLError) as exc:
            if current is None:
                raise
            # Remembered so that one broken pair is logged once, not at every check.
            self._signature = signature
            log.error(
                "new TLS certificate refused, serving the previous one",
                extra={"fields": {"cert": self.cert_path, "key": self.key_path, "error": str(exc)}},
            )
            return current
        first = current is None
        self._context = context
        self._signature = signature
        log.info(
            "TLS certificate loaded" if first else "TLS certificate reloaded",
            extra={
                "fields": {
                    "cert": self.cert_path,
                    "serial": format(certificate.serial_number, "x"),
                    "not_after": certificate.not_valid_after_utc.isoformat(),
                }
            },
        )
        if self._on_load is not None:
            self._on_load(certificate.not_valid_after_utc)
        return context

    def problem(self) -> str | None:
        """Why the certificates cannot be served (for /readyz), or None."""
        for path in (self.cert_path, self.key_path):
            if not os.access(path, os.R_OK):
                return f"certificate file {path} is not readable"
        return None


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


class AdmissionWorker(ThreadWorker):
    """gunicorn's gthread worker, with its count of open connections kept right.

    gunicorn 27 counts a connection as closed twice when its TLS handshake failed (the
    socket is closed already, closing it again raises, and the error path decrements
    again): a port scan or a TCP probe drives the count below zero, and a stopping worker
    then exits without waiting for its in-flight requests.
    """

    def finish_request(self, conn: Any, fs: Any) -> None:
        open_before = self.nr_conns
        super().finish_request(conn, fs)
        self.nr_conns = max(self.nr_conns, open_before - 1)


class AdmissionServer(BaseApplication):
    """gunicorn configured in code: gthread workers, TLS, drain and metrics hooks."""

    def __init__(
        self, settings: ServeSettings, *, metrics_dir: str, owns_metrics_dir: bool
    ) -> None:
        self._settings = settings
        self._metrics_dir = metrics_dir
        self._owns_metrics_dir = owns_metrics_dir
        self._drain = DrainFlag()
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
            "threads": THREADS_PER_WORKER,
            "keepalive": KEEPALIVE_SECONDS,
            "graceful_timeout": GRACEFUL_TIMEOUT,
            "proc_name": "gpu-admission",
            "logger_class": GunicornJsonLogger,
            "errorlog": "-",
            # One line per decision comes from the app; an access log would double it.
            "accesslog": None,
            "control_socket_disable": True,
            "child_exit": self._child_exit,
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

    def load(self) -> Flask:
        """Build the app in a worker, after fork: each worker has its own store and metrics."""
        from webhook.app import create_app
        from webhook.metrics import Metrics
        from webhook.policy_store import PolicyStore

        configure_logging()
        self._metrics = Metrics(multiprocess_dir=self._metrics_dir)
        store = PolicyStore(self._settings.policy, metrics=self._metrics)
        store.watch()
        checks = [self._draining]
        if self._tls is not None:
            self._tls.context()  # the first handshake should not pay for loading the key
            checks.append(self._tls.problem)
        return create_app(
            store,
            mutation_enabled=self._settings.mutation == "apply",
            metrics=self._metrics,
            readiness_checks=checks,
        )

    def run(self) -> None:
        DrainingArbiter(self, drain_seconds=self._settings.drain_seconds, drain=self._drain).run()

    # gunicorn hooks -------------------------------------------------------------------

    def _pre_request(self, worker: Any, req: Any) -> None:
        if self._drain.is_set():
            # Makes gunicorn answer with "Connection: close" and close after the response.
            req.must_close = True

    def _child_exit(self, server: Any, worker: Any) -> None:
        from webhook.metrics import mark_process_dead

        mark_process_dead(worker.pid, self._metrics_dir)

    def _on_exit(self, server: Any) -> None:
        if self._owns_metrics_dir:
            shutil.rmtree(self._metrics_dir, ignore_errors=True)

    # readiness and metrics -------------------------------------------------------------

    def _draining(self) -> str | None:
        return "draining: the server is shutting down" if self._drain.is_set() else None

    def _certificate_loaded(self, not_after: datetime) -> None:
        if self._metrics is not None:
            self._metrics.set_certificate_expiry(not_after)


# --------------------------------------------------------------------------- command


def _prepare_metrics_dir(environ: MutableMapping[str, str]) -> tuple[str, bool]:
    """The multiprocess metrics directory, created when unset; True when this run owns it.

    Must run before prometheus_client is imported: it reads the variable at import time.
    """
    configured = environ.get("PROMETHEUS_MULTIPROC_DIR")
    if configured:
        os.makedirs(configured, exist_ok=True)
        from webhook.metrics import clear_multiprocess_dir

        clear_multiprocess_dir(configured)
        return configured, False
    created = tempfile.mkdtemp(prefix="gpu-admission-metrics-")
    environ["PROMETHEUS_MULTIPROC_DIR"] = created
    return created, True


def serve(args: argparse.Namespace) -> int:
    """Run the server until it is stopped; errors in the settings stop it before start-up."""
    settings = settings_from_args(args, os.environ)
    configure_logging()
    if settings.cert and settings.key:
        try:
            build_server_context(settings.cert, settings.key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
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
    return 0
