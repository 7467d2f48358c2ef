"""Policy lint, in one place: the errors that refuse a policy and the warnings that flag one.

Errors come in two rounds around the JSON Schema: before it, what deserves a better message
than "unknown field"; after it, what the schema cannot say (MIG names against the catalogue,
sharing modes that cannot go together, duplicate names, globs and node selector operators).
Warnings need the compiled policy: they look at the policy as a whole.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterator
from typing import Any

from webhook.policy import mig
from webhook.policy.dra_lint import dra_errors, dra_warnings
from webhook.policy.grant_lint import grant_errors
from webhook.policy.lines import LineFinder, render_path
from webhook.policy.mode_lint import (
    entitlement_warnings,
    exception_notes,
    queue_warnings,
    reachable_pods_warnings,
)
from webhook.policy.model import SOFTWARE_SHARING, Policy, PolicyWarning
from webhook.policy.mutation_lint import mutation_errors, mutation_warnings
from webhook.policy.namespace_lint import (
    exemption_notes,
    moved_field_warnings,
    namespace_warnings,
)
from webhook.policy.pool_lint import pool_warnings
from webhook.policy.tenant_lint import Report, lint_expression, tenant_errors
from webhook.policy.workloads import (
    BUILTIN_WORKLOADS,
    TemplatePathError,
    catalogued_kinds,
    compile_template_path,
    entry_paths,
    replica_errors,
)

LABEL_SELECTOR_KEYS = ("labels", "matchLabels", "objectSelector", "podSelector", "selector")


# --- Errors -----------------------------------------------------------------------------


def pre_schema_errors(doc: Any, lines: LineFinder) -> list[str]:
    """Errors that deserve a better message than the schema's 'unknown field'."""
    errors: list[str] = []
    spec = doc.get("spec") if isinstance(doc, dict) else None
    spec = spec if isinstance(spec, dict) else {}
    for path, exemption in _exemptions_written(spec):
        for key in LABEL_SELECTOR_KEYS:
            if isinstance(exemption, dict) and key in exemption:
                errors.append(
                    lines.error(
                        [*path, key],
                        "exemptions cannot select by object label: whoever can create a Pod "
                        "sets its labels and would exempt themselves; exempt by namespace "
                        "(optionally narrowed to serviceAccounts) instead",
                    )
                )
    return errors


def _exemptions_written(spec: dict[str, Any]) -> Iterator[tuple[list[Any], Any]]:
    """Every exemption of a document not yet checked by the schema, with its path: those of
    ``exemptions`` and of each ``tenants`` entry."""

    def items(value: Any) -> list[Any]:
        return value if isinstance(value, list) else []

    for i, exemption in enumerate(items(spec.get("exemptions"))):
        yield ["spec", "exemptions", i], exemption
    for i, tenant in enumerate(items(spec.get("tenants"))):
        written = tenant.get("exemptions") if isinstance(tenant, dict) else None
        for j, exemption in enumerate(items(written)):
            yield ["spec", "tenants", i, "exemptions", j], exemption


def semantic_errors(doc: dict[str, Any], lines: LineFinder) -> list[str]:
    spec = doc["spec"]
    errors: list[str] = []

    def err(path: list[Any], message: str) -> None:
        errors.append(lines.error(path, message))

    tenant_errors(spec, err)
    mutation_errors(spec, err)
    dra_errors(spec, err)

    mig_spec = spec.get("migCatalogue", {})
    custom_products = mig_spec.get("customProducts", [])
    named = set(mig.CATALOGUE)  # grows product by product: a name given twice is reported
    for i, product in enumerate(custom_products):
        if product["name"] in named:
            err(
                ["spec", "migCatalogue", "customProducts", i, "name"],
                f"duplicate product {product['name']!r}: it is already catalogued",
            )
        for j, profile in enumerate(product["profiles"]):
            if not mig.is_well_formed(profile) or profile.endswith(".shared"):
                err(
                    ["spec", "migCatalogue", "customProducts", i, "profiles", j],
                    f"malformed MIG profile {profile!r}: expected <g>g.<mem>gb with an optional "
                    "attribute (.me, .me.all, .gfx, -me), e.g. 1g.10gb or 1g.10gb.me",
                )
        named.add(product["name"])
    catalogue = mig.catalogue_with(custom_products)
    products = mig_spec.get("products", ["*"])
    for i, product in enumerate(products):
        if product != "*" and product not in catalogue:
            close = difflib.get_close_matches(product, list(catalogue), 1, 0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            err(
                ["spec", "migCatalogue", "products", i],
                f"unknown GPU product {product!r}{hint}; catalogued: {', '.join(catalogue)}; "
                "add others under migCatalogue.customProducts",
            )
    if "*" not in products:
        for i, product in enumerate(custom_products):
            if product["name"] not in products:
                err(
                    ["spec", "migCatalogue", "customProducts", i, "name"],
                    f"custom product {product['name']!r} is not in migCatalogue.products, so "
                    'none of its profiles would be accepted; add it to products (or list "*")',
                )
    profiles = mig.catalogued_profiles(catalogue, products)
    domains = spec.get("vendorDomains", ["nvidia.com"])

    def lint_resource(path: list[Any], resource: dict[str, Any]) -> None:
        name, sharing = resource["name"], resource["sharing"]
        domain, _, short = name.partition("/")
        if domain not in domains:
            err(
                [*path, "name"],
                f"{name} is not under spec.vendorDomains ({', '.join(domains)}), so no Pod asking "
                f"for it would ever be judged; add {domain} to vendorDomains",
            )
        if domain in domains and short.startswith(mig.MIG_PREFIX):
            profile = short[len(mig.MIG_PREFIX) :]
            if not mig.is_well_formed(profile):
                err(
                    [*path, "name"],
                    f"malformed MIG resource name {name!r}: expected "
                    f"{domain}/mig-<g>g.<mem>gb[.me][.shared], e.g. {domain}/mig-1g.10gb",
                )
            elif mig.base_profile(profile) not in profiles:
                err(
                    [*path, "name"],
                    f"MIG profile {profile!r} is not offered by the declared "
                    f"products ({', '.join(products)}); declare the product in migCatalogue",
                )
            expected = "MIGTimeSlicing" if profile.endswith(".shared") else "MIG"
            if sharing != expected:
                err([*path, "sharing"], f"{name} is a MIG instance: sharing must be {expected}")
        elif sharing in ("MIG", "MIGTimeSlicing") and short != "gpu":
            err(
                [*path, "sharing"],
                f"{name} is not a MIG resource name: only nvidia.com/gpu "
                "(MIG strategy single) or nvidia.com/mig-<profile> can be MIG",
            )
        if short.endswith(".shared") and sharing not in SOFTWARE_SHARING:
            err(
                [*path, "sharing"],
                f"{name} is a shared replica: sharing must be TimeSlicing, MPS or MIGTimeSlicing",
            )
        if resource.get("failRequestsGreaterThanOne") and sharing not in SOFTWARE_SHARING:
            err(
                [*path, "failRequestsGreaterThanOne"],
                "only applies to time-slicing or MPS replicas",
            )

    seen_resources: set[str] = set()
    for i, resource in enumerate(spec.get("resources", [])):
        if resource["name"] in seen_resources:
            err(["spec", "resources", i, "name"], f"duplicate resource {resource['name']!r}")
        seen_resources.add(resource["name"])
        lint_resource(["spec", "resources", i], resource)

    seen_pools: set[str] = set()
    for i, pool in enumerate(spec.get("pools", [])):
        path = ["spec", "pools", i]
        if pool["name"] in seen_pools:
            err([*path, "name"], f"duplicate pool name {pool['name']!r}")
        seen_pools.add(pool["name"])
        names: set[str] = set()
        modes: set[str] = set()
        for j, resource in enumerate(pool["resources"]):
            if resource["name"] in names:
                err([*path, "resources", j, "name"], f"duplicate resource {resource['name']!r}")
            names.add(resource["name"])
            modes.add(resource["sharing"])
            lint_resource([*path, "resources", j], resource)
        software = modes & SOFTWARE_SHARING
        if software and "Exclusive" in modes:
            err(
                [*path, "resources"],
                f"pool {pool['name']!r} mixes software sharing ({', '.join(sorted(software))}) "
                "with exclusive full cards: replicas share memory and faults with the cards "
                "they run on; put them in separate pools (MIG beside full cards is fine)",
            )
        if "MPS" in modes and modes & {"TimeSlicing", "MIGTimeSlicing"}:
            err(
                [*path, "resources"],
                f"pool {pool['name']!r} mixes time-slicing with MPS: a node runs one sharing "
                "mode; split the pool",
            )
        for j, pref in enumerate(pool.get("preferredAffinity", [])):
            for k, expr in enumerate(pref["matchExpressions"]):
                lint_expression(expr, [*path, "preferredAffinity", j, "matchExpressions", k], err)

    _lint_reserved_pools(spec, err)

    built_in = {(g, k) for g, k, _, _ in BUILTIN_WORKLOADS}
    seen_kinds: set[tuple[str, str]] = set()
    for i, workload in enumerate(spec.get("workloads", [])):
        key = (workload["group"], workload["kind"])
        if key in built_in or key in seen_kinds:
            err(
                ["spec", "workloads", i],
                f"duplicate workload kind {workload['kind']} in group {workload['group']!r}",
            )
        seen_kinds.add(key)
        for where, text in entry_paths(workload):
            try:
                compile_template_path(text)
            except TemplatePathError as exc:
                err(["spec", "workloads", i, *where], str(exc))
        for where, message in replica_errors(workload):
            err(["spec", "workloads", i, *where], message)
        for j, target in enumerate(workload.get("resources", [])):
            if not re.search(r"(?:^|\.)[A-Za-z_][A-Za-z0-9_]*$", target["path"]):
                err(
                    ["spec", "workloads", i, "resources", j, "path"],
                    f"invalid resources path {target['path']!r}: it must end in the field that "
                    "holds the ResourceRequirements",
                )
    catalogued = catalogued_kinds()
    for i, kind in enumerate(spec.get("catalogue", {}).get("disabled", [])):
        if (kind["group"], kind["kind"]) not in catalogued:
            err(
                ["spec", "catalogue", "disabled", i],
                f"{kind['kind']} in group {kind['group']!r} is not in the catalogue: "
                "nothing to switch off",
            )

    for i, override in enumerate(spec.get("namespaceOverrides", [])):
        for j, pattern in enumerate(override["namespaces"]):
            _lint_glob(pattern, ["spec", "namespaceOverrides", i, "namespaces", j], err)
    for i, exemption in enumerate(spec.get("exemptions", [])):
        for j, pattern in enumerate(exemption["namespaces"]):
            _lint_glob(pattern, ["spec", "exemptions", i, "namespaces", j], err)
    for i, tenant in enumerate(spec.get("tenants", [])):
        path = ["spec", "tenants", i]
        for j, pattern in enumerate(tenant.get("namespaces", [])):
            _lint_glob(pattern, [*path, "namespaces", j], err)
        grant_errors(tenant.get("grants", {}), [*path, "grants"], err)
    return errors


def _lint_reserved_pools(spec: dict[str, Any], err: Report) -> None:
    """A pool reserved for some namespaces must be one the mutating webhook can keep other Pods
    off by adding to their node affinity (``key NotIn [value]``): it needs a label that no
    other pool sets to the same value."""
    pools = spec.get("pools", [])
    reserved = {name for t in spec.get("tenants", []) for name in t.get("reservedPools", [])}
    for i, pool in enumerate(pools):
        if "namespaces" not in pool and pool["name"] not in reserved:
            continue
        labels = pool["nodeSelector"].items()
        others = [p["nodeSelector"] for j, p in enumerate(pools) if j != i]
        if not any(all(other.get(k) != v for other in others) for k, v in labels):
            err(
                ["spec", "pools", i, "nodeSelector"],
                f"pool {pool['name']!r} is reserved for some namespaces, but each of its labels "
                "is set the same way by another pool, so no node affinity added to a Pod can "
                "keep it off this pool alone; give it a label of its own, e.g. "
                f"accelerator.example.com/pool: {pool['name']}",
            )


def _lint_glob(pattern: str, path: list[Any], err: Report) -> None:
    try:
        re.compile(fnmatch.translate(pattern))
    except re.error as exc:
        err(path, f"invalid namespace pattern {pattern!r}: {exc}")


# --- Warnings ---------------------------------------------------------------------------


def warnings(policy: Policy, lines: LineFinder) -> tuple[PolicyWarning, ...]:
    """What only a whole-policy view shows, in line order: pools that can share nodes yet
    declare a resource differently, namespace overrides and exemptions that can never take
    effect, pools no governed namespace may use."""
    found: list[PolicyWarning] = []

    def warn(path: list[Any], message: str) -> None:
        found.append(PolicyWarning(lines.line(path), render_path(path), message))

    def inform(path: list[Any], message: str) -> None:
        found.append(PolicyWarning(lines.line(path), render_path(path), message, level="info"))

    found += moved_field_warnings(policy, lines)
    pool_warnings(policy, warn)
    namespace_warnings(policy, lines, warn)
    _lint_taints(policy, warn)
    reachable_pods_warnings(policy, lines, warn)
    exemption_notes(policy, inform)
    exception_notes(policy, inform)
    entitlement_warnings(policy, warn)
    queue_warnings(policy, warn)
    mutation_warnings(policy, warn, inform)
    dra_warnings(policy, warn)
    return tuple(sorted(found, key=lambda w: w.line))


def _lint_taints(policy: Policy, warn: Report) -> None:
    """Reachability rests on the GPU nodes' taints: say where none keeps Pods off them."""
    if not policy.gpu_nodes_tainted:
        return
    consequence = (
        "so nothing keeps any Pod off those nodes and the security rules bind every Pod with "
        "the gpuPods mode"
    )
    hard = ("NoSchedule", "NoExecute")
    if not policy.gpu_node_taints and not policy.pools:
        warn(
            ["spec"],
            f"no GPU node taint is declared (gpuNodeTaints or pool taints), {consequence}; "
            "declare the taints your GPU nodes carry, or set gpuNodesTainted: false to say that "
            "they carry none",
        )
        return
    if policy.gpu_node_taints and not any(t["effect"] in hard for t in policy.gpu_node_taints):
        warn(["spec", "gpuNodeTaints"], f"no NoSchedule or NoExecute taint here, {consequence}")
    for i, pool in enumerate(policy.pools):
        if not any(t["effect"] in hard for t in pool.taints):
            warn(
                ["spec", "pools", i],
                f"pool {pool.name!r} declares no NoSchedule or NoExecute taint, {consequence}",
            )
