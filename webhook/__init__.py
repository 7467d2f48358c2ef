"""gpu-admission: a Kubernetes admission webhook that keeps GPU Pods safe and schedulable.

The public API is the pure core: ``load_policy``/``parse_policy`` compile a policy once, and
``review`` decides an AdmissionReview against it. This module only re-exports, lazily: the
layers are the subpackages (``policy``, ``core``, ``checks``, ``admission``, ``server``,
``certs``, ``cli``), nothing inside them imports this module, and importing one of them loads
only what it needs (the request path never loads YAML or JSON Schema code).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from webhook.admission.engine import Decision, decide, review
    from webhook.admission.request import RequestError
    from webhook.policy.load import PolicyError, default_policy_path, load_policy, parse_policy
    from webhook.policy.model import Policy

_EXPORTS = {
    "Decision": "webhook.admission.engine",
    "decide": "webhook.admission.engine",
    "review": "webhook.admission.engine",
    "RequestError": "webhook.admission.request",
    "PolicyError": "webhook.policy.load",
    "default_policy_path": "webhook.policy.load",
    "load_policy": "webhook.policy.load",
    "parse_policy": "webhook.policy.load",
    "Policy": "webhook.policy.model",
}

__all__ = [
    "Decision",
    "Policy",
    "PolicyError",
    "RequestError",
    "decide",
    "default_policy_path",
    "load_policy",
    "parse_policy",
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
