"""GPU resource names are exact.

Restricted: a name under a GPU vendor domain that is a near miss of a name the policy knows
(case, a missing or extra separator, a plural, words swapped, one letter off: ``nvidia.com/GPU``,
``nvidia.com/gpus``, ``nvidia.com/mig-1g10gb``, ``nvidia.com/sharedgpu``), which would pend
forever because no node advertises it; a malformed MIG name; a well-formed MIG profile that no
declared product offers (a warning by default: new hardware must not be blocked by an old
catalogue); a retired name such as ``alpha.kubernetes.io/nvidia-gpu``. Allowed: declared names
and catalogued MIG profiles; the policy's ``companionResources``. Other undeclared names
under the domain (the network operator's ``nvidia.com/hostdev``) are warned, unless the policy
says Allow or Deny. Past ``MAX_UNDECLARED_NAMES`` undeclared names in one template, judging
stops with a denial. With the node inventory, an undeclared name that no node advertises is
warned (even where ``unknownResources`` is Allow), with the names nodes do advertise.
"""

from __future__ import annotations

from collections.abc import Iterator
from difflib import SequenceMatcher

from webhook.core.findings import Violation, quote
from webhook.core.pods import ContainerView, PodView
from webhook.core.wording import names
from webhook.policy import mig
from webhook.policy.model import Policy

RULE = "resource-name"
# Diagnosing an undeclared name takes microseconds, a review can name thousands of them in a
# few kilobytes, and the worker's event loop waits while they are judged. No real Pod
# template names a hundred vendor resources that no node advertises (a node with eight
# RDMA rails advertises eight).
MAX_UNDECLARED_NAMES = 100
# The names nodes advertise that a warning suggests, closest first.
MAX_SUGGESTIONS = 6
# Ranking the advertised names by likeness costs the product of the names' lengths for each
# one: done for the first undeclared names of a template only, and only for a name as long
# as a resource name can be (a qualified name's part after the domain has at most 63
# characters; a custom resource's template is not held to it). 100 names of 600 characters
# against 12 advertised took half a second all ranked; now a template of them takes 0.3 ms
# more than without the inventory, and one of 100 valid MIG names 2.2 ms more.
RANKED_NAMES = 8
MAX_NAME_LENGTH = 63


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    undeclared = 0
    for container in view.gpu_containers:
        for name in container.gpu:
            if name in policy.declared_names or name in policy.companion_names:
                continue
            undeclared += 1
            if undeclared > MAX_UNDECLARED_NAMES:
                yield _too_many(view, container, name, policy)
                return
            found = _diagnose(name, policy)
            if view.nodes is not None and policy.node_inventory.advertised_names:
                ranked = undeclared <= RANKED_NAMES
                found = _unadvertised(name, found, view.nodes.advertised(), ranked)
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


def _too_many(view: PodView, container: ContainerView, name: str, policy: Policy) -> Violation:
    """One denial for the names past the limit: judging stops there, and what was not judged
    could be a near miss that pends forever, so it is not let through as a warning. The
    names it stands for are its identity: an UPDATE that changes them is not forgiven for
    what the old object had."""
    known = policy.declared_names | policy.companion_names
    undeclared = [f"{c.name}/{n}" for c in view.gpu_containers for n in c.gpu if n not in known]
    unjudged = ",".join(sorted(undeclared[MAX_UNDECLARED_NAMES:]))
    total = len(undeclared)
    return Violation(
        rule=RULE,
        path=container.resource_path(name),
        value=name,
        message=(
            f"the Pod names {total} resources under GPU vendor domains that this policy does "
            f"not declare; the first {MAX_UNDECLARED_NAMES} are judged, not the rest"
        ),
        hint=(
            "ask only for resources the nodes advertise, and declare the ones they do in the "
            "policy (resources or companionResources)"
        ),
        error_type="Forbidden",
        subject=container.name,
        field=f"{container.list_name}.resources, not judged: {unjudged}",
    )


def _unadvertised(
    name: str, found: tuple[str, str, bool] | None, advertised: frozenset[str], ranked: bool
) -> tuple[str, str, bool] | None:
    """What the node inventory adds about an undeclared name: when no node advertises it, a
    warning (of its own, or in the policy's warning) with the names nodes do advertise,
    closest first where ``ranked``. A denial stays the policy's, as it was: the inventory
    alone never denies."""
    if name in advertised or (found is not None and not found[2]):
        return found
    domain, _, short = name.partition("/")
    same_domain = [n for n in advertised if n.partition("/")[0] == domain]
    if same_domain:
        if ranked and len(short) <= MAX_NAME_LENGTH:
            closest = sorted(
                same_domain, key=lambda n: (-SequenceMatcher(None, name, n).ratio(), n)
            )
        else:
            closest = sorted(same_domain)
        suggestion = "nodes advertise " + names(closest, MAX_SUGGESTIONS)
    else:
        suggestion = f"no node advertises any resource under {domain} now"
    if found is None:
        return (
            f"no node advertises {quote(name)}, so the Pod would pend until one does",
            f"{suggestion}; a node pool that scales from zero advertises it once it is up",
            True,
        )
    message, hint, _ = found
    # The nodes' names first: a warning is cut short past its length limit.
    return f"{message}; no node advertises it", f"{suggestion}; {hint}", True


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
        close = mig.closest_profile(mig.base_profile(profile), policy.mig_sizes)
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
    match = policy.near_misses.match(name)
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
