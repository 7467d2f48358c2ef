"""Who owns what among listed objects: an object's reference, and the reference of the
controller that made it (a Pod's ReplicaSet, a ReplicaSet's Deployment, a Job's CronJob, a
PyTorchJob's Pods)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Where a live object is: ``namespace/Kind/name`` and its uid."""

    namespace: str
    kind: str
    name: str
    uid: str

    def __str__(self) -> str:
        return "/".join(p for p in (self.namespace, self.kind, self.name) if p)

    def record(self) -> dict[str, str]:
        return {"ref": str(self), "uid": self.uid}


def meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def ref_of(obj: dict[str, Any]) -> ObjectRef:
    metadata = meta(obj)
    return ObjectRef(
        metadata.get("namespace", ""),
        obj.get("kind", ""),
        metadata.get("name", ""),
        metadata.get("uid", ""),
    )


def controller_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the object's controller (its owner reference with ``controller: true``)."""
    owners = meta(obj).get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, dict) and owner.get("controller") is True:
            uid = owner.get("uid")
            return uid if isinstance(uid, str) else None
    return None


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The owner reference of the object's controller (the one whose template made it), or
    None. Only the controller counts: other owners (a garbage-collection link) made nothing."""
    return next((r for r in meta(obj).get("ownerReferences") or [] if r.get("controller")), None)
