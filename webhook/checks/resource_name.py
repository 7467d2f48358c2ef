"""GPU resource names are exact.

Restricted: a name under a GPU vendor domain that is a near miss of a name the policy knows
(case, a missing or extra separator, a plural, words swapped, one letter off: ``nvidia.com/GPU``,
``nvidia.com/gpus``, ``nvidia.com/mig-1g10gb``, ``nvidia.com/sharedgpu``), which would pend
forever because no node advertises it; a malformed MIG name; a well-formed MIG profile that no
declared product offers (a warning by default: new hardware must not be blocked by an old
catalogue); a retired name such as ``alpha.kubernetes.io/nvidia-gpu``. Allowed: declared names
and catalogued MIG profiles; the policy's ``companionResources``. Other undeclared names
under the domain (the network operator's ``nvidia.com/hostdev``) are warned, unless the policy
says Allow or Deny.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView
from webhook.policy import mig
from webhook.policy.model import Policy
from webhook.policy.names import near_miss_key

RULE = "resource-name"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    for container in view.gpu_containers():
        for name in container.gpu:
            if name in policy.declared_names or name in policy.companion_names:
                continue
            found = _diagnose(name, policy)
            if found is not None:
                message, hint, advisory = found
                yield Violation(
                    rule=RULE,
                    path=container.resource_path(name),
                    value=name,
                    message=message,
                    hint=hint,
                    error_type="Unsupported value",
                    subject=container.name,
                    field=f"{container.list_name}.resources[{name}]",
                    advisory=advisory,
                )


def _diagnose(name: str, policy: Policy) -> tuple[str, str, bool] | None:
    if name in policy.retired:
        replacement, reason = policy.retired[name]
        because = f" ({reason})" if reason else ""
        return (
            f"{quote(name)} is a retired resource name{because}: no node advertises it",
            f"did you mean {replacement}?",
            False,
        )
    domain, _, short = name.partition("/")
    if short.startswith(mig.MIG_PREFIX) and mig.is_well_formed(short[len(mig.MIG_PREFIX) :]):
        profile = short[len(mig.MIG_PREFIX) :]
        products = (
            "any catalogued product"
            if "*" in policy.mig_products
            else ", ".join(policy.mig_products)
        )
        close = _closest_profile(mig.base_profile(profile), policy.mig_profiles)
        hint = (
            f"did you mean {domain}/mig-{close}?"
            if close
            else "check the node's capacity for the exact name"
        )
        return (
            f"MIG profile {quote(profile)} is not offered by the GPU products this cluster "
            f"declares "
            f"({products})",
            hint + "; new hardware goes into the policy's migCatalogue",
            policy.uncatalogued_mig == "Warn",
        )
    match = (
        policy.near_misses.get(near_miss_key(name))
        or _anagram(name, policy)
        or _one_edit_away(name, policy)
    )
    if match is not None:
        return (
            f"{quote(name)} is not a resource any node advertises, so the Pod would pend forever",
            f"did you mean {match}?",
            False,
        )
    if short.lower().startswith("mig"):
        example = min(policy.mig_profiles, default="1g.10gb")
        return (
            f"malformed MIG resource name {quote(name)}",
            f"write {domain}/mig-<g>g.<mem>gb exactly, e.g. {domain}/mig-{example}",
            False,
        )
    if policy.unknown_resources == "Allow":
        return None
    return (
        f"{quote(name)} is not a GPU resource this policy declares",
        "check the spelling against the node's capacity, or declare the resource in the policy",
        policy.unknown_resources == "Warn",
    )


def _closest_profile(profile: str, catalogued: frozenset[str]) -> str | None:
    """The catalogued profile with the same compute slices and the least memory that is at
    least as much as asked for (``1g.5gb`` on an 80 GB card: ``1g.10gb``), else the nearest."""
    wanted = mig.MIG_PROFILE.match(profile)
    same_compute = [
        (int(m["mem"]), p)
        for p in catalogued
        if (m := mig.MIG_PROFILE.match(p)) and m["gpc"] == wanted["gpc"] and not m["attr"]
    ]
    if not same_compute:
        close = difflib.get_close_matches(profile, sorted(catalogued), 1, 0.6)
        return close[0] if close else None
    memory = int(wanted["mem"])
    larger = sorted(c for c in same_compute if c[0] >= memory)
    return (larger or sorted(same_compute, key=lambda c: abs(c[0] - memory)))[0][1]


def _one_edit_away(name: str, policy: Policy) -> str | None:
    """``gpuu``, ``gou``, ``gp`` for ``gpu``: one letter added, changed or dropped."""
    domain, _, short = near_miss_key(name).partition("/")
    if len(short) < 2:
        return None
    for key, candidate in policy.near_misses.items():
        candidate_domain, _, candidate_short = key.partition("/")
        if candidate_domain == domain and _within_one_edit(short, candidate_short):
            return candidate
    return None


def _within_one_edit(a: str, b: str) -> bool:
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            rest = index + 1
            return a[rest:] == b[rest:] if len(a) == len(b) else a[index:] == b[rest:]
    return True


def _anagram(name: str, policy: Policy) -> str | None:
    """``sharedgpu`` for ``gpu.shared``: the same letters in another order."""
    key = sorted(near_miss_key(name).partition("/")[2])
    for candidate_key, candidate in policy.near_misses.items():
        if (
            sorted(candidate_key.partition("/")[2]) == key
            and candidate.split("/")[0] == name.split("/")[0]
        ):
            return candidate
    return None
