"""Reading an AdmissionReview: the request it carries and the workload kind of its object.

What cannot be read is a :class:`RequestError`, which the server answers with HTTP 400: a
malformed review is the caller's mistake, never a server failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from webhook.admission.wire import API_VERSION, AdmissionRequest
from webhook.policy.model import Policy, WorkloadKind

# The operations of admission.k8s.io/v1 (AdmissionRequest.operation).
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class RequestError(ValueError):
    """A malformed AdmissionReview: the caller answers HTTP 400 with this message."""


def parse_request(admission_review: Any) -> AdmissionRequest:
    """The ``request`` of an AdmissionReview, with a uid; anything else is a RequestError."""
    if not isinstance(admission_review, dict):
        raise RequestError("the body must be a JSON object (an AdmissionReview)")
    if admission_review.get("kind") != "AdmissionReview":
        raise RequestError(f"kind must be AdmissionReview, not {admission_review.get('kind')!r}")
    if admission_review.get("apiVersion") != API_VERSION:
        raise RequestError(
            f"apiVersion must be {API_VERSION}, not "
            f"{admission_review.get('apiVersion')!r}; set admissionReviewVersions: [v1]"
        )
    request = admission_review.get("request")
    if not isinstance(request, dict):
        raise RequestError("request is missing")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise RequestError("request.uid is missing")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        # Never allowed for want of a verdict: the API server sends only these four, so
        # anything else is a forged or broken review.
        shown = repr(operation)
        shown = shown if len(shown) <= 64 else shown[:64] + "..."
        raise RequestError(f"request.operation must be one of {', '.join(OPERATIONS)}, not {shown}")
    return cast(AdmissionRequest, request)  # its shape is checked above


def workload_kind(
    request: Mapping[str, Any], obj: Mapping[str, Any], policy: Policy
) -> WorkloadKind | None:
    """The policy's workload kind of the request (``request.kind``, else the object's own
    apiVersion and kind); None for kinds the policy does not judge."""
    kind = request.get("kind")
    if kind is not None:
        if not (
            isinstance(kind, dict)
            and isinstance(kind.get("kind"), str)
            and isinstance(kind.get("group", ""), str)
        ):
            raise RequestError("request.kind must be {group, version, kind} with string values")
        return policy.workloads.get((kind.get("group", ""), kind["kind"]))
    api_version, object_kind = obj.get("apiVersion", ""), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(object_kind, str):
        return None
    return policy.workloads.get((api_version.rpartition("/")[0], object_kind))
