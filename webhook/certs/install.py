"""Installing the webhook's certificates into a cluster through the Kubernetes API: the
``kubernetes.io/tls`` Secret that the webhook Pods mount, and the ``caBundle`` of every webhook
entry of the Validating- and MutatingWebhookConfiguration."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook.certs.pki import (
    CA_CERT,
    TLS_CERT,
    TLS_KEY,
    CertsError,
    ca_bundle_pem,
    check_pair,
    read_file,
)


class InstallError(CertsError):
    """The cluster refused or lacks what ``install`` needs (403, missing objects, ...)."""


@dataclass(frozen=True)
class InstallResult:
    """What :func:`install` changed, so the CLI can say it in one line per object."""

    secret: str  # "created", "updated" or "unchanged"
    webhook_configurations: tuple[str, ...]  # "Kind/name: N webhook(s) patched|unchanged"


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
    tls_crt = read_file(directory / TLS_CERT)
    tls_key = read_file(directory / TLS_KEY)
    ca_crt = read_file(directory / CA_CERT)
    check_pair(directory / TLS_CERT, tls_crt, directory / TLS_KEY, tls_key)
    bundle_b64 = base64.b64encode(ca_bundle_pem(directory, ca_bundle_path)).decode("ascii")

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
        obj = call_api(
            lambda read=read, name=name: json_body(read(name, _preload_content=False), server),
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
            call_api(
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
    secret = secret_body(secret_name, namespace, "kubernetes.io/tls", data)
    what = f"Secret {namespace}/{secret_name}"
    try:
        call_api(
            lambda: core.create_namespaced_secret(namespace, secret, _preload_content=False),
            f"create {what}",
            kind="Namespace",
            name=namespace,
        )
        secret_state = "created"
    except AlreadyExists:
        existing = call_api(
            lambda: json_body(
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
            call_api(
                lambda: core.patch_namespaced_secret(
                    secret_name, namespace, {"data": data}, _preload_content=False
                ),
                f"update {what}",
                kind="Secret",
                name=f"{namespace}/{secret_name}",
            )
            secret_state = "updated"
    return InstallResult(secret=secret_state, webhook_configurations=tuple(reports))


def secret_body(name: str, namespace: str, secret_type: str, data: dict[str, str]) -> Any:
    """A Secret of the webhook's certificates (``data`` base64-encoded), labelled as ours."""
    from kubernetes import client as k8s

    return k8s.V1Secret(
        api_version="v1",
        kind="Secret",
        metadata=k8s.V1ObjectMeta(
            name=name,
            namespace=namespace,
            labels={
                "app.kubernetes.io/name": "gpu-admission",
                "app.kubernetes.io/component": "webhook-tls",
            },
        ),
        type=secret_type,
        data=dict[str, str | bytes](data),
    )


class AlreadyExists(Exception):
    """A create answered 409: the object is there already."""


def json_body(response: Any, server: str) -> dict[str, Any]:
    """The JSON object of an API answer read with ``_preload_content=False``."""
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


def call_api(fn: Any, action: str, *, kind: str, name: str) -> Any:
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
            raise AlreadyExists() from None
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
