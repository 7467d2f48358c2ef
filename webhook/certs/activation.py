"""What a Helm install's hook Jobs do in the cluster, so that no step of an install, an
upgrade or an uninstall leaves a fail-closed webhook without a Ready server it trusts:

- :func:`bootstrap_secret` (pre-install, pre-upgrade): the self-signed TLS Secret, made once
  and never re-keyed; the serving certificate is renewed with the same CA when it nears its
  end, so the caBundle in the webhook configurations stays valid;
- :func:`activate_webhooks` (post-install, post-upgrade): once the server answers ``/readyz``
  over TLS verified with the CA of its Secret, the webhook configurations get that CA as
  their caBundle and the validating one its failure policies (the chart installs them failing
  open; its entry for DRA's ResourceClaims fails open always);
- :func:`deactivate_webhooks` (pre-delete): the validating webhook fails open again before
  Helm deletes the server (Helm 3 deletes webhook configurations last).
"""

from __future__ import annotations

import base64
import ssl
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509

from webhook.certs.install import (
    AlreadyExists,
    InstallError,
    call_api,
    json_body,
    secret_body,
)
from webhook.certs.pki import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, generate
from webhook.policy.workloads import CLAIMS_WEBHOOK, WORKLOADS_WEBHOOK

# A serving certificate with less left than this is renewed by the next upgrade's hook.
RENEW_BEFORE = timedelta(days=30)
WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


def validating_failure_policies(
    failure_policy: str, custom_resources_failure_policy: str
) -> dict[str, str]:
    """The failure policy of each entry of the activated validating configuration, by the
    entry's name (``""``: every other entry). The claims entry fails open whatever is asked:
    a controller creates the claims of Pods, and a denial there leaves a Pod pending with no
    word to anyone (the guarantee is the Pod's and the template's)."""
    return {
        "": failure_policy,
        WORKLOADS_WEBHOOK: custom_resources_failure_policy,
        CLAIMS_WEBHOOK: "Ignore",
    }


class ActivationError(InstallError):
    """The server did not become ready in time, or a webhook could not be activated."""


def bootstrap_secret(
    api_client: Any,
    *,
    namespace: str,
    secret_name: str,
    service: str,
    now: datetime | None = None,
) -> str:
    """Make sure the ``kubernetes.io/tls`` Secret exists: "created" (a new CA, its key kept in
    the Secret ``<secret_name>-ca``, which no Pod mounts), "renewed" (the serving certificate
    re-issued by the same CA: near its end, or not naming the Service), or "kept" (valid).
    A Secret without its CA Secret beside it was not made here (a switch from cert-manager or
    a Secret of one's own): it would never be renewed, so it is refused, naming what to do."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)
    server = api_client.configuration.host
    ca_name = f"{secret_name}-ca"
    tls = _read_secret(core, server, namespace, secret_name)
    ca = _read_secret(core, server, namespace, ca_name)
    now = now or datetime.now(UTC)
    if tls is not None and ca is None:
        raise ActivationError(
            f"Secret {namespace}/{secret_name} exists but was not made by this bootstrap (no "
            f"{ca_name} beside it), so nothing would renew it: use it with "
            "certificates.source=existingSecret, or delete it to have one made"
        )
    if tls is not None:
        names_service = f"{service}.{namespace}.svc" in _dns_names(tls)
        if names_service and _not_after(tls) - now > RENEW_BEFORE:
            return "kept"
    with tempfile.TemporaryDirectory(prefix="gpu-admission-bootstrap-") as tmp:
        directory = Path(tmp)
        ca_paths: dict[str, Path] = {}
        if ca is not None:
            for name in (CA_CERT, CA_KEY):
                ca_paths[name] = directory / f"existing-{name}"
                ca_paths[name].write_bytes(base64.b64decode(ca["data"][name]))
        made = generate(
            directory / "out",
            service=service,
            namespace=namespace,
            ca_cert_path=ca_paths.get(CA_CERT),
            ca_key_path=ca_paths.get(CA_KEY),
        )
        files = {
            name: base64.b64encode((directory / "out" / name).read_bytes()).decode()
            for name in (CA_CERT, TLS_CERT, TLS_KEY)
        }
        if made.ca_created:
            ca_data = {
                CA_CERT: files[CA_CERT],
                CA_KEY: base64.b64encode((directory / "out" / CA_KEY).read_bytes()).decode(),
            }
            # The CA first: a TLS Secret whose CA key is lost could never be renewed.
            if not _create_secret(core, namespace, ca_name, "Opaque", ca_data):
                return "kept"  # another run of this Job made it meanwhile
    if tls is None:
        return "created" if _create_secret(core, namespace, secret_name, _TLS, files) else "kept"
    call_api(
        lambda: core.patch_namespaced_secret(
            secret_name, namespace, {"data": files}, _preload_content=False
        ),
        f"renew Secret {namespace}/{secret_name}",
        kind="Secret",
        name=f"{namespace}/{secret_name}",
    )
    return "renewed"


_TLS = "kubernetes.io/tls"


def _read_secret(core: Any, server: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The Secret, or None when there is none."""
    from kubernetes.client.exceptions import ApiException

    def read() -> dict[str, Any] | None:
        try:
            response = core.read_namespaced_secret(name, namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json_body(response, server)

    secret: dict[str, Any] | None = call_api(
        read, f"read Secret {namespace}/{name}", kind="Secret", name=name
    )
    return secret


def _create_secret(core: Any, namespace: str, name: str, kind: str, data: dict[str, str]) -> bool:
    """Create a Secret; False when one of that name appeared meanwhile (it is kept)."""
    body = secret_body(name, namespace, kind, data)
    try:
        call_api(
            lambda: core.create_namespaced_secret(namespace, body, _preload_content=False),
            f"create Secret {namespace}/{name}",
            kind="Namespace",
            name=namespace,
        )
    except AlreadyExists:
        return False
    return True


def _dns_names(secret: dict[str, Any]) -> list[str]:
    pem = base64.b64decode(secret["data"][TLS_CERT])
    names = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    return names.value.get_values_for_type(x509.DNSName)


def _not_after(secret: dict[str, Any]) -> datetime:
    pem = base64.b64decode(secret["data"][TLS_CERT])
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc


def probe_readyz(url: str, ca_pem: bytes) -> bool:
    """One GET of ``url``, its certificate and name verified against ``ca_pem`` as the API
    server verifies the webhook's: True when it answers 200."""
    context = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    request = urllib.request.Request(url, method="GET")
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def activate_webhooks(
    api_client: Any,
    *,
    namespace: str,
    secret_name: str,
    readyz_url: str,
    validating: str,
    mutating: str,
    failure_policy: str,
    timeout: float,
    custom_resources_failure_policy: str = "Ignore",
    probe: Callable[[str, bytes], bool] = probe_readyz,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Wait until ``readyz_url`` answers 200 over TLS verified with the CA of the Secret,
    then set that CA as the caBundle of every webhook of both configurations, and on the
    validating one ``failure_policy`` (``custom_resources_failure_policy`` on its entry for
    custom workload kinds, Ignore on its entry for claims: :func:`validating_failure_policies`).
    One line per configuration, for the log."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)
    server = api_client.configuration.host
    deadline = time.monotonic() + timeout
    # cert-manager issues the Secret some time after the install: wait for it too.
    while True:
        secret = _read_secret(core, server, namespace, secret_name)
        if secret is not None and CA_CERT in (secret.get("data") or {}):
            break
        if time.monotonic() >= deadline:
            raise ActivationError(
                f"Secret {namespace}/{secret_name} with a {CA_CERT} not found within "
                f"{timeout:g} s: the server has no certificate (cert-manager issues it, or "
                "the bootstrap hook makes it)"
            )
        sleep(2.0)
    bundle_b64 = secret["data"][CA_CERT]
    ca_pem = base64.b64decode(bundle_b64)
    while not probe(readyz_url, ca_pem):
        if time.monotonic() >= deadline:
            raise ActivationError(
                f"{readyz_url} did not answer 200 with a certificate of the CA in "
                f"{namespace}/{secret_name} within {timeout:g} s: the webhooks stay failing open"
            )
        sleep(2.0)
    return [
        _patch_webhooks(api_client, kind, name, bundle_b64, policy)
        for kind, name, policy in (
            (
                WEBHOOK_KINDS[0],
                validating,
                validating_failure_policies(failure_policy, custom_resources_failure_policy),
            ),
            (WEBHOOK_KINDS[1], mutating, None),
        )
        if name
    ]


def deactivate_webhooks(api_client: Any, *, validating: str) -> str:
    """Make the validating webhook fail open (before the server it calls goes away). One
    already deleted (the break-glass of docs/installing.md) is as good as deactivated."""
    try:
        return _patch_webhooks(api_client, WEBHOOK_KINDS[0], validating, None, {"": "Ignore"})
    except InstallError as exc:
        if "not found" not in str(exc):
            raise
        return f"{WEBHOOK_KINDS[0]}/{validating}: not there, nothing to deactivate"


def _patch_webhooks(
    api_client: Any,
    kind: str,
    name: str,
    bundle_b64: str | None,
    failure_policies: dict[str, str] | None,
) -> str:
    """Set the caBundle and the failure policy of each webhook: ``failure_policies`` maps a
    webhook's name to its policy, ``""`` to the policy of the others."""
    from kubernetes import client as k8s

    admission = k8s.AdmissionregistrationV1Api(api_client)
    read, patch = {
        WEBHOOK_KINDS[0]: (
            admission.read_validating_webhook_configuration,
            admission.patch_validating_webhook_configuration,
        ),
        WEBHOOK_KINDS[1]: (
            admission.read_mutating_webhook_configuration,
            admission.patch_mutating_webhook_configuration,
        ),
    }[kind]
    server = api_client.configuration.host
    config = call_api(
        lambda: json_body(read(name, _preload_content=False), server),
        f"read {kind} {name!r}",
        kind=kind,
        name=name,
    )
    ops: list[dict[str, Any]] = []
    for index, hook in enumerate(config.get("webhooks") or []):
        # "test" pins each index to the webhook read above, as certs install does.
        pinned = [{"op": "test", "path": f"/webhooks/{index}/name", "value": hook["name"]}]
        changes = []
        if (
            bundle_b64 is not None
            and (hook.get("clientConfig") or {}).get("caBundle") != bundle_b64
        ):
            changes.append(
                {
                    "op": "add",
                    "path": f"/webhooks/{index}/clientConfig/caBundle",
                    "value": bundle_b64,
                }
            )
        wanted = None
        if failure_policies is not None:
            wanted = failure_policies.get(hook["name"], failure_policies[""])
        if wanted is not None and hook.get("failurePolicy") != wanted:
            changes.append(
                {"op": "add", "path": f"/webhooks/{index}/failurePolicy", "value": wanted}
            )
        if changes:
            ops += pinned + changes
    if ops:
        call_api(
            lambda: patch(name, ops, _preload_content=False),
            f"patch {kind} {name!r}",
            kind=kind,
            name=name,
        )
    policy = ""
    if failure_policies:
        policy = ", failurePolicy " + ", ".join(
            f"{value} ({key})" if key else value for key, value in failure_policies.items()
        )
    state = "patched" if ops else "unchanged"
    return f"{kind}/{name}: {state}{policy}"
