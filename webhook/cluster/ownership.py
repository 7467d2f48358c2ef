"""Who owns what among listed objects: an object's reference, and the top controller that made
it (a Pod's Deployment through its ReplicaSet, a Job's CronJob, a PyTorchJob's Pods)."""

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


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The owner reference of the object's controller (the one whose template made it), or
    None. Only the controller counts: other owners (a garbage-collection link) made nothing."""
    return next((r for r in meta(obj).get("ownerReferences") or [] if r.get("controller")), None)


def root_of(obj: dict[str, Any], by_uid: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The top reported controller of an object among ``by_uid`` (Pod -> ReplicaSet ->
    Deployment, Pod -> Job -> CronJob, a PyTorchJob's Pods -> the PyTorchJob), or the object
    itself. In a loop of controllers (the API's bug) it is the last one before the loop
    closes."""
    seen = {meta(obj).get("uid")}
    while True:
        owner = controller_of(obj)
        parent = by_uid.get(str(owner.get("uid") or "")) if owner else None
        if parent is None or meta(parent).get("uid") in seen:
            return obj
        seen.add(meta(parent).get("uid"))
        obj = parent
