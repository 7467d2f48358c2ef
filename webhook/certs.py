"""Serving certificates for the webhook: generate them, and install them into a cluster.

The Kubernetes API server only calls an admission webhook over HTTPS, and it verifies the
webhook's certificate against the ``caBundle`` of the webhook configuration. This module
makes a small private CA plus a serving certificate for the webhook Service, and puts them
where they are needed: a ``kubernetes.io/tls`` Secret mounted by the webhook Pods, and the
``caBundle`` of every webhook entry (through the API, or in manifests for GitOps).

Production clusters should rather use the cert-manager overlay; this is the path for local
development, CI and simple clusters, and it also documents what cert-manager does for us.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import os
import re
import secrets
import sys
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

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
CA_BUNDLE = "ca-bundle.crt"

KEY_TYPES = ("ecdsa", "rsa")
WEBHOOK_CONFIGURATION_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
# Manifests that cert-manager's CA injector fills in must not get a hand-made caBundle.
CERT_MANAGER_INJECT_ANNOTATIONS = (
    "cert-manager.io/inject-ca-from",
    "cert-manager.io/inject-ca-from-secret",
)

# Certificates start a little in the past: clocks of the API server and of the machine
# that generated them are rarely identical, and "not yet valid" is a confusing failure.
_BACKDATE = timedelta(minutes=5)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class CertsError(Exception):
    """A problem with certificate material or its inputs, worded for a one-line report."""


class InstallError(CertsError):
    """The cluster refused or lacks what ``install`` needs (403, missing objects, ...)."""


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


@dataclass(frozen=True)
class InstallResult:
    """What :func:`install` changed, so the CLI can say it in one line per object."""

    secret: str  # "created", "updated" or "unchanged"
    webhook_configurations: tuple[str, ...]  # "Kind/name: N webhook(s) patched|unchanged"


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
        _write_atomic(paths[CA_KEY], _private_pem(ca_key), 0o600)
    _write_atomic(paths[CA_CERT], ca_pem, 0o644)
    _write_atomic(paths[TLS_KEY], _private_pem(key), 0o600)
    _write_atomic(paths[TLS_CERT], cert.public_bytes(serialization.Encoding.PEM), 0o644)
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
    return _write_bundle(out_path, [c for p in ca_paths for c in _read_certificates(Path(p))])


def _write_bundle(out_path: str | os.PathLike[str], certificates: list[x509.Certificate]) -> str:
    seen: set[bytes] = set()
    pems: list[bytes] = []
    for cert in certificates:
        der = cert.public_bytes(serialization.Encoding.DER)
        if der not in seen:
            seen.add(der)
            pems.append(cert.public_bytes(serialization.Encoding.PEM))
    bundle = b"".join(pems)
    _write_atomic(Path(out_path), bundle, 0o644)
    return base64.b64encode(bundle).decode("ascii")


def certificate_not_after(path: str | os.PathLike[str]) -> datetime:
    """Expiry (timezone-aware UTC) of the first certificate in a PEM file.

    The server exports this as a metric so that an alert fires before the certificate
    the API server verifies runs out.
    """
    return _read_certificates(Path(path))[0].not_valid_after_utc


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
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_ca(cert_path: Path, key_path: Path, now: datetime) -> tuple[bytes, x509.Certificate, Any]:
    """Read and check an existing CA, so a wrong file fails here and not in the cluster."""
    certs = _read_certificates(cert_path)
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
        raise CertsError(f"cannot read CA key {key_path}: {exc.strerror}") from None
    except (ValueError, TypeError) as exc:
        raise CertsError(f"{key_path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertsError(f"{key_path}: only ECDSA and RSA CA keys are supported")
    if _spki(key.public_key()) != _spki(cert.public_key()):
        raise CertsError(f"{key_path} is not the key of the CA certificate {cert_path}")
    # Copy the CA file as it is: a byte-identical ca.crt keeps the caBundle unchanged.
    return cert_path.read_bytes(), cert, key


def _spki(public_key: Any) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _read_certificates(path: Path) -> list[x509.Certificate]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CertsError(f"cannot read {path}: {exc.strerror}") from None
    if b"PRIVATE KEY" in data:
        raise CertsError(f"{path} contains a private key; refusing to use it as a certificate")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertsError(f"{path}: not a PEM certificate") from None
    return certs


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
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


# --------------------------------------------------------------------------- installation


def _bundle_for(cert_dir: Path, ca_bundle_path: str | os.PathLike[str] | None) -> bytes:
    """The caBundle to publish: an explicit file, else ca-bundle.crt (rotation), else ca.crt."""
    if ca_bundle_path is not None:
        path = Path(ca_bundle_path)
    elif (cert_dir / CA_BUNDLE).exists():
        path = cert_dir / CA_BUNDLE
    else:
        path = cert_dir / CA_CERT
    certs = _read_certificates(path)  # validates, and refuses private keys
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CertsError(f"cannot read {path}: {exc.strerror}") from None


def install(
    api_client: Any,
    *,
    namespace: str,
    secret_name: str,
    cert_dir: str | os.PathLike[str],
    validating_webhook_name: str | None,
    mutating_webhook_name: str | None,
    ca_bundle_path: str | os.PathLike[str] | None = None,
) -> InstallResult:
    """Put the certificates of cert_dir into the cluster behind api_client.

    Creates or updates the ``kubernetes.io/tls`` Secret (``tls.crt``, ``tls.key``,
    ``ca.crt``) and sets ``clientConfig.caBundle`` on every webhook of the named
    Validating- and MutatingWebhookConfiguration (a name of None or "" skips one).

    Both configurations are read before anything is written, so a missing configuration
    or missing permission fails without a half-done install. The caBundle is patched
    before the Secret: with a rotation bundle (old + new CA) the API server then trusts
    the new certificate before any Pod serves it.
    """
    from kubernetes import client as k8s

    directory = Path(cert_dir)
    tls_crt = _read_file(directory / TLS_CERT)
    tls_key = _read_file(directory / TLS_KEY)
    ca_crt = _read_file(directory / CA_CERT)
    _check_pair(directory / TLS_CERT, tls_crt, directory / TLS_KEY, tls_key)
    bundle_b64 = base64.b64encode(_bundle_for(directory, ca_bundle_path)).decode("ascii")

    server = api_client.configuration.host
    core = k8s.CoreV1Api(api_client)
    admission = k8s.AdmissionregistrationV1Api(api_client)
    targets = []
    for kind, name, read, patch in (
        (
            "ValidatingWebhookConfiguration",
            validating_webhook_name,
            admission.read_validating_webhook_configuration,
            admission.patch_validating_webhook_configuration,
        ),
        (
            "MutatingWebhookConfiguration",
            mutating_webhook_name,
            admission.read_mutating_webhook_configuration,
            admission.patch_mutating_webhook_configuration,
        ),
    ):
        if not name:
            continue
        obj = _call(
            lambda read=read, name=name: _json(read(name, _preload_content=False), server),
            f"read {kind} {name!r}",
            kind=kind,
            name=name,
        )
        targets.append((kind, name, obj, patch))

    reports = []
    for kind, name, obj, patch in targets:
        webhooks = obj.get("webhooks") or []
        ops: list[dict[str, Any]] = []
        for index, webhook in enumerate(webhooks):
            if (webhook.get("clientConfig") or {}).get("caBundle") == bundle_b64:
                continue
            # "test" pins each index to the webhook read above: if someone reorders the
            # list meanwhile, the patch fails instead of touching the wrong entry.
            ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]})
            if "clientConfig" in webhook:
                ops.append(
                    {
                        "op": "add",
                        "path": f"/webhooks/{index}/clientConfig/caBundle",
                        "value": bundle_b64,
                    }
                )
            else:
                ops.append(
                    {
                        "op": "add",
                        "path": f"/webhooks/{index}/clientConfig",
                        "value": {"caBundle": bundle_b64},
                    }
                )
        if ops:
            _call(
                lambda patch=patch, name=name, ops=ops: patch(name, ops, _preload_content=False),
                f"patch {kind} {name!r}",
                kind=kind,
                name=name,
            )
        changed = len(ops) // 2
        state = f"{changed} webhook(s) patched" if changed else "unchanged"
        reports.append(f"{kind}/{name}: {state} ({len(webhooks)} webhook(s))")

    data = {
        TLS_CERT: base64.b64encode(tls_crt).decode("ascii"),
        TLS_KEY: base64.b64encode(tls_key).decode("ascii"),
        CA_CERT: base64.b64encode(ca_crt).decode("ascii"),
    }
    secret = k8s.V1Secret(
        api_version="v1",
        kind="Secret",
        metadata=k8s.V1ObjectMeta(
            name=secret_name,
            namespace=namespace,
            labels={
                "app.kubernetes.io/name": "gpu-admission",
                "app.kubernetes.io/component": "webhook-tls",
            },
        ),
        type="kubernetes.io/tls",
        data=data,
    )
    what = f"Secret {namespace}/{secret_name}"
    try:
        _call(
            lambda: core.create_namespaced_secret(namespace, secret, _preload_content=False),
            f"create {what}",
            kind="Namespace",
            name=namespace,
        )
        secret_state = "created"
    except _Conflict:
        existing = _call(
            lambda: _json(
                core.read_namespaced_secret(secret_name, namespace, _preload_content=False),
                server,
            ),
            f"read {what}",
            kind="Secret",
            name=f"{namespace}/{secret_name}",
        )
        if existing.get("type") != "kubernetes.io/tls":
            raise InstallError(
                f"{what} exists with type {existing.get('type')!r}, not kubernetes.io/tls; "
                "delete it or choose another --secret"
            ) from None
        if all((existing.get("data") or {}).get(k) == v for k, v in data.items()):
            secret_state = "unchanged"
        else:
            # A merge patch of data only keeps labels and annotations others have set.
            _call(
                lambda: core.patch_namespaced_secret(
                    secret_name, namespace, {"data": data}, _preload_content=False
                ),
                f"update {what}",
                kind="Secret",
                name=f"{namespace}/{secret_name}",
            )
            secret_state = "updated"
    return InstallResult(secret=secret_state, webhook_configurations=tuple(reports))


class _Conflict(Exception):
    pass


def _json(response: Any, server: str) -> dict[str, Any]:
    try:
        body = json.loads(response.data)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        # A proxy or a web server at the kubeconfig's address answers 200 with HTML.
        raise InstallError(
            f"the server at {server} did not answer as a Kubernetes API server (the body of a "
            f"{response.status} answer is not a JSON object): check the kubeconfig's server "
            "address"
        )
    return body


def _call(fn: Any, action: str, *, kind: str, name: str) -> Any:
    """Run one API call and turn its failures into one clear line.

    The raw ApiException prints headers and the whole response body; an operator needs the
    verb, the object and the API server's own message.
    """
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return fn()
    except ApiException as exc:
        message = _status_message(exc)
        if exc.status == 409 and action.startswith("create"):
            raise _Conflict() from None
        if exc.status == 403:
            raise InstallError(
                f"cannot {action}: forbidden (HTTP 403): {message}; check the RBAC of the "
                "identity in your kubeconfig"
            ) from None
        if exc.status == 401:
            raise InstallError(f"cannot {action}: unauthorized (HTTP 401): {message}") from None
        if exc.status == 404:
            hint = {
                "ValidatingWebhookConfiguration": "apply the webhook manifests first or pass "
                "--validating NAME",
                "MutatingWebhookConfiguration": "apply the webhook manifests first or pass "
                "--mutating NAME",
                "Namespace": "create the namespace first or pass --namespace",
            }.get(kind, "it does not exist")
            raise InstallError(f"cannot {action}: {kind} {name!r} not found; {hint}") from None
        raise InstallError(f"cannot {action}: HTTP {exc.status} {exc.reason}: {message}") from None
    except HTTPError as exc:
        reason = getattr(exc, "reason", None) or exc
        raise InstallError(f"cannot {action}: Kubernetes API unreachable: {reason}") from None


def _status_message(exc: Any) -> str:
    try:
        status = json.loads(exc.body)
        return str(status.get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _check_pair(cert_path: Path, cert_pem: bytes, key_path: Path, key_pem: bytes) -> None:
    """Refuse to install a certificate with someone else's key: the TLS server would fail."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise CertsError(f"{cert_path}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise CertsError(f"{key_path}: not an unencrypted PEM private key") from None
    if _spki(key.public_key()) != _spki(cert.public_key()):
        raise CertsError(f"{key_path} is not the key of {cert_path}")


def install_into_manifests(
    manifests_dir: str | os.PathLike[str],
    cert_dir: str | os.PathLike[str],
    *,
    ca_bundle_path: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """GitOps mode: set caBundle in webhook configurations found in YAML files; return them.

    Every ``*.yaml``/``*.yml`` file under manifests_dir holding a Validating- or
    MutatingWebhookConfiguration gets ``clientConfig.caBundle`` set on each webhook entry;
    multi-document files keep all their documents. Only the CA certificate(s) are read from
    cert_dir: the private key never goes into manifests. Objects annotated for
    cert-manager's CA injector are left alone, and unchanged files are not rewritten.

    The files are loaded with PyYAML to decide what changes, but the change is made as a
    small edit of the text (located through PyYAML's node positions), because manifests
    carry comments that explain them and a dump would drop every one. The edited text is
    loaded again and must equal the intended objects; if it does not (exotic YAML), the
    file is dumped by PyYAML instead, which is correct but loses its comments.
    """
    import yaml

    bundle_b64 = base64.b64encode(_bundle_for(Path(cert_dir), ca_bundle_path)).decode("ascii")
    root = Path(manifests_dir)
    if not root.is_dir():
        raise CertsError(f"{root} is not a directory")
    changed: list[Path] = []
    files = sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise CertsError(f"{path}: not UTF-8 text, not a YAML manifest") from None
        except OSError as exc:
            raise CertsError(f"cannot read {path}: {exc.strerror}") from None
        if "WebhookConfiguration" not in text:
            continue
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else str(path)
            problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
            raise CertsError(f"{where}: invalid YAML: {problem}") from None
        modified = False
        for doc in documents:
            for webhook in _webhook_entries(doc):
                client_config = webhook.get("clientConfig")
                if not isinstance(client_config, dict):
                    client_config = webhook["clientConfig"] = {}
                if client_config.get("caBundle") != bundle_b64:
                    client_config["caBundle"] = bundle_b64
                    modified = True
        if not modified:
            continue
        new_text = _edit_ca_bundles(text, bundle_b64)
        if new_text is None or list(yaml.safe_load_all(new_text)) != documents:
            new_text = yaml.safe_dump_all(
                [d for d in documents if d is not None], sort_keys=False, width=1 << 16
            )
        _write_atomic(path, new_text.encode("utf-8"), path.stat().st_mode & 0o777)
        changed.append(path)
    return changed


def _webhook_entries(doc: Any) -> list[dict[str, Any]]:
    """The webhook entries of a webhook configuration that should get our caBundle."""
    if not (
        isinstance(doc, dict)
        and doc.get("kind") in WEBHOOK_CONFIGURATION_KINDS
        and str(doc.get("apiVersion", "")).startswith("admissionregistration.k8s.io/")
    ):
        return []
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    if any(a in annotations for a in CERT_MANAGER_INJECT_ANNOTATIONS):
        return []
    return [w for w in doc.get("webhooks") or [] if isinstance(w, dict)]


def _edit_ca_bundles(text: str, bundle_b64: str) -> str | None:
    """Set every caBundle by editing text in place; None when a shape is not handled."""
    import yaml

    newline = "\r\n" if "\r\n" in text else "\n"
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement)

    def pairs(node: Any) -> dict[str, tuple[Any, Any]]:
        return {k.value: (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}

    def insert_first(mapping: Any, entry: str) -> None:
        first_key = mapping.value[0][0]
        at = first_key.start_mark.index
        separator = ", " if mapping.flow_style else newline + " " * first_key.start_mark.column
        edits.append((at, at, entry + separator))

    for doc in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if not isinstance(doc, yaml.MappingNode):
            continue
        top = pairs(doc)
        loaded = yaml.safe_load(yaml.serialize(doc))
        if not _webhook_entries(loaded):
            continue
        webhooks = top["webhooks"][1]
        if not isinstance(webhooks, yaml.SequenceNode):
            return None
        for webhook in webhooks.value:
            if not isinstance(webhook, yaml.MappingNode) or not webhook.value:
                return None
            entry = pairs(webhook).get("clientConfig")
            if entry is None:
                insert_first(webhook, f"clientConfig: {{caBundle: {bundle_b64}}}")
                continue
            client_config = entry[1]
            if not isinstance(client_config, yaml.MappingNode):
                return None
            if not client_config.value:  # {}
                start, end = client_config.start_mark.index, client_config.end_mark.index
                edits.append((start, end, f"{{caBundle: {bundle_b64}}}"))
                continue
            ca_entry = pairs(client_config).get("caBundle")
            if ca_entry is None:
                insert_first(client_config, f"caBundle: {bundle_b64}")
                continue
            key, value = ca_entry
            if not isinstance(value, yaml.ScalarNode):
                return None
            if value.value == bundle_b64:
                continue
            start, end = value.start_mark.index, value.end_mark.index
            if start == end:  # "caBundle:" with no value
                colon = text.find(":", key.end_mark.index)
                if colon < 0:
                    return None
                start = end = colon + 1
                edits.append((start, end, f" {bundle_b64}"))
            else:
                edits.append((start, end, bundle_b64))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


# --------------------------------------------------------------------------- command line

_CERTS_EPILOG = """\
examples:
  gpu-admission certs generate --out certs              # a new CA and serving certificate
  gpu-admission certs install --cert-dir certs          # the Secret and both caBundles
  gpu-admission certs install --cert-dir certs --manifests deploy/   # GitOps

`gpu-admission certs SUBCOMMAND --help` shows renewal, CA rotation and the options.
Production clusters should rather use the cert-manager overlay.
"""

_GENERATE_EPILOG = """\
examples:
  # local development (what `make run` does): also valid for 127.0.0.1 and localhost
  gpu-admission certs generate --out certs --host 127.0.0.1 --host localhost

  # a cluster: the Service gpu-admission in namespace gpu-admission
  gpu-admission certs generate --service gpu-admission --namespace gpu-admission --out certs
  gpu-admission certs install --cert-dir certs

  # renew the serving certificate with the same CA: the caBundle stays the same
  gpu-admission certs generate --out certs --ca-cert certs/ca.crt --ca-key certs/ca.key --force

  # rotate the CA: new CA, caBundle trusting new + old CA (written to certs/ca-bundle.crt)
  cp certs/ca.crt old-ca.crt
  gpu-admission certs generate --out certs --force --bundle-old-ca old-ca.crt

An existing out/tls.crt is kept unless --force is given (the command is idempotent).
stdout is the base64 caBundle, ready for a webhook's clientConfig.caBundle.
"""

_INSTALL_EPILOG = """\
examples:
  # Secret gpu-admission/gpu-admission-tls and the caBundle of both configurations
  gpu-admission certs install --cert-dir certs

  # another cluster and names; an empty name skips that configuration
  gpu-admission certs install --kubeconfig ~/.kube/prod --context prod \\
      --namespace gpu-system --secret webhook-tls --validating gpu-admission --mutating ''

  # GitOps: write the caBundle into the manifests instead of the cluster (no key is written)
  gpu-admission certs install --cert-dir certs --manifests deploy/

The caBundle is certs/ca-bundle.crt when present (a CA rotation), else certs/ca.crt.
Needs get/patch on validating- and mutatingwebhookconfigurations, and create/get/patch on
secrets in the namespace.
"""


def add_subcommands(subparsers: Any) -> None:
    """Register ``certs generate`` and ``certs install`` on the top-level sub-parsers."""
    certs = subparsers.add_parser(
        "certs",
        help="generate and install the webhook's TLS certificates",
        description="Generate the webhook's serving certificate and CA, and install them.",
        epilog=_CERTS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = certs.add_subparsers(dest="certs_command", metavar="SUBCOMMAND", required=True)

    gen = commands.add_parser(
        "generate",
        help="create a CA and a serving certificate for the webhook Service",
        description=(
            "Create a CA (or reuse one) and a serving certificate for the webhook Service,\n"
            "written as ca.crt, tls.crt, tls.key (and ca.key for a new CA) in --out."
        ),
        epilog=_GENERATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument("--service", default="gpu-admission", help="Service name (%(default)s)")
    gen.add_argument("--namespace", default="gpu-admission", help="namespace (%(default)s)")
    gen.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    gen.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="HOST",
        help="extra DNS name or IP address for the certificate (repeatable)",
    )
    gen.add_argument("--ca-cert", metavar="PATH", help="existing CA certificate to sign with")
    gen.add_argument("--ca-key", metavar="PATH", help="key of --ca-cert")
    gen.add_argument(
        "--days",
        type=int,
        default=365,
        help="validity of the serving certificate in days (%(default)s)",
    )
    gen.add_argument(
        "--ca-days", type=int, default=3650, help="validity of a new CA in days (%(default)s)"
    )
    gen.add_argument(
        "--key-type",
        choices=KEY_TYPES,
        default="ecdsa",
        help="ecdsa (P-256) or rsa (3072 bits) (%(default)s)",
    )
    gen.add_argument(
        "--bundle-old-ca",
        action="append",
        default=[],
        metavar="PATH",
        help="also write ca-bundle.crt = new CA + this old CA (repeatable)",
    )
    gen.add_argument("--force", action="store_true", help="overwrite an existing tls.crt")
    gen.set_defaults(func=_cmd_generate)

    inst = commands.add_parser(
        "install",
        help="put the certificates into the cluster (Secret + caBundle) or into manifests",
        description=(
            "Create or update the kubernetes.io/tls Secret and patch the caBundle of every\n"
            "webhook in the Validating- and MutatingWebhookConfiguration; with --manifests,\n"
            "write the caBundle into YAML files instead."
        ),
        epilog=_INSTALL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inst.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: usual)")
    inst.add_argument("--context", help="kubeconfig context (default: current)")
    inst.add_argument(
        "--namespace", default="gpu-admission", help="namespace of the Secret (%(default)s)"
    )
    inst.add_argument("--secret", default="gpu-admission-tls", help="Secret name (%(default)s)")
    inst.add_argument(
        "--cert-dir",
        default="certs",
        metavar="DIR",
        help="directory written by `certs generate` (%(default)s)",
    )
    inst.add_argument(
        "--validating",
        default="gpu-admission",
        metavar="NAME",
        help="ValidatingWebhookConfiguration name, '' to skip (%(default)s)",
    )
    inst.add_argument(
        "--mutating",
        default="gpu-admission",
        metavar="NAME",
        help="MutatingWebhookConfiguration name, '' to skip (%(default)s)",
    )
    inst.add_argument(
        "--ca-bundle",
        metavar="PATH",
        help="caBundle file (default: ca-bundle.crt if present, else ca.crt)",
    )
    inst.add_argument(
        "--manifests",
        metavar="DIR",
        help="GitOps: set caBundle in YAML files under DIR instead of the API",
    )
    inst.set_defaults(func=_cmd_install)


def _cmd_generate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    # Read before generate() writes tls.crt and tls.key: a wrong file must fail the command
    # with the certificates in out as they were, not half-rotated.
    old_cas = [cert for path in args.bundle_old_ca for cert in _read_certificates(Path(path))]
    if (out / TLS_CERT).exists() and not args.force:
        print(f"{out / TLS_CERT} exists; keeping it (pass --force to regenerate)", file=sys.stderr)
        existing = out / CA_BUNDLE if (out / CA_BUNDLE).exists() else out / CA_CERT
        if existing.exists():
            print(base64.b64encode(existing.read_bytes()).decode("ascii"))
        return 0
    result = generate(
        out,
        service=args.service,
        namespace=args.namespace,
        hosts=args.host,
        ca_cert_path=args.ca_cert,
        ca_key_path=args.ca_key,
        validity_days=args.days,
        ca_validity_days=args.ca_days,
        key_type=args.key_type,
    )
    ca_note = "new CA" if result.ca_created else f"CA {args.ca_cert} (caBundle unchanged)"
    print(
        f"wrote {result.tls_cert} and {result.tls_key} signed by {ca_note}; "
        f"valid until {result.not_after:%Y-%m-%d %H:%M} UTC for {', '.join(result.sans)}",
        file=sys.stderr,
    )
    bundle_b64 = result.ca_bundle_b64
    if args.bundle_old_ca:
        bundle_path = out / CA_BUNDLE
        bundle_b64 = _write_bundle(bundle_path, [*_read_certificates(result.ca_cert), *old_cas])
        print(
            f"wrote {bundle_path}: new CA + {len(args.bundle_old_ca)} old CA file(s)",
            file=sys.stderr,
        )
    print(bundle_b64)
    return 0


def _cmd_install(args: argparse.Namespace) -> int:
    if args.manifests:
        changed = install_into_manifests(
            args.manifests, args.cert_dir, ca_bundle_path=args.ca_bundle
        )
        for path in changed:
            print(f"caBundle set in {path}")
        if not changed:
            print(f"no webhook configuration under {args.manifests} needed a change")
        return 0
    result = install(
        _api_client(args.kubeconfig, args.context),
        namespace=args.namespace,
        secret_name=args.secret,
        cert_dir=args.cert_dir,
        validating_webhook_name=args.validating,
        mutating_webhook_name=args.mutating,
        ca_bundle_path=args.ca_bundle,
    )
    for line in result.webhook_configurations:
        print(line)
    print(f"Secret {args.namespace}/{args.secret}: {result.secret}")
    return 0


def _api_client(kubeconfig: str | None, context: str | None) -> Any:
    """A client from --kubeconfig/--context, else in-cluster, else the usual kubeconfig."""
    from kubernetes import client as k8s
    from kubernetes import config

    from webhook.cli import KUBECONFIG_ERRORS, not_a_kubeconfig

    if kubeconfig is not None and not Path(kubeconfig).is_file():
        raise CertsError(f"kubeconfig {kubeconfig} does not exist")
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            return k8s.ApiClient()
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except config.ConfigException as exc:
        message = " ".join(str(exc).split())
        raise CertsError(f"cannot load Kubernetes configuration: {message}") from None
    except KUBECONFIG_ERRORS as exc:
        raise CertsError(not_a_kubeconfig(kubeconfig, exc)) from None
