"""gpu-admission: a Kubernetes admission webhook that keeps GPU Pods safe and schedulable.

The public API: ``load_policy``/``parse_policy`` compile a policy once, and ``review`` decides
an AdmissionReview against it (the pure core). ``audit_files`` and ``audit_cluster`` say what a
policy would deny, warn about and change in manifests or in a cluster reached with ``connect``;
``preflight_files`` and ``preflight_cluster`` compare two policies over the same objects.

This module only re-exports, lazily: the layers are the subpackages (``policy``, ``core``,
``checks``, ``admission``, ``cluster``, ``server``, ``certs``, ``audit``, ``cli``), nothing
inside them imports this module, and importing one of them loads only what it needs (the
request path never loads YAML, JSON Schema or the kubernetes client).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from webhook.admission.engine import Decision, decide, review
    from webhook.admission.request import RequestError
    from webhook.audit.cluster import audit_cluster
    from webhook.audit.files import audit_files
    from webhook.audit.judging import Audit, Audited
    from webhook.audit.preflight import Preflight, preflight_cluster, preflight_files
    from webhook.cluster.connection import Cluster, ClusterError, connect
    from webhook.policy.load import PolicyError, default_policy_path, load_policy, parse_policy
    from webhook.policy.model import Policy

_EXPORTS = {
    "Decision": "webhook.admission.engine",
    "decide": "webhook.admission.engine",
    "review": "webhook.admission.engine",
    "RequestError": "webhook.admission.request",
    "audit_cluster": "webhook.audit.cluster",
    "audit_files": "webhook.audit.files",
    "Audit": "webhook.audit.judging",
    "Audited": "webhook.audit.judging",
    "Preflight": "webhook.audit.preflight",
    "preflight_cluster": "webhook.audit.preflight",
    "preflight_files": "webhook.audit.preflight",
    "Cluster": "webhook.cluster.connection",
    "ClusterError": "webhook.cluster.connection",
    "connect": "webhook.cluster.connection",
    "PolicyError": "webhook.policy.load",
    "default_policy_path": "webhook.policy.load",
    "load_policy": "webhook.policy.load",
    "parse_policy": "webhook.policy.load",
    "Policy": "webhook.policy.model",
}

__all__ = [
    "Audit",
    "Audited",
    "Cluster",
    "ClusterError",
    "Decision",
    "Policy",
    "PolicyError",
    "Preflight",
    "RequestError",
    "audit_cluster",
    "audit_files",
    "connect",
    "decide",
    "default_policy_path",
    "load_policy",
    "parse_policy",
    "preflight_cluster",
    "preflight_files",
    "review",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'webhook' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return __all__
