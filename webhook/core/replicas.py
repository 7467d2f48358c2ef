"""How many Pods of one template a workload runs at once, as its kind declares the count
(``webhook.policy.model.PodTarget.replicas``: a Deployment's ``spec.replicas``, a JobSet's
``replicatedJobs[*].replicas`` times its Jobs' parallelism), read from the object as written.

A count not written takes the kind's default; one that has none, or a value that is not a
whole number, leaves the count unknown (None): nothing is said of a count that is not known.
What scales a workload later (``kubectl scale``, an autoscaler, through ``/scale``) is never
seen here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from webhook.core.paths import walk_path
from webhook.policy.model import CountField, ReplicaFactor


class Counted(NamedTuple):
    """Where a template's count is read, kept on its view until a check asks: the object, its
    target's factors and the match's field path (reading it costs a third of building the
    view, and only a tenant's ``maxGPUs`` needs it)."""

    obj: Mapping[str, Any]
    factors: tuple[ReplicaFactor, ...]
    where: str


class Replicas(NamedTuple):
    """How many Pods of a template run at once: ``pods``; ``path`` the field to change (the
    first factor's, where it is or would be written); ``shown`` how the count is made, for a
    message (``replicas 2 × (size 4 − 1)``)."""

    pods: int
    path: str
    shown: str


def replicas_of(counted: Counted) -> Replicas | None:
    """The count of the match at ``counted.where`` of a target with these factors."""
    obj, where = counted.obj, counted.where
    count, path, shown = 1, "", []
    for factor in counted.factors:
        value, at = _value(obj, factor.count, where)
        if value is None:
            value = factor.default
        if not _whole(value):
            return None
        said = f"{factor.count.fields[-1]} {value}"
        for bound, raises in ((factor.at_least, True), (factor.at_most, False)):
            limit, limit_at = _value(obj, bound, where) if bound is not None else (None, "")
            if bound is not None and _whole(limit) and (limit > value if raises else limit < value):
                value, at, said = limit, limit_at, f"{bound.fields[-1]} {limit}"
        if factor.less_one_with is not None and value > 0:
            written, _ = _value(obj, factor.less_one_with, where)
            if written is not None:
                value, said = value - 1, f"({said} − 1)"
        count *= value
        path = path or at
        shown.append(said)
    return Replicas(count, path, " × ".join(shown))


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _value(obj: Mapping[str, Any], field: CountField, where: str) -> tuple[Any, str]:
    """The value of ``field`` for the match at ``where`` (None when absent), and its path."""
    for prefix, _, node in walk_path(obj, field.prefix):
        if prefix and where != prefix and not where.startswith((f"{prefix}.", f"{prefix}[")):
            continue
        value: Any = node
        for name in field.fields:
            value = value.get(name) if isinstance(value, dict) else None
        return value, ".".join((prefix, *field.fields)) if prefix else ".".join(field.fields)
    return None, ""
