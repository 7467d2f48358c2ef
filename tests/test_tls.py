"""``webhook.server.tls``: the server context's protocol floor, suites and ALPN, and the
reloader that swaps certificates in one step, keeps the previous pair when a new one does not
load, and checks the files at most once per interval. Handshakes run in memory (``MemoryBIO``)
between the real server context and a client that verifies it as the API server does."""

from __future__ import annotations

import logging
import ssl
from datetime import datetime
from pathlib import Path

import pytest

from tests.serving import MountedDir, client_context, make_certificates
from webhook.certs.pki import GeneratedCertificates
from webhook.server.logs import SERVER_LOGGER
from webhook.server.tls import CertificateReloader, build_server_context


def handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, host: str = "localhost"
) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """Complete a TLS handshake in memory; the (server, client) ends."""
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server_end = server.wrap_bio(server_in, server_out, server_side=True)
    client_end = client.wrap_bio(client_in, client_out, server_hostname=host)
    done = {"server": False, "client": False}
    for _ in range(10):
        for name, end in (("client", client_end), ("server", server_end)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if all(done.values()):
            return server_end, client_end
    raise AssertionError("the handshake did not complete")


def serial_seen(server: ssl.SSLContext, ca: Path) -> int:
    """The serial number of the certificate a verifying client receives."""
    from cryptography import x509

    _, client_end = handshake(server, client_context(ca))
    der = client_end.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def pair(certificates: GeneratedCertificates) -> dict[str, bytes]:
    """A certificate and its key as a kubernetes.io/tls Secret's volume holds them."""
    return {
        "tls.crt": certificates.tls_cert.read_bytes(),
        "tls.key": certificates.tls_key.read_bytes(),
    }


@pytest.fixture
def pki(tmp_path: Path) -> GeneratedCertificates:
    return make_certificates(tmp_path / "pki")


def test_the_server_context_speaks_tls12_and_up_with_forward_secret_aead(pki) -> None:
    context = build_server_context(str(pki.tls_cert), str(pki.tls_key))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_COMPRESSION and context.options & ssl.OP_NO_RENEGOTIATION
    tls12 = [c for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 and all(c["kea"] == "kx-ecdhe" and c["aead"] for c in tls12)
    client = client_context(pki.ca_cert)
    client.set_alpn_protocols(["h2", "http/1.1"])
    server_end, client_end = handshake(context, client)
    assert server_end.selected_alpn_protocol() == "http/1.1"
    assert client_end.version() in ("TLSv1.2", "TLSv1.3")


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_a_client_offering_only_tls11_is_refused(pki) -> None:
    context = build_server_context(str(pki.tls_cert), str(pki.tls_key))
    old = client_context(pki.ca_cert)
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError):
        handshake(context, old)


def serial_of(certificate: Path) -> int:
    from cryptography import x509

    return x509.load_pem_x509_certificate(certificate.read_bytes()).serial_number


def test_the_reloader_caches_between_checks(pki, tmp_path: Path) -> None:
    mounted = MountedDir(tmp_path / "secret", pair(pki))
    reloader = CertificateReloader(
        str(mounted.path("tls.crt")), str(mounted.path("tls.key")), check_interval=3600
    )
    first = reloader.context()
    renewed = make_certificates(tmp_path / "renewed", ca=pki)
    mounted.update(pair(renewed))
    # Within the interval the cached context is served, without looking at the files.
    assert reloader.context() is first


def test_the_reloader_swaps_a_renewed_pair_in_one_step(pki, tmp_path: Path) -> None:
    mounted = MountedDir(tmp_path / "secret", pair(pki))
    loaded: list[datetime] = []
    reloader = CertificateReloader(
        str(mounted.path("tls.crt")),
        str(mounted.path("tls.key")),
        on_load=loaded.append,
        check_interval=0,  # every call checks
    )
    first = reloader.context()
    assert reloader.context() is first  # unchanged files: the same context
    assert serial_seen(first, pki.ca_cert) == serial_of(pki.tls_cert)
    renewed = make_certificates(tmp_path / "renewed", ca=pki)
    mounted.update(pair(renewed))
    second = reloader.context()
    assert second is not first
    assert serial_seen(second, pki.ca_cert) == serial_of(renewed.tls_cert)
    assert loaded == [pki.not_after, renewed.not_after]


def test_a_pair_that_does_not_load_keeps_the_previous_context_and_is_logged_once(
    pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mounted = MountedDir(tmp_path / "secret", pair(pki))
    reloader = CertificateReloader(
        str(mounted.path("tls.crt")), str(mounted.path("tls.key")), check_interval=0
    )
    served = reloader.context()
    other = make_certificates(tmp_path / "other")
    # A certificate written before its key: the pair does not match.
    mounted.update({"tls.crt": other.tls_cert.read_bytes(), "tls.key": pki.tls_key.read_bytes()})
    with caplog.at_level(logging.ERROR, logger=SERVER_LOGGER):
        assert reloader.context() is served
        assert reloader.context() is served
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1
    # The key follows: the new pair is served.
    mounted.update(pair(other))
    assert reloader.context() is not served


def test_no_pair_at_start_up_raises_and_readiness_names_the_file(pki, tmp_path: Path) -> None:
    missing = tmp_path / "missing.crt"
    reloader = CertificateReloader(str(missing), str(pki.tls_key))
    with pytest.raises(OSError):
        reloader.context()
    assert reloader.problem() == f"certificate file {missing} is not readable"
    assert CertificateReloader(str(pki.tls_cert), str(pki.tls_key)).problem() is None


def test_wrap_socket_leaves_the_handshake_to_the_worker(pki) -> None:
    import socket

    reloader = CertificateReloader(str(pki.tls_cert), str(pki.tls_key))
    assert reloader.ssl_context_hook(None, None) is reloader
    left, right = socket.socketpair()
    with left, right:
        # Nothing is sent: a handshake on connect would block here.
        wrapped = reloader.wrap_socket(left, server_side=True, do_handshake_on_connect=True)
        assert isinstance(wrapped, ssl.SSLSocket)
        assert wrapped.do_handshake_on_connect is False
        wrapped.close()
