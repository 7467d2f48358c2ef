"""gpu-admission: a Kubernetes admission webhook that keeps GPU Pods safe and schedulable.

The public API is the pure core: ``load_policy``/``parse_policy`` compile a policy once, and
``review`` decides an AdmissionReview against it.
"""

from webhook.engine import Decision, RequestError, decide, review
from webhook.model import Policy
from webhook.policy import PolicyError, default_policy_path, load_policy, parse_policy

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
