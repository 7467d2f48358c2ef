"""The Helm chart's hook commands (``gpu-admission webhooks ...``) against the fake API server
(real kubernetes client, real API shapes) and, for activation, a real served webhook."""

from __future__ import annotations

import base64
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tests.kubeapi import FakeKubeAPI
from tests.serving import make_certificates, tls_server
from tests.support.kube import kustomize
from webhook.certs.activation import (
    ActivationError,
    activate_webhooks,
    bootstrap_secret,
    deactivate_webhooks,
)
from webhook.cli.main import main
from webhook.policy.workloads import CLAIMS_WEBHOOK, WORKLOADS_WEBHOOK

NAMESPACE = "gpu-admission"


def secret(api: FakeKubeAPI, name: str) -> dict[str, Any] | None:
    return api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}")


def certificate(data: dict[str, str], key: str = "tls.crt") -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(data[key]))


def add_namespace(api: FakeKubeAPI) -> None:
    api.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})


# ------------------------------------------------------------------ bootstrap


def test_bootstrap_creates_the_secret_once_and_never_rekeys(kube_api, kube_api_client) -> None:
    add_namespace(kube_api)
    args = {"namespace": NAMESPACE, "secret_name": "gpu-admission-tls", "service": "gpu-admission"}
    assert bootstrap_secret(kube_api_client, **args) == "created"
    tls, ca = secret(kube_api, "gpu-admission-tls"), secret(kube_api, "gpu-admission-tls-ca")
    assert tls["type"] == "kubernetes.io/tls" and set(tls["data"]) == {
        "ca.crt",
        "tls.crt",
        "tls.key",
    }
    assert "ca.key" not in tls["data"]  # the Pods mount this one: no CA key in it
    assert ca["data"]["ca.crt"] == tls["data"]["ca.crt"] and "ca.key" in ca["data"]
    served = certificate(tls["data"])
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpu-admission.gpu-admission.svc" in names.get_values_for_type(x509.DNSName)

    # An upgrade runs it again: nothing changes.
    assert bootstrap_secret(kube_api_client, **args) == "kept"
    assert secret(kube_api, "gpu-admission-tls") == tls

    # Near the end of the serving certificate: renewed by the same CA, caBundle unchanged.
    soon = served.not_valid_after_utc - timedelta(days=10)
    assert bootstrap_secret(kube_api_client, now=soon, **args) == "renewed"
    renewed = secret(kube_api, "gpu-admission-tls")["data"]
    assert renewed["ca.crt"] == tls["data"]["ca.crt"]
    assert renewed["tls.crt"] != tls["data"]["tls.crt"]
    assert certificate(renewed).issuer == served.issuer


def test_bootstrap_refuses_a_secret_it_did_not_make(kube_api, kube_api_client) -> None:
    """One left by cert-manager or made by hand would never be renewed by this bootstrap:
    the hook fails (the upgrade with it) and says what to do, and the Secret is untouched."""
    add_namespace(kube_api)
    theirs = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": "gpu-admission-tls", "namespace": NAMESPACE},
        "data": {"tls.crt": "eA==", "tls.key": "eA==", "ca.crt": "eA=="},
    }
    kube_api.add(theirs)
    with pytest.raises(ActivationError, match="existingSecret"):
        bootstrap_secret(
            kube_api_client, namespace=NAMESPACE, secret_name="gpu-admission-tls", service="x"
        )
    assert secret(kube_api, "gpu-admission-tls")["data"] == theirs["data"]
    assert secret(kube_api, "gpu-admission-tls-ca") is None


# ------------------------------------------------------------------ activate, deactivate


def add_webhooks(api: FakeKubeAPI) -> None:
    for obj in kustomize("manifests/webhooks"):
        obj["webhooks"][0]["failurePolicy"] = "Ignore"  # as the chart installs them
        api.add(obj)


def webhooks(api: FakeKubeAPI, kind: str) -> list[dict[str, Any]]:
    path = f"/apis/admissionregistration.k8s.io/v1/{kind}/gpu-admission"
    return api.get(path)["webhooks"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    with tls_server(tmp_path_factory.mktemp("activation"), {}) as server:
        yield server


def add_tls_secret(api: FakeKubeAPI, ca_cert: Path) -> str:
    bundle = base64.b64encode(ca_cert.read_bytes()).decode()
    api.add(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": "gpu-admission-tls", "namespace": NAMESPACE},
            "data": {"ca.crt": bundle, "tls.crt": "eA==", "tls.key": "eA=="},
        }
    )
    return bundle


def activate(api_client: Any, readyz_url: str, **options: Any) -> list[str]:
    """``activate_webhooks`` as the chart's hook calls it, with ``options`` (timeout, sleep)."""
    return activate_webhooks(
        api_client,
        namespace=NAMESPACE,
        secret_name="gpu-admission-tls",
        readyz_url=readyz_url,
        validating="gpu-admission",
        mutating="gpu-admission",
        failure_policy="Fail",
        **options,
    )


def test_activate_waits_for_the_server_then_sets_the_ca_and_failure_policy(
    kube_api, kube_api_kubeconfig, served, capsys
) -> None:
    server = served
    add_namespace(kube_api)
    add_webhooks(kube_api)
    bundle = add_tls_secret(kube_api, server.ca)
    argv = ["webhooks", "activate", "--kubeconfig", str(kube_api_kubeconfig)]
    argv += ["--readyz-url", f"https://127.0.0.1:{server.port}/readyz", "--timeout", "30"]
    assert main(argv) == 0
    assert "failurePolicy Fail" in capsys.readouterr().out
    validating, custom_kinds, claims = webhooks(kube_api, "validatingwebhookconfigurations")
    mutating, workload_defaults = webhooks(kube_api, "mutatingwebhookconfigurations")
    assert validating["clientConfig"]["caBundle"] == bundle == mutating["clientConfig"]["caBundle"]
    assert custom_kinds["clientConfig"]["caBundle"] == bundle
    assert claims["clientConfig"]["caBundle"] == bundle
    assert workload_defaults["clientConfig"]["caBundle"] == bundle
    assert validating["failurePolicy"] == "Fail"
    # The custom kinds' entry keeps failing open: their Pods are judged fail-closed anyway.
    assert custom_kinds["name"] == WORKLOADS_WEBHOOK and custom_kinds["failurePolicy"] == "Ignore"
    # So does the claims entry: a controller creates the claims of Pods.
    assert claims["name"] == CLAIMS_WEBHOOK and claims["failurePolicy"] == "Ignore"
    # The mutating webhooks always fail open: the Pods' and the workloads' GPU defaults.
    assert mutating["failurePolicy"] == workload_defaults["failurePolicy"] == "Ignore"

    assert main(["webhooks", "deactivate", "--kubeconfig", str(kube_api_kubeconfig)]) == 0
    hooks = webhooks(kube_api, "validatingwebhookconfigurations")
    assert [h["failurePolicy"] for h in hooks] == ["Ignore", "Ignore", "Ignore"]

    # A chart value can make the custom kinds' entry fail closed too, never the claims entry.
    argv += ["--custom-resources-failure-policy", "Fail"]
    assert main(argv) == 0
    hooks = webhooks(kube_api, "validatingwebhookconfigurations")
    assert [h["failurePolicy"] for h in hooks] == ["Fail", "Fail", "Ignore"]

    # Deactivated, everything fails open again.
    assert main(["webhooks", "deactivate", "--kubeconfig", str(kube_api_kubeconfig)]) == 0
    hooks = webhooks(kube_api, "validatingwebhookconfigurations")
    assert [h["failurePolicy"] for h in hooks] == ["Ignore", "Ignore", "Ignore"]


def test_activation_makes_a_fail_closed_claims_entry_fail_open(
    kube_api, kube_api_client, served
) -> None:
    """A claims entry applied failing closed (by hand, or by an older release's hook) fails
    open once activated."""
    add_namespace(kube_api)
    for obj in kustomize("manifests/webhooks"):
        for hook in obj["webhooks"]:
            hook["failurePolicy"] = "Fail"
        kube_api.add(obj)
    add_tls_secret(kube_api, served.ca)
    readyz = f"https://127.0.0.1:{served.port}/readyz"
    [validating_line, _] = activate(kube_api_client, readyz, timeout=30)
    assert f"Ignore ({CLAIMS_WEBHOOK})" in validating_line
    hooks = webhooks(kube_api, "validatingwebhookconfigurations")
    assert [(h["name"], h["failurePolicy"]) for h in hooks] == [
        ("validate.gpu-admission.io", "Fail"),
        (WORKLOADS_WEBHOOK, "Ignore"),
        (CLAIMS_WEBHOOK, "Ignore"),
    ]


def test_activate_changes_nothing_unless_the_server_proves_the_secrets_ca(
    kube_api, kube_api_client, served, tmp_path
) -> None:
    server = served
    add_namespace(kube_api)
    add_webhooks(kube_api)
    other = make_certificates(tmp_path / "other")  # a CA the server's certificate is not from
    add_tls_secret(kube_api, other.ca_cert)
    waits = []
    with pytest.raises(ActivationError, match="did not answer 200"):
        activate(
            kube_api_client,
            f"https://127.0.0.1:{server.port}/readyz",
            timeout=0.5,
            sleep=waits.append,
        )
    assert waits  # it retried
    for validating in webhooks(kube_api, "validatingwebhookconfigurations"):
        assert validating["failurePolicy"] == "Ignore"
        assert "caBundle" not in validating["clientConfig"]


def test_activate_without_the_secret_says_so(kube_api, kube_api_client) -> None:
    add_namespace(kube_api)
    with pytest.raises(ActivationError, match="not found"):
        activate(kube_api_client, "https://127.0.0.1:1/readyz", timeout=0)


def test_deactivate_of_a_deleted_configuration_is_done(kube_api, kube_api_client) -> None:
    # After the install guide's break-glass (the configurations deleted), an uninstall still works.
    assert "nothing to deactivate" in deactivate_webhooks(
        kube_api_client, validating="gpu-admission"
    )


def test_bootstrap_renews_a_certificate_that_does_not_name_the_service(
    kube_api, kube_api_client
) -> None:
    add_namespace(kube_api)
    args = {"namespace": NAMESPACE, "secret_name": "gpu-admission-tls"}
    assert bootstrap_secret(kube_api_client, service="gpu-admission", **args) == "created"
    before = secret(kube_api, "gpu-admission-tls")["data"]
    # The release renamed: its Service is another name, which the certificate must carry.
    assert bootstrap_secret(kube_api_client, service="prod-gpu-admission", **args) == "renewed"
    after = secret(kube_api, "gpu-admission-tls")["data"]
    assert after["ca.crt"] == before["ca.crt"]  # same CA: the caBundle stays valid
    names = certificate(after).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "prod-gpu-admission.gpu-admission.svc" in names.value.get_values_for_type(x509.DNSName)


def test_activate_waits_for_a_secret_issued_late(kube_api, kube_api_client, served) -> None:
    server = served
    add_namespace(kube_api)
    add_webhooks(kube_api)
    waits: list[float] = []

    def issued_meanwhile(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:  # cert-manager issues it while activation waits
            add_tls_secret(kube_api, server.ca)

    activate(
        kube_api_client,
        f"https://127.0.0.1:{server.port}/readyz",
        timeout=60,
        sleep=issued_meanwhile,
    )
    assert len(waits) == 2
    assert webhooks(kube_api, "validatingwebhookconfigurations")[0]["failurePolicy"] == "Fail"
