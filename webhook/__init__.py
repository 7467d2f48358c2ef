"""gpu-admission: a Kubernetes admission webhook that keeps GPU Pods safe and schedulable.

The public API is the pure core: ``load_policy``/``parse_policy`` compile a policy once, and
``review`` decides an AdmissionReview against it. This module only re-exports; the layers are
the subpackages (``policy``, ``core``, ``checks``, ``admission``, ``server``, ``certs``,
``cli``), and nothing inside them imports this module.
"""

from webhook.admission.engine import Decision, decide, review
from webhook.admission.request import RequestError
from webhook.policy.load import PolicyError, default_policy_path, load_policy, parse_policy
from webhook.policy.model import Policy

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
