"""The AdmissionReview wire shapes (admission.k8s.io/v1) that the engine reads and writes."""

from __future__ import annotations

from typing import Any, Final, Literal, NotRequired, TypedDict

API_VERSION: Final = "admission.k8s.io/v1"

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]


class AdmissionRequest(TypedDict):
    uid: str
    kind: GroupVersionKind
    resource: NotRequired[dict[str, str]]
    subResource: NotRequired[str]
    name: NotRequired[str]
    namespace: NotRequired[str]
    operation: Operation
    userInfo: NotRequired[UserInfo]
    object: NotRequired[dict[str, Any] | None]
    oldObject: NotRequired[dict[str, Any] | None]
    dryRun: NotRequired[bool]
    options: NotRequired[dict[str, Any] | None]


class Status(TypedDict, total=False):
    code: int
    reason: str
    message: str
    details: dict[str, Any]


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patch: NotRequired[str]
    patchType: NotRequired[Literal["JSONPatch"]]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class AdmissionReviewResponse(TypedDict):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    response: AdmissionResponse
