"""TLS for the webhook: a strict server context, rebuilt when the certificate files change.

TLS 1.2 at least; TLS 1.2 suites limited to ECDHE with AES-GCM or ChaCha20 (every TLS 1.3 suite
is an AEAD already); ALPN offers http/1.1 only. Each new connection is wrapped with the
current context (:meth:`CertificateReloader.wrap_socket`), a cached context that, at
most every ``CERT_CHECK_INTERVAL`` seconds, stats the certificate and key: when they changed (a
Secret update swaps the mounted files), a fresh context is loaded and used for the handshakes
that follow (and the worker checks on its own every few seconds, so that it moves even
when no connection comes). Open connections keep the context they were made with and go on
working. A pair that does not load (a certificate written before its key) is logged and the
previous context stays in use. gunicorn's own default would re-read the files for every
connection, which costs a key parse per handshake and fails handshakes while a rotation is half
done.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from cryptography import x509

from webhook.server.logs import SERVER_LOGGER
from webhook.server.watch import every

log = logging.getLogger(SERVER_LOGGER)

CERT_CHECK_INTERVAL = 2.0
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


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

    def ssl_context_hook(self, conf: Any, default_ssl_context_factory: Any) -> CertificateReloader:
        """gunicorn's ``ssl_context`` setting; its default factory is not used. The gevent
        worker asks once and wraps every connection with the answer, so the answer is this
        reloader: see :meth:`wrap_socket`."""
        return self

    def wrap_socket(self, sock: Any, **options: Any) -> ssl.SSLSocket:
        """Wrap a new connection with the current context, the handshake left to the worker
        (which runs it under its deadline)."""
        options["do_handshake_on_connect"] = False
        return self.context().wrap_socket(sock, **options)

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

    def watch(self) -> threading.Thread:
        """Check the files every ``check_interval`` in a daemon thread, until exit: a worker
        that accepts no new connection still moves to a renewed certificate, so its expiry
        metric and its log tell the truth."""
        return every(
            self._check_interval,
            self.context,
            name="certificate-watch",
            log=log,
            failure="TLS certificate check failed",
        )

    def problem(self) -> str | None:
        """Why the certificates cannot be served (for /readyz), or None."""
        for path in (self.cert_path, self.key_path):
            if not os.access(path, os.R_OK):
                return f"certificate file {path} is not readable"
        return None
