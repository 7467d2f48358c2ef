"""``webhook.certs``: certificate generation, TLS with the result, and installation into a
cluster (the fake API server of tests/kubeapi.py) or into manifests."""

from __future__ import annotations

import argparse
import base64
import io
import ipaddress
import shutil
import socket
import ssl
import stat
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.kubeapi import FakeKubeAPI, web_server
from tests.support.kube import kustomize_text
from webhook.certs import gitops, pki
from webhook.certs import install as cluster_install
from webhook.cli import certs as certs_command

SERVICE = "gpu-admission"
NAMESPACE = "gpu-admission"
SERVICE_NAMES = [
    "gpu-admission",
    "gpu-admission.gpu-admission",
    "gpu-admission.gpu-admission.svc",
    "gpu-admission.gpu-admission.svc.cluster.local",
]


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _certs(path: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(path.read_bytes())


def _verify_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    """Check the signature with the CA's public key (raises InvalidSignature otherwise)."""
    assert cert.issuer == ca.subject
    public_key = ca.public_key()
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        public_key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )
    else:
        assert isinstance(public_key, rsa.RSAPublicKey)
        public_key.verify(
            cert.signature,
            cert.tbs_certificate_bytes,
            padding.PKCS1v15(),
            cert.signature_hash_algorithm,
        )
    ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ca_ski.digest


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _generate(out: Path, **kwargs) -> pki.GeneratedCertificates:
    kwargs.setdefault("service", SERVICE)
    kwargs.setdefault("namespace", NAMESPACE)
    return pki.generate(out, **kwargs)


def _cli(argv: list[str]) -> int:
    """Run a `certs` sub-command through a parser like webhook/cli/main.py builds."""
    parser = argparse.ArgumentParser(prog="gpu-admission")
    commands = parser.add_subparsers(dest="command", required=True)
    certs_command.add_subcommands(commands)
    args = parser.parse_args(["certs", *argv])
    return args.func(args)


# ----------------------------------------------------------------------------- generate


def test_generate_serving_certificate(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    result = _generate(out, hosts=["127.0.0.1", "localhost", "::1", "Webhook.Example.com."])

    cert, ca = _cert(out / "tls.crt"), _cert(out / "ca.crt")
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        *SERVICE_NAMES,
        "localhost",
        "webhook.example.com",
    ]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        "gpu-admission.gpu-admission.svc"
    )

    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca is False
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical
    assert usage.value.digital_signature
    assert not usage.value.key_encipherment  # ECDSA keys never encrypt
    assert not usage.value.key_cert_sign

    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    _verify_signed_by(cert, ca)
    _verify_signed_by(ca, ca)  # self-signed root

    key = serialization.load_pem_private_key((out / "tls.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    assert key.public_key() == cert.public_key()

    assert _mode(out / "tls.key") == 0o600
    assert _mode(out / "ca.key") == 0o600
    assert _mode(out / "tls.crt") == 0o644
    assert _mode(out / "ca.crt") == 0o644
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]

    assert result.ca_created and result.ca_key == out / "ca.key"
    assert result.tls_cert == out / "tls.crt" and result.tls_key == out / "tls.key"
    assert base64.b64decode(result.ca_bundle_b64) == (out / "ca.crt").read_bytes()
    assert result.not_after == cert.not_valid_after_utc
    assert _cert(out / "tls.crt").not_valid_after_utc == result.not_after
    now = datetime.now(UTC)
    assert timedelta(days=364) < result.not_after - now <= timedelta(days=365)
    assert cert.not_valid_before_utc < now  # backdated against clock skew


def test_generate_rsa(tmp_path: Path) -> None:
    _generate(tmp_path, key_type="rsa", validity_days=30)
    cert, ca = _cert(tmp_path / "tls.crt"), _cert(tmp_path / "ca.crt")
    key = serialization.load_pem_private_key((tmp_path / "tls.key").read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 3072
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and usage.key_encipherment
    _verify_signed_by(cert, ca)


def test_reusing_the_ca_keeps_ca_crt_byte_identical(tmp_path: Path) -> None:
    first = _generate(tmp_path / "first")
    ca_bytes = (tmp_path / "first" / "ca.crt").read_bytes()
    old_serving = (tmp_path / "first" / "tls.crt").read_bytes()

    # Renewal in place, the way certs/README.md and --help describe it.
    renewed = _generate(
        tmp_path / "first",
        ca_cert_path=tmp_path / "first" / "ca.crt",
        ca_key_path=tmp_path / "first" / "ca.key",
    )
    assert (tmp_path / "first" / "ca.crt").read_bytes() == ca_bytes
    assert (tmp_path / "first" / "tls.crt").read_bytes() != old_serving
    assert renewed.ca_bundle_b64 == first.ca_bundle_b64
    assert not renewed.ca_created and renewed.ca_key is None
    _verify_signed_by(_cert(tmp_path / "first" / "tls.crt"), _cert(tmp_path / "first" / "ca.crt"))

    # Into another directory: the CA key is not copied there.
    other = _generate(
        tmp_path / "other",
        ca_cert_path=tmp_path / "first" / "ca.crt",
        ca_key_path=tmp_path / "first" / "ca.key",
    )
    assert (tmp_path / "other" / "ca.crt").read_bytes() == ca_bytes
    assert not (tmp_path / "other" / "ca.key").exists()
    assert other.ca_bundle_b64 == first.ca_bundle_b64
    _verify_signed_by(_cert(tmp_path / "other" / "tls.crt"), _cert(tmp_path / "first" / "ca.crt"))


def test_reused_ca_is_checked(tmp_path: Path) -> None:
    _generate(tmp_path / "a")
    _generate(tmp_path / "b")
    with pytest.raises(pki.CertsError, match="is not the key of the CA certificate"):
        _generate(
            tmp_path / "c", ca_cert_path=tmp_path / "a/ca.crt", ca_key_path=tmp_path / "b/ca.key"
        )
    with pytest.raises(pki.CertsError, match="not a CA certificate"):
        _generate(
            tmp_path / "c", ca_cert_path=tmp_path / "a/tls.crt", ca_key_path=tmp_path / "a/tls.key"
        )
    with pytest.raises(pki.CertsError, match="contains a private key"):
        _generate(
            tmp_path / "c", ca_cert_path=tmp_path / "a/ca.key", ca_key_path=tmp_path / "a/ca.key"
        )
    with pytest.raises(pki.CertsError, match="both"):
        _generate(tmp_path / "c", ca_cert_path=tmp_path / "a/ca.crt")


def test_serving_certificate_does_not_outlive_its_ca(tmp_path: Path) -> None:
    result = _generate(tmp_path, validity_days=400, ca_validity_days=10)
    assert result.not_after == _cert(tmp_path / "ca.crt").not_valid_after_utc


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hosts": ["bad host"]}, "neither an IP address nor a DNS name"),
        ({"hosts": ["-x.example"]}, "neither an IP address nor a DNS name"),
        ({"service": "Bad_Service"}, "not a valid DNS label"),
        ({"key_type": "dsa"}, "unknown key type"),
        ({"validity_days": 0}, "at least one day"),
    ],
)
def test_generate_rejects_bad_input(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(pki.CertsError, match=message):
        _generate(tmp_path, **kwargs)
    assert not (tmp_path / "tls.crt").exists()


def test_cli_generate_is_idempotent_without_force(tmp_path: Path, capsys) -> None:
    out = tmp_path / "certs"
    argv = ["generate", "--out", str(out), "--host", "127.0.0.1"]
    assert _cli(argv) == 0
    first = capsys.readouterr()
    assert base64.b64decode(first.out.strip()) == (out / "ca.crt").read_bytes()
    files = {p.name: p.read_bytes() for p in out.iterdir()}

    assert _cli(argv) == 0
    second = capsys.readouterr()
    assert "exists" in second.err and "--force" in second.err
    assert second.out == first.out  # the caBundle is printed again for scripts
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files

    assert _cli([*argv, "--force"]) == 0
    third = capsys.readouterr()
    assert (out / "tls.crt").read_bytes() != files["tls.crt"]
    assert (out / "ca.crt").read_bytes() != files["ca.crt"]  # a new CA without --ca-cert
    assert base64.b64decode(third.out.strip()) == (out / "ca.crt").read_bytes()


def test_cli_generate_with_existing_ca(tmp_path: Path, capsys) -> None:
    out = tmp_path / "certs"
    assert _cli(["generate", "--out", str(out)]) == 0
    first = capsys.readouterr().out
    ca = (out / "ca.crt").read_bytes()
    argv = ["generate", "--out", str(out), "--force", "--days", "30"]
    argv += ["--ca-cert", str(out / "ca.crt"), "--ca-key", str(out / "ca.key")]
    assert _cli(argv) == 0
    assert capsys.readouterr().out == first
    assert (out / "ca.crt").read_bytes() == ca
    not_after = _cert(out / "tls.crt").not_valid_after_utc
    assert not_after - datetime.now(UTC) <= timedelta(days=30)


def test_cli_generate_bundles_the_old_ca(tmp_path: Path, capsys) -> None:
    out = tmp_path / "certs"
    assert _cli(["generate", "--out", str(out)]) == 0
    old_ca = tmp_path / "old-ca.crt"
    shutil.copy(out / "ca.crt", old_ca)
    capsys.readouterr()

    assert _cli(["generate", "--out", str(out), "--force", "--bundle-old-ca", str(old_ca)]) == 0
    printed = base64.b64decode(capsys.readouterr().out.strip())
    bundle = out / "ca-bundle.crt"
    assert printed == bundle.read_bytes()
    assert _certs(bundle) == [_cert(out / "ca.crt"), _cert(old_ca)]
    assert _cert(out / "ca.crt") != _cert(old_ca)
    assert _mode(bundle) == 0o644

    # A later generate without --bundle-old-ca drops the stale bundle (install prefers it).
    assert _cli(["generate", "--out", str(out), "--force"]) == 0
    assert not bundle.exists()


def test_write_ca_bundle_deduplicates_and_validates(tmp_path: Path) -> None:
    _generate(tmp_path / "a")
    _generate(tmp_path / "b")
    a, b = tmp_path / "a/ca.crt", tmp_path / "b/ca.crt"
    out = tmp_path / "bundle.crt"
    encoded = pki.write_ca_bundle(out, [a, b, a])
    assert _certs(out) == [_cert(a), _cert(b)]
    assert base64.b64decode(encoded) == out.read_bytes()

    # A bundle as input (a second rotation) is split and deduplicated too.
    pki.write_ca_bundle(tmp_path / "again.crt", [b, out])
    assert _certs(tmp_path / "again.crt") == [_cert(b), _cert(a)]

    with pytest.raises(pki.CertsError, match="private key"):
        pki.write_ca_bundle(tmp_path / "x.crt", [a, tmp_path / "a/ca.key"])
    (tmp_path / "junk.crt").write_text("not a certificate\n")
    with pytest.raises(pki.CertsError, match="not a PEM certificate"):
        pki.write_ca_bundle(tmp_path / "x.crt", [tmp_path / "junk.crt"])
    with pytest.raises(pki.CertsError, match="missing.crt: no such file or directory"):
        pki.write_ca_bundle(tmp_path / "x.crt", [tmp_path / "missing.crt"])
    assert not (tmp_path / "x.crt").exists()


def test_subcommand_help_has_examples(capsys) -> None:
    for command in ("generate", "install"):
        with pytest.raises(SystemExit) as exit_info:
            _cli([command, "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        assert "examples:" in text
        assert f"gpu-admission certs {command}" in text


# ----------------------------------------------------------------------------- TLS


class _TLSServer:
    """Accepts connections on 127.0.0.1:0 with the generated certificate, one at a time."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)  # closing does not wake accept(): poll the stop flag
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            try:
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass  # a client that rejected our certificate

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.mark.parametrize("key_type", ["ecdsa", "rsa"])
def test_tls_handshake_with_generated_certificate(tmp_path: Path, key_type: str) -> None:
    _generate(tmp_path, hosts=["127.0.0.1", "localhost"], key_type=key_type)
    server = _TLSServer(tmp_path / "tls.crt", tmp_path / "tls.key")
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    try:
        # The names the API server dials (the Service DNS name) and the ones of `make run`.
        for name in ("127.0.0.1", "localhost", "gpu-admission.gpu-admission.svc"):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
                with client.wrap_socket(raw, server_hostname=name) as tls:
                    assert tls.recv(2) == b"ok"
                    assert tls.version() in ("TLSv1.2", "TLSv1.3")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            with pytest.raises(ssl.SSLCertVerificationError):
                client.wrap_socket(raw, server_hostname="other.example.com")
        # A client trusting another CA refuses the certificate.
        _generate(tmp_path / "other")
        stranger = ssl.create_default_context(cafile=str(tmp_path / "other" / "ca.crt"))
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            with pytest.raises(ssl.SSLCertVerificationError):
                stranger.wrap_socket(raw, server_hostname="127.0.0.1")
    finally:
        server.close()


# ----------------------------------------------------------------------------- install

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
SECRET_PATH = "/api/v1/namespaces/gpu-admission/secrets/gpu-admission-tls"


def _seed_webhook_configurations(api: FakeKubeAPI) -> None:
    for kind, names in (
        ("ValidatingWebhookConfiguration", ["validate.gpu-admission.io", "audit.gpu-admission.io"]),
        ("MutatingWebhookConfiguration", ["mutate.gpu-admission.io", "default.gpu-admission.io"]),
    ):
        api.add(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": "gpu-admission"},
                "webhooks": [
                    {
                        "name": name,
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "clientConfig": {
                            "service": {"namespace": NAMESPACE, "name": SERVICE, "path": "/x"},
                            **({"caBundle": "b2xk"} if i else {}),
                        },
                    }
                    for i, name in enumerate(names)
                ],
            }
        )


def _install(client, cert_dir: Path, **kwargs) -> cluster_install.InstallResult:
    kwargs.setdefault("namespace", NAMESPACE)
    kwargs.setdefault("secret_name", "gpu-admission-tls")
    kwargs.setdefault("validating_webhook_name", "gpu-admission")
    kwargs.setdefault("mutating_webhook_name", "gpu-admission")
    return cluster_install.install(client, cert_dir=cert_dir, **kwargs)


def _ca_bundles(api: FakeKubeAPI) -> list[str]:
    bundles = []
    for plural in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        configuration = api.get(f"{ADMISSION}/{plural}/gpu-admission")
        assert configuration is not None
        bundles += [w["clientConfig"].get("caBundle") for w in configuration["webhooks"]]
    return bundles


def test_install_creates_then_updates(
    tmp_path: Path, kube_api: FakeKubeAPI, kube_api_client
) -> None:
    _seed_webhook_configurations(kube_api)
    out = tmp_path / "certs"
    generated = _generate(out)

    result = _install(kube_api_client, out)
    assert result.secret == "created"
    secret = kube_api.get(SECRET_PATH)
    assert secret is not None
    assert secret["type"] == "kubernetes.io/tls"
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == {
        name: (out / name).read_bytes() for name in ("tls.crt", "tls.key", "ca.crt")
    }
    assert _ca_bundles(kube_api) == [generated.ca_bundle_b64] * 4
    assert [line.split(":")[0] for line in result.webhook_configurations] == [
        "ValidatingWebhookConfiguration/gpu-admission",
        "MutatingWebhookConfiguration/gpu-admission",
    ]
    patches = kube_api.requests_to("PATCH", f"{ADMISSION}/*")
    assert [r.content_type for r in patches] == ["application/json-patch+json"] * 2

    # Someone annotates the Secret; a renewal under the same CA updates only the Secret's
    # data: the caBundle is unchanged, so the configurations are not even patched.
    secret["metadata"]["annotations"] = {"team": "ml-platform"}
    kube_api.add(secret)
    kube_api.requests.clear()
    _generate(out, ca_cert_path=out / "ca.crt", ca_key_path=out / "ca.key")
    renewed = _install(kube_api_client, out)
    assert renewed.secret == "updated"
    assert all("unchanged" in line for line in renewed.webhook_configurations)
    assert kube_api.requests_to("PATCH", f"{ADMISSION}/*") == []
    secret = kube_api.get(SECRET_PATH)
    assert base64.b64decode(secret["data"]["tls.crt"]) == (out / "tls.crt").read_bytes()
    assert secret["metadata"]["annotations"] == {"team": "ml-platform"}
    assert _ca_bundles(kube_api) == [generated.ca_bundle_b64] * 4

    assert _install(kube_api_client, out).secret == "unchanged"


def test_install_publishes_the_rotation_bundle(
    tmp_path: Path, kube_api: FakeKubeAPI, kube_api_client
) -> None:
    _seed_webhook_configurations(kube_api)
    out = tmp_path / "certs"
    _generate(out)
    _install(kube_api_client, out)
    old_ca = tmp_path / "old-ca.crt"
    shutil.copy(out / "ca.crt", old_ca)

    _generate(out)  # a new CA
    bundle_b64 = pki.write_ca_bundle(out / "ca-bundle.crt", [out / "ca.crt", old_ca])
    kube_api.requests.clear()
    _install(kube_api_client, out)
    assert _ca_bundles(kube_api) == [bundle_b64] * 4
    # The trust is extended before the serving certificate changes.
    calls = [(r.method, r.path) for r in kube_api.requests]
    assert calls.index(("PATCH", f"{ADMISSION}/mutatingwebhookconfigurations/gpu-admission")) < (
        calls.index(("PATCH", SECRET_PATH))
    )
    secret = kube_api.get(SECRET_PATH)
    assert base64.b64decode(secret["data"]["ca.crt"]) == (out / "ca.crt").read_bytes()


def test_install_forbidden_is_one_clear_line(
    tmp_path: Path, kube_api: FakeKubeAPI, kube_api_client
) -> None:
    _seed_webhook_configurations(kube_api)
    _generate(tmp_path)
    kube_api.forbid("/api/v1/namespaces/*/secrets*", method="POST")
    with pytest.raises(cluster_install.InstallError) as error:
        _install(kube_api_client, tmp_path)
    message = str(error.value)
    assert "\n" not in message
    assert "forbidden (HTTP 403)" in message
    assert 'cannot create resource "secrets"' in message
    assert "RBAC" in message


def test_install_forbidden_webhook_configuration_writes_nothing(
    tmp_path: Path, kube_api: FakeKubeAPI, kube_api_client
) -> None:
    _seed_webhook_configurations(kube_api)
    _generate(tmp_path)
    kube_api.forbid(f"{ADMISSION}/mutatingwebhookconfigurations/*")
    with pytest.raises(
        cluster_install.InstallError, match="cannot read MutatingWebhookConfiguration"
    ):
        _install(kube_api_client, tmp_path)
    assert [r.method for r in kube_api.requests] == ["GET", "GET"]


def test_install_missing_configuration(
    tmp_path: Path, kube_api: FakeKubeAPI, kube_api_client
) -> None:
    _seed_webhook_configurations(kube_api)
    _generate(tmp_path)
    with pytest.raises(cluster_install.InstallError) as error:
        _install(kube_api_client, tmp_path, mutating_webhook_name="gpu-admission-typo")
    message = str(error.value)
    assert "\n" not in message
    assert "MutatingWebhookConfiguration 'gpu-admission-typo' not found" in message
    assert "--mutating" in message
    assert all(r.method == "GET" for r in kube_api.requests)
    assert kube_api.get(SECRET_PATH) is None


def test_install_skips_an_empty_name_and_refuses_a_foreign_secret(
    tmp_path: Path, kube_api: FakeKubeAPI, kube_api_client
) -> None:
    _seed_webhook_configurations(kube_api)
    generated = _generate(tmp_path)
    kube_api.add(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": "gpu-admission-tls", "namespace": NAMESPACE},
            "data": {"password": "aHVudGVyMg=="},
        }
    )
    with pytest.raises(cluster_install.InstallError, match="exists with type 'Opaque'"):
        _install(kube_api_client, tmp_path, mutating_webhook_name="")
    assert kube_api.get(SECRET_PATH)["data"] == {"password": "aHVudGVyMg=="}
    bundles = _ca_bundles(kube_api)
    assert bundles[:2] == [generated.ca_bundle_b64] * 2  # validating: patched
    assert bundles[2:] == [None, "b2xk"]  # mutating: skipped


def test_cli_install_with_kubeconfig(
    tmp_path: Path, kube_api: FakeKubeAPI, kube_api_kubeconfig: Path, capsys
) -> None:
    _seed_webhook_configurations(kube_api)
    _generate(tmp_path / "certs")
    argv = ["install", "--kubeconfig", str(kube_api_kubeconfig), "--context", "fake"]
    argv += ["--cert-dir", str(tmp_path / "certs"), "--namespace", "gpu-system"]
    argv += ["--secret", "webhook-tls"]
    assert _cli(argv) == 0
    out = capsys.readouterr().out
    assert "Secret gpu-system/webhook-tls: created" in out
    assert kube_api.get("/api/v1/namespaces/gpu-system/secrets/webhook-tls") is not None
    assert kube_api.requests[0].headers["authorization"] == "Bearer fake-token"


# ----------------------------------------------------------------------------- manifests

WEBHOOKS_YAML = """\
# Comments explain manifests; they must survive.
apiVersion: v1
kind: Service
metadata:
  name: gpu-admission
  namespace: gpu-admission
spec:
  ports: [{port: 443, targetPort: 8443}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: gpu-admission
webhooks:
  - name: validate.gpu-admission.io  # fail closed
    clientConfig:
      service: {namespace: gpu-admission, name: gpu-admission, path: /validate}
    sideEffects: None
  - name: audit.gpu-admission.io
    clientConfig:
      caBundle: ""
      service: {namespace: gpu-admission, name: gpu-admission, path: /audit}
    sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: gpu-admission
webhooks:
  - {name: mutate.gpu-admission.io, sideEffects: None, clientConfig: {url: "https://x"}}
"""

CERT_MANAGER_YAML = """\
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: gpu-admission
  annotations:
    cert-manager.io/inject-ca-from: gpu-admission/gpu-admission
webhooks:
  - name: mutate.gpu-admission.io
    clientConfig:
      service: {namespace: gpu-admission, name: gpu-admission}
"""


def test_install_into_manifests(tmp_path: Path) -> None:
    generated = _generate(tmp_path / "certs")
    manifests = tmp_path / "deploy"
    (manifests / "base").mkdir(parents=True)
    (manifests / "overlays").mkdir()
    webhooks = manifests / "base" / "webhooks.yaml"
    webhooks.write_text(WEBHOOKS_YAML)
    cert_manager = manifests / "overlays" / "cert-manager.yml"
    cert_manager.write_text(CERT_MANAGER_YAML)
    deployment = manifests / "base" / "deployment.yaml"
    deployment.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n")

    changed = gitops.install_into_manifests(manifests, tmp_path / "certs")
    assert changed == [webhooks]

    documents = list(yaml.safe_load_all(webhooks.read_text()))
    original = list(yaml.safe_load_all(WEBHOOKS_YAML))
    assert [d["kind"] for d in documents] == [
        "Service",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ]
    assert documents[0] == original[0]
    for doc, before in zip(documents[1:], original[1:], strict=True):
        for webhook, webhook_before in zip(doc["webhooks"], before["webhooks"], strict=True):
            assert webhook["clientConfig"].pop("caBundle") == generated.ca_bundle_b64
            webhook_before["clientConfig"].pop("caBundle", None)
            assert webhook == webhook_before
    text = webhooks.read_text()
    assert "# Comments explain manifests; they must survive." in text
    assert "# fail closed" in text

    assert cert_manager.read_text() == CERT_MANAGER_YAML  # cert-manager injects its own CA
    assert deployment.read_text().startswith("apiVersion: apps/v1")

    key_b64 = base64.b64encode((tmp_path / "certs" / "tls.key").read_bytes()).decode()
    for path in manifests.rglob("*"):
        if path.is_file():
            assert "PRIVATE KEY" not in path.read_text()
            assert key_b64 not in path.read_text()

    # Idempotent: nothing to change the second time.
    assert gitops.install_into_manifests(manifests, tmp_path / "certs") == []


def test_cli_install_into_manifests(tmp_path: Path, capsys) -> None:
    _generate(tmp_path / "certs")
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "webhooks.yaml").write_text(WEBHOOKS_YAML)
    argv = ["install", "--cert-dir", str(tmp_path / "certs")]
    argv += ["--manifests", str(tmp_path / "deploy")]
    assert _cli(argv) == 0
    assert "caBundle set in" in capsys.readouterr().out
    assert _cli(argv) == 0
    assert "no webhook configuration" in capsys.readouterr().out


def test_cli_install_into_a_stream_sets_every_ca_bundle_for_kubectl_apply(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kubectl kustomize manifests/webhooks | certs install --manifests - | kubectl apply -f -`:
    the shipped webhooks, the cert-manager overlay's annotated ones too (created with the CA
    the injector will keep), every other object unchanged, and kubectl takes the output."""
    generated = _generate(tmp_path / "certs")
    expected = base64.b64encode(generated.ca_cert.read_bytes()).decode()
    for directory in ("manifests/webhooks", "manifests/overlays/cert-manager/webhooks"):
        rendered = kustomize_text(directory)
        monkeypatch.setattr("sys.stdin", io.StringIO(rendered + "---\n" + CONFIG_MAP_YAML))
        argv = ["install", "--cert-dir", str(tmp_path / "certs"), "--manifests", "-"]
        assert _cli(argv) == 0
        out = capsys.readouterr().out
        objects = list(yaml.safe_load_all(out))
        hooks = [
            h for o in objects if o["kind"].endswith("WebhookConfiguration") for h in o["webhooks"]
        ]
        # Validating: Pods and built-in kinds, custom kinds, DRA's claims; mutating: Pods,
        # workloads.
        assert len(hooks) == 5
        assert all(h["clientConfig"]["caBundle"] == expected for h in hooks)
        assert [o for o in objects if o["kind"] == "ConfigMap"] == [yaml.safe_load(CONFIG_MAP_YAML)]
        applied = subprocess.run(
            ["kubectl", "apply", "--dry-run=client", "--validate=false", "-o", "name", "-f", "-"],
            input=out,
            capture_output=True,
            text=True,
        )
        # No cluster here: kubectl parses every object and stops at the missing server.
        assert "error parsing" not in applied.stderr and "yaml" not in applied.stderr.lower(), (
            applied.stderr
        )


def test_cli_install_into_a_stream_without_a_webhook_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _generate(tmp_path / "certs")
    monkeypatch.setattr("sys.stdin", io.StringIO(CONFIG_MAP_YAML))
    argv = ["install", "--cert-dir", str(tmp_path / "certs"), "--manifests", "-"]
    with pytest.raises(pki.CertsError, match="no webhook"):
        _cli(argv)


CONFIG_MAP_YAML = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\ndata: {a: b}\n"


# ------------------------------------------------------- inputs checked before writing


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a certificate\n", "not a PEM certificate"),
        (b"\x7fELF\x02\x01\x01\x00\xff\xfe", "not a PEM certificate"),
        (None, "no such file or directory"),
    ],
    ids=["text", "binary", "missing"],
)
def test_cli_generate_checks_the_old_ca_before_writing_anything(
    tmp_path: Path, capsys, content: bytes | None, message: str
) -> None:
    old_ca = tmp_path / "old-ca.crt"
    if content is not None:
        old_ca.write_bytes(content)
    out = tmp_path / "certs"
    assert _cli(["generate", "--out", str(out)]) == 0
    before = _snapshot(out)
    with pytest.raises(pki.CertsError, match=message):
        _cli(["generate", "--out", str(out), "--force", "--bundle-old-ca", str(old_ca)])
    assert _snapshot(out) == before  # tls.crt and tls.key are not replaced half-way

    fresh = tmp_path / "fresh"
    with pytest.raises(pki.CertsError, match=message):
        _cli(["generate", "--out", str(fresh), "--bundle-old-ca", str(old_ca)])
    assert not fresh.exists()


def test_a_ca_certificate_and_key_that_do_not_match_write_nothing(tmp_path: Path) -> None:
    _generate(tmp_path / "a")
    _generate(tmp_path / "b")
    out = tmp_path / "certs"
    argv = ["generate", "--out", str(out)]
    argv += ["--ca-cert", str(tmp_path / "a/ca.crt"), "--ca-key", str(tmp_path / "b/ca.key")]
    with pytest.raises(pki.CertsError, match="is not the key of the CA certificate"):
        _cli(argv)
    assert not out.exists()


# ------------------------------------------------------------ one line per error


def test_cli_install_into_manifests_with_a_binary_file_names_it(tmp_path: Path) -> None:
    _generate(tmp_path / "certs")
    binary = tmp_path / "deploy" / "blob.yaml"
    binary.parent.mkdir()
    binary.write_bytes(b"\x7fELF\xff\xfe WebhookConfiguration")
    argv = ["install", "--cert-dir", str(tmp_path / "certs"), "--manifests", str(binary.parent)]
    with pytest.raises(pki.CertsError) as info:
        _cli(argv)
    assert str(info.value) == f"{binary}: not UTF-8 text, not a YAML manifest"


def test_cli_install_into_manifests_with_invalid_yaml_is_one_line(tmp_path: Path) -> None:
    _generate(tmp_path / "certs")
    broken = tmp_path / "deploy" / "webhooks.yaml"
    broken.parent.mkdir()
    broken.write_text("kind: ValidatingWebhookConfiguration\nwebhooks: [\n")
    argv = ["install", "--cert-dir", str(tmp_path / "certs"), "--manifests", str(broken.parent)]
    with pytest.raises(pki.CertsError) as info:
        _cli(argv)
    assert str(info.value) == (
        f"{broken}:3: invalid YAML: expected the node content, but found '<stream end>'"
    )


def test_cli_install_with_a_binary_kubeconfig_is_one_line(tmp_path: Path, capsys) -> None:
    from webhook.cli.main import main

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    assert main(["certs", "install", "--kubeconfig", str(kubeconfig)]) == 2
    assert capsys.readouterr().err == (
        f"gpu-admission: error: kubeconfig {kubeconfig}: not a kubeconfig (not UTF-8 text)\n"
    )


def test_install_against_a_server_that_answers_no_json_names_it(tmp_path: Path) -> None:
    from contextlib import closing

    from kubernetes import client as k8s

    _generate(tmp_path / "certs")
    with web_server() as url:
        configuration = k8s.Configuration()
        configuration.host = url
        with closing(k8s.ApiClient(configuration)) as api_client:
            with pytest.raises(cluster_install.InstallError) as info:
                cluster_install.install(
                    api_client,
                    namespace=NAMESPACE,
                    secret_name="gpu-admission-tls",
                    cert_dir=tmp_path / "certs",
                    validating_webhook_name="gpu-admission",
                    mutating_webhook_name="gpu-admission",
                )
    assert str(info.value) == (
        f"the server at {url} did not answer as a Kubernetes API server (the body of a 200 "
        "answer is not a JSON object): check the kubeconfig's server address"
    )


def test_certs_help_has_examples(capsys) -> None:
    from webhook.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["certs", "--help"])
    assert exit_info.value.code == 0
    assert "examples:\n  gpu-admission certs generate --out certs" in capsys.readouterr().out
