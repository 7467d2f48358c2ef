"""GitOps: the webhook's ``caBundle`` written into manifests instead of into a cluster.

Only the CA certificate(s) go into the files; the private key never does. The edit is made on
the text, so the comments that explain a manifest stay where they are.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml

from webhook.certs.pki import CertsError, ca_bundle_pem, write_atomic
from webhook.policy.files import unreadable_file

WEBHOOK_CONFIGURATION_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
# Manifests that cert-manager's CA injector fills in must not get a hand-made caBundle.
CERT_MANAGER_INJECT_ANNOTATIONS = (
    "cert-manager.io/inject-ca-from",
    "cert-manager.io/inject-ca-from-secret",
)


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
    bundle_b64 = base64.b64encode(ca_bundle_pem(Path(cert_dir), ca_bundle_path)).decode("ascii")
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
            raise CertsError(unreadable_file(path, exc)) from None
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
        write_atomic(path, new_text.encode("utf-8"), path.stat().st_mode & 0o777)
        changed.append(path)
    return changed


def ca_bundle_into_stream(
    text: str,
    cert_dir: str | os.PathLike[str],
    *,
    ca_bundle_path: str | os.PathLike[str] | None = None,
) -> str:
    """Pipe mode: the YAML stream ``text`` (``kubectl kustomize`` output) with the caBundle
    set on every webhook of its webhook configurations, for ``kubectl apply -f -``.

    Those annotated for cert-manager's CA injector get it too: created with the CA the
    injector will keep there, the webhook is served from its first second instead of failing
    every call until the injector's first pass. Comments are not kept (a pipe has no reader
    for them). A stream with no webhook configuration is refused: it is the wrong input.
    """
    bundle_b64 = base64.b64encode(ca_bundle_pem(Path(cert_dir), ca_bundle_path)).decode("ascii")
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise CertsError(f"standard input: invalid YAML: {problem}") from None
    configured = 0
    for doc in documents:
        for webhook in _webhook_entries(doc, injected_too=True):
            client_config = webhook.get("clientConfig")
            if not isinstance(client_config, dict):
                client_config = webhook["clientConfig"] = {}
            client_config["caBundle"] = bundle_b64
            configured += 1
    if not configured:
        raise CertsError("standard input holds no webhook of a webhook configuration")
    return yaml.safe_dump_all(documents, sort_keys=False, width=1 << 16)


def _webhook_entries(doc: Any, *, injected_too: bool = False) -> list[dict[str, Any]]:
    """The webhook entries of a webhook configuration that should get our caBundle."""
    if not (
        isinstance(doc, dict)
        and doc.get("kind") in WEBHOOK_CONFIGURATION_KINDS
        and str(doc.get("apiVersion", "")).startswith("admissionregistration.k8s.io/")
    ):
        return []
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    if not injected_too and any(a in annotations for a in CERT_MANAGER_INJECT_ANNOTATIONS):
        return []
    return [w for w in doc.get("webhooks") or [] if isinstance(w, dict)]


def _edit_ca_bundles(text: str, bundle_b64: str) -> str | None:
    """Set every caBundle by editing text in place; None when a shape is not handled."""
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
