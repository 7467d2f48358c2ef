"""Serving certificates for the webhook: a small private CA and the Service's certificate.

The Kubernetes API server only calls an admission webhook over HTTPS, and it verifies the
webhook's certificate against the ``caBundle`` of the webhook configuration. This module
makes a small private CA plus a serving certificate for the webhook Service, and reads and
writes certificate material safely; ``webhook.certs.install`` puts it into a cluster (a
``kubernetes.io/tls`` Secret mounted by the webhook Pods, and the ``caBundle`` of every webhook
entry) and ``webhook.certs.gitops`` into manifests.

Production clusters should rather use the cert-manager overlay; this is the path for local
development, CI and simple clusters, and it also documents what cert-manager does for us.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import re
import secrets
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.policy.files import unreadable_file

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
CA_BUNDLE = "ca-bundle.crt"

KEY_TYPES = ("ecdsa", "rsa")

# Certificates start a little in the past: clocks of the API server and of the machine
# that generated them are rarely identical, and "not yet valid" is a confusing failure.
_BACKDATE = timedelta(minutes=5)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class CertsError(Exception):
    """A problem with certificate material or its inputs, worded for a one-line report."""


@dataclass(frozen=True)
class GeneratedCertificates:
    """What :func:`generate` wrote, so callers can print or install it without re-reading."""

    out_dir: Path
    ca_cert: Path
    tls_cert: Path
    tls_key: Path
    ca_key: Path | None  # only when the CA was created by this call
    ca_created: bool
    sans: tuple[str, ...]
    not_after: datetime  # of the serving certificate, timezone-aware UTC
    ca_bundle_b64: str  # base64 of ca.crt: the value for a webhook's clientConfig.caBundle


# --------------------------------------------------------------------------- generation


def generate(
    out_dir: str | os.PathLike[str],
    *,
    service: str,
    namespace: str,
    hosts: Iterable[str] = (),
    ca_cert_path: str | os.PathLike[str] | None = None,
    ca_key_path: str | os.PathLike[str] | None = None,
    validity_days: int = 365,
    ca_validity_days: int = 3650,
    key_type: str = "ecdsa",
) -> GeneratedCertificates:
    """Write ``ca.crt``, ``tls.crt``, ``tls.key`` (and ``ca.key`` for a new CA) into out_dir.

    The serving certificate names the Service in every form the API server may dial
    (``svc``, ``svc.ns``, ``svc.ns.svc``, ``svc.ns.svc.cluster.local``) plus ``hosts``
    (DNS names or IP addresses, e.g. 127.0.0.1 for ``make run``).

    Passing an existing CA (``ca_cert_path`` and ``ca_key_path``) renews only the serving
    certificate: ``ca.crt`` is copied byte for byte, so the ``caBundle`` already in the
    cluster stays valid and renewal needs no change to the webhook configurations.

    Private keys are written 0600 through a temporary file and ``os.replace``, so a reader
    (the server reloading its certificate) never sees a half-written or world-readable key.
    ``tls.crt`` is written last: its presence means the set is complete.
    """
    if key_type not in KEY_TYPES:
        raise CertsError(f"unknown key type {key_type!r}: use one of {', '.join(KEY_TYPES)}")
    if validity_days < 1 or ca_validity_days < 1:
        raise CertsError("validity must be at least one day")
    if (ca_cert_path is None) != (ca_key_path is None):
        raise CertsError("an existing CA needs both its certificate and its key")
    _check_dns_label(service, "service")
    _check_dns_label(namespace, "namespace")
    dns_names, ip_addresses = _service_names(service, namespace, hosts)

    out = Path(out_dir)
    now = datetime.now(UTC)

    # Inputs are read and checked before out is created or written: a wrong file leaves
    # the certificates already there as they were.
    if ca_cert_path is not None and ca_key_path is not None:
        ca_pem, ca_cert, ca_key = _load_ca(Path(ca_cert_path), Path(ca_key_path), now)
        ca_created = False
    else:
        ca_key = _new_key(key_type)
        ca_cert = _make_ca_cert(ca_key, service, namespace, now, ca_validity_days)
        ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
        ca_created = True

    key = _new_key(key_type)
    # A serving certificate that outlives its CA would fail verification at the CA's end
    # anyway; clamping makes the reported expiry (and the expiry metric) truthful.
    not_after = min(now + timedelta(days=validity_days), ca_cert.not_valid_after_utc)
    cert = _make_serving_cert(
        key, ca_cert, ca_key, service, namespace, dns_names, ip_addresses, now, not_after
    )

    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, CA_BUNDLE)}
    if ca_created:
        write_atomic(paths[CA_KEY], _private_pem(ca_key), 0o600)
    write_atomic(paths[CA_CERT], ca_pem, 0o644)
    write_atomic(paths[TLS_KEY], _private_pem(key), 0o600)
    write_atomic(paths[TLS_CERT], cert.public_bytes(serialization.Encoding.PEM), 0o644)
    # A bundle left by an earlier rotation would otherwise be preferred by ``install``.
    paths[CA_BUNDLE].unlink(missing_ok=True)

    return GeneratedCertificates(
        out_dir=out,
        ca_cert=paths[CA_CERT],
        tls_cert=paths[TLS_CERT],
        tls_key=paths[TLS_KEY],
        ca_key=paths[CA_KEY] if ca_created else None,
        ca_created=ca_created,
        sans=tuple(dns_names) + tuple(str(ip) for ip in ip_addresses),
        not_after=cert.not_valid_after_utc,
        ca_bundle_b64=base64.b64encode(ca_pem).decode("ascii"),
    )


def write_ca_bundle(
    out_path: str | os.PathLike[str], ca_paths: Sequence[str | os.PathLike[str]]
) -> str:
    """Concatenate the CA certificates of ca_paths into out_path; return its base64.

    Rotating the CA without downtime needs a ``caBundle`` that trusts both the old and the
    new CA while Pods switch certificates. Every input is parsed as PEM certificates (a
    file holding a private key is refused, so a key can never reach a caBundle), and
    duplicates are dropped so repeating a rotation step does not grow the bundle.
    """
    if not ca_paths:
        raise CertsError("a CA bundle needs at least one CA certificate")
    return write_bundle(out_path, [c for p in ca_paths for c in read_certificates(Path(p))])


def write_bundle(out_path: str | os.PathLike[str], certificates: list[x509.Certificate]) -> str:
    """Write the certificates (each once) as a PEM bundle; return its base64."""
    seen: set[bytes] = set()
    pems: list[bytes] = []
    for cert in certificates:
        der = cert.public_bytes(serialization.Encoding.DER)
        if der not in seen:
            seen.add(der)
            pems.append(cert.public_bytes(serialization.Encoding.PEM))
    bundle = b"".join(pems)
    write_atomic(Path(out_path), bundle, 0o644)
    return base64.b64encode(bundle).decode("ascii")


def _service_names(
    service: str, namespace: str, hosts: Iterable[str]
) -> tuple[list[str], list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    dns_names = [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]
    ip_addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for raw in hosts:
        host = raw.strip()
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            name = host.lower().rstrip(".")
            if not _DNS_NAME.match(name) or len(name) > 253:
                raise CertsError(
                    f"--host {raw!r} is neither an IP address nor a DNS name"
                ) from None
            if name not in dns_names:
                dns_names.append(name)
        else:
            if ip not in ip_addresses:
                ip_addresses.append(ip)
    return dns_names, ip_addresses


def _check_dns_label(value: str, what: str) -> None:
    if not _DNS_LABEL.match(value):
        raise CertsError(f"{what} {value!r} is not a valid DNS label (RFC 1123)")


def _new_key(key_type: str) -> ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey:
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=3072)
    return ec.generate_private_key(ec.SECP256R1())


def _make_ca_cert(
    key: Any, service: str, namespace: str, now: datetime, days: int
) -> x509.Certificate:
    # A timestamp in the name tells CAs of successive rotations apart in a bundle,
    # as kube-apiserver does for its self-signed certificates.
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpu-admission"),
            x509.NameAttribute(
                NameOID.COMMON_NAME, f"{service}.{namespace}-ca@{int(now.timestamp())}"
            ),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )


def _make_serving_cert(
    key: Any,
    ca_cert: x509.Certificate,
    ca_key: Any,
    service: str,
    namespace: str,
    dns_names: Sequence[str],
    ip_addresses: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address],
    now: datetime,
    not_after: datetime,
) -> x509.Certificate:
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in ip_addresses]
    try:
        ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    return (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service}.{namespace}.svc")])
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                # RSA key exchange encrypts with the certificate's key; ECDSA never does.
                key_encipherment=isinstance(key, rsa.RSAPrivateKey),
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(aki, critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _serial() -> int:
    # Positive, at most 20 octets (RFC 5280), 159 random bits.
    return secrets.randbits(159) | 1


def _private_pem(key: Any) -> bytes:
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _load_ca(cert_path: Path, key_path: Path, now: datetime) -> tuple[bytes, x509.Certificate, Any]:
    """Read and check an existing CA, so a wrong file fails here and not in the cluster."""
    certs = read_certificates(cert_path)
    if len(certs) != 1:
        raise CertsError(f"{cert_path}: expected one CA certificate, found {len(certs)}")
    cert = certs[0]
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise CertsError(f"{cert_path}: not a CA certificate (BasicConstraints CA is not true)")
    if cert.not_valid_after_utc <= now:
        raise CertsError(f"{cert_path}: the CA expired on {cert.not_valid_after_utc:%Y-%m-%d}")
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        raise CertsError(unreadable_file(key_path, exc)) from None
    except (ValueError, TypeError) as exc:
        raise CertsError(f"{key_path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertsError(f"{key_path}: only ECDSA and RSA CA keys are supported")
    if spki(key.public_key()) != spki(cert.public_key()):
        raise CertsError(f"{key_path} is not the key of the CA certificate {cert_path}")
    # Copy the CA file as it is: a byte-identical ca.crt keeps the caBundle unchanged.
    return cert_path.read_bytes(), cert, key


def spki(public_key: Any) -> bytes:
    """The DER SubjectPublicKeyInfo of a key: equal for a certificate and its key."""
    return bytes(
        public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def read_certificates(path: Path) -> list[x509.Certificate]:
    """The PEM certificates of a file; a file with a private key is refused."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CertsError(unreadable_file(path, exc)) from None
    if b"PRIVATE KEY" in data:
        raise CertsError(f"{path} contains a private key; refusing to use it as a certificate")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertsError(f"{path}: not a PEM certificate") from None
    return certs


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write through a temporary file in the same directory, then rename over path.

    mkstemp creates the file 0600, so a key is never readable by others, not even briefly;
    the rename is atomic because source and target are on the same file system.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ca_bundle_pem(cert_dir: Path, ca_bundle_path: str | os.PathLike[str] | None) -> bytes:
    """The caBundle to publish: an explicit file, else ca-bundle.crt (rotation), else ca.crt."""
    if ca_bundle_path is not None:
        path = Path(ca_bundle_path)
    elif (cert_dir / CA_BUNDLE).exists():
        path = cert_dir / CA_BUNDLE
    else:
        path = cert_dir / CA_CERT
    certs = read_certificates(path)  # validates, and refuses private keys
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def read_file(path: Path) -> bytes:
    """A file's bytes; an unreadable file is a CertsError naming it."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CertsError(unreadable_file(path, exc)) from None


def check_pair(cert_path: Path, cert_pem: bytes, key_path: Path, key_pem: bytes) -> None:
    """Refuse to install a certificate with someone else's key: the TLS server would fail."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise CertsError(f"{cert_path}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise CertsError(f"{key_path}: not an unencrypted PEM private key") from None
    if spki(key.public_key()) != spki(cert.public_key()):
        raise CertsError(f"{key_path} is not the key of {cert_path}")
