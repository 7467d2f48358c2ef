"""Loading a policy: YAML, JSON Schema, semantic lint, then compilation to ``webhook.model``.

All of this happens once, at load time. Every error names the source, the field path and the
line, and all errors are reported together, so an admin fixes a policy in one pass.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import posixpath
import re
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema
import yaml

from webhook import mig, schemas
from webhook.model import (
    RULE_IDS,
    SOFTWARE_SHARING,
    Exemption,
    NamespaceMatcher,
    NamespaceOverride,
    Policy,
    Pool,
    ResourceSpec,
    RuleModes,
    TemplatePath,
    WorkloadKind,
)

DEFAULT_RULE_MODES = {"gpuPods": "Enforce", "otherPods": "Audit"}
LABEL_SELECTOR_KEYS = ("labels", "matchLabels", "objectSelector", "podSelector", "selector")

# Built-in kinds whose pod templates are judged. "extensions" is the group that old manifests
# (and `kubectl get` output of old clusters) still carry for the apps kinds.
BUILTIN_WORKLOADS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("", "Pod", "pods", ("",)),
    ("", "ReplicationController", "replicationcontrollers", ("spec.template",)),
    ("apps", "Deployment", "deployments", ("spec.template",)),
    ("apps", "ReplicaSet", "replicasets", ("spec.template",)),
    ("apps", "StatefulSet", "statefulsets", ("spec.template",)),
    ("apps", "DaemonSet", "daemonsets", ("spec.template",)),
    ("extensions", "Deployment", "deployments", ("spec.template",)),
    ("extensions", "ReplicaSet", "replicasets", ("spec.template",)),
    ("extensions", "DaemonSet", "daemonsets", ("spec.template",)),
    ("batch", "Job", "jobs", ("spec.template",)),
    ("batch", "CronJob", "cronjobs", ("spec.jobTemplate.spec.template",)),
)


class PolicyError(ValueError):
    """A policy that cannot be used. ``errors`` holds one ``source:line: path: message`` each."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        head = f"policy {source} is invalid"
        super().__init__(head + ":\n  " + "\n  ".join(errors) if errors else head)


def schema() -> dict:
    """The policy's JSON Schema, shipped as package data (one source of truth)."""
    return schemas.load("policy.schema.json")


def _validator() -> jsonschema.protocols.Validator:
    return schemas.validator("policy.schema.json")


def default_policy_path() -> Path:
    """The packaged default policy, so an installed wheel works without a checkout."""
    return Path(str(resources.files("webhook").joinpath("data/default.yaml")))


def load_policy(path: str | Path) -> Policy:
    """Read, validate and compile a policy file."""
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(str(path), [f"{path}: cannot read: {exc}"]) from None
    return parse_policy(text, source=str(path))


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate and compile policy YAML text."""
    try:
        return _parse_policy(text, source)
    except RecursionError:
        # A YAML alias that contains itself (``x: &a [*a]``) has no JSON meaning.
        raise PolicyError(source, [f"{source}: a YAML alias refers to itself"]) from None


def _parse_policy(text: str, source: str) -> Policy:
    node, document = _parse_yaml(text, source)
    lines = _LineFinder(source, node)
    errors = _pre_schema_lint(document, lines)
    if not errors:
        for err in sorted(_validator().iter_errors(document), key=lambda e: list(e.absolute_path)):
            path = list(err.absolute_path)
            if err.validator == "additionalProperties" and isinstance(err.instance, dict):
                # Point at the unknown key itself, not at the object that holds it.
                extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
                path.append(extra[0])
            errors.append(lines.error(path, _schema_message(err)))
    if not errors:
        errors = _semantic_lint(document, lines)
    if errors:
        raise PolicyError(source, errors)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return _compile(document, source, digest)


# --- YAML with line numbers -------------------------------------------------------------


def _parse_yaml(text: str, source: str) -> tuple[yaml.Node, Any]:
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(source, [f"{where}: not valid YAML: {problem}"]) from None
    nodes = [n for n in nodes if n is not None]
    if len(nodes) != 1:
        raise PolicyError(source, [f"{source}: expected one YAML document, found {len(nodes)}"])
    node = nodes[0]
    duplicates = list(_duplicate_keys(node, []))
    if duplicates:
        raise PolicyError(
            source,
            [f"{source}:{line}: {_render_path(path)}: duplicate key" for path, line in duplicates],
        )
    try:
        document = yaml.SafeLoader(text).get_single_data()
    except yaml.YAMLError as exc:  # e.g. a !!python/object tag, which safe loading refuses
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PolicyError(source, [f"{where}: not valid YAML: {problem}"]) from None
    return node, document


def _duplicate_keys(node: yaml.Node, path: list) -> Any:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = key.value
            if name in seen:
                yield [*path, name], key.start_mark.line + 1
            seen.add(name)
            yield from _duplicate_keys(value, [*path, name])
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicate_keys(item, [*path, index])


class _LineFinder:
    def __init__(self, source: str, root: yaml.Node) -> None:
        self.source = source
        self.root = root

    def line(self, path: list) -> int:
        node = self.root
        for step in path:
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if key.value == step:
                        node = value
                        break
                else:
                    break
            elif isinstance(node, yaml.SequenceNode) and isinstance(step, int):
                if step >= len(node.value):
                    break
                node = node.value[step]
            else:
                break
        return node.start_mark.line + 1

    def error(self, path: list, message: str) -> str:
        return f"{self.source}:{self.line(path)}: {_render_path(path)}: {message}"


def _render_path(path: list) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out or "(document)"


def _schema_message(err: jsonschema.ValidationError) -> str:
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        known = sorted(err.schema.get("properties", {}))
        hints = [
            f"{name!r} (did you mean {close[0]!r}?)"
            if (close := difflib.get_close_matches(name, known, 1))
            else repr(name)
            for name in extra
        ]
        return f"unknown field {', '.join(hints)}; allowed: {', '.join(known)}"
    if err.validator == "enum":
        message = f"{err.instance!r} is not one of {', '.join(map(str, err.validator_value))}"
        if err.instance is False and "Off" in err.validator_value:
            message += ' (YAML reads an unquoted Off as false: write "Off")'
        return message
    return err.message


# --- Lint -------------------------------------------------------------------------------


def _pre_schema_lint(doc: Any, lines: _LineFinder) -> list[str]:
    """Errors that deserve a better message than the schema's 'unknown field'."""
    errors: list[str] = []
    spec = doc.get("spec") if isinstance(doc, dict) else None
    exemptions = spec.get("exemptions") if isinstance(spec, dict) else None
    for index, exemption in enumerate(exemptions if isinstance(exemptions, list) else []):
        for key in LABEL_SELECTOR_KEYS:
            if isinstance(exemption, dict) and key in exemption:
                errors.append(
                    lines.error(
                        ["spec", "exemptions", index, key],
                        "exemptions cannot select by object label: whoever can create a Pod "
                        "sets its labels and would exempt themselves; exempt by namespace "
                        "(optionally narrowed to serviceAccounts) instead",
                    )
                )
    return errors


def _semantic_lint(doc: dict, lines: _LineFinder) -> list[str]:
    spec = doc["spec"]
    errors: list[str] = []

    def err(path: list, message: str) -> None:
        errors.append(lines.error(path, message))

    catalogue = dict(mig.CATALOGUE)
    mig_spec = spec.get("migCatalogue", {})
    for i, product in enumerate(mig_spec.get("customProducts", [])):
        if product["name"] in catalogue:
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
        catalogue[product["name"]] = {p: 1 for p in product["profiles"]}
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
    profiles = _catalogued_profiles(catalogue, products)
    domains = spec.get("vendorDomains", ["nvidia.com"])

    def lint_resource(path: list, resource: dict) -> None:
        name, sharing = resource["name"], resource["sharing"]
        domain, _, short = name.partition("/")
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
                _lint_expression(expr, [*path, "preferredAffinity", j, "matchExpressions", k], err)

    seen_kinds = {(g, k) for g, k, _, _ in BUILTIN_WORKLOADS}
    for i, workload in enumerate(spec.get("workloads", [])):
        key = (workload["group"], workload["kind"])
        if key in seen_kinds:
            err(
                ["spec", "workloads", i],
                f"duplicate workload kind {workload['kind']} in group {workload['group']!r}",
            )
        seen_kinds.add(key)
        for j, template in enumerate(workload["templates"]):
            try:
                compile_template_path(template)
            except ValueError as exc:
                err(["spec", "workloads", i, "templates", j], str(exc))

    for i, override in enumerate(spec.get("namespaceOverrides", [])):
        for j, pattern in enumerate(override["namespaces"]):
            _lint_glob(pattern, ["spec", "namespaceOverrides", i, "namespaces", j], err)
    for i, exemption in enumerate(spec.get("exemptions", [])):
        for j, pattern in enumerate(exemption["namespaces"]):
            _lint_glob(pattern, ["spec", "exemptions", i, "namespaces", j], err)
    return errors


def _lint_expression(expr: dict, path: list, err: Any) -> None:
    operator, values = expr["operator"], expr.get("values")
    if operator in ("In", "NotIn") and not values:
        err(path, f"operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        err(path, f"operator {operator} takes no values")
    if operator in ("Gt", "Lt") and (not values or len(values) != 1 or not values[0].isdigit()):
        err(path, f"operator {operator} takes exactly one integer value")


def _lint_glob(pattern: str, path: list, err: Any) -> None:
    try:
        re.compile(fnmatch.translate(pattern))
    except re.error as exc:
        err(path, f"invalid namespace pattern {pattern!r}: {exc}")


def _catalogued_profiles(catalogue: dict, products: list[str]) -> dict[str, int]:
    chosen = list(catalogue) if "*" in products else [p for p in products if p in catalogue]
    profiles: dict[str, int] = {}
    for product in chosen:
        for profile, count in catalogue[product].items():
            profiles[profile] = max(count, profiles.get(profile, 0))
    return profiles


# --- Template paths ---------------------------------------------------------------------

_SEGMENT = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*|\*)(?P<items>\[\*\])?\Z")


def compile_template_path(text: str) -> TemplatePath:
    """``spec.replicatedJobs[*].template.spec.template`` to steps; "" is the object itself."""
    steps: list[tuple[str, ...]] = []
    if text:
        for segment in text.split("."):
            match = _SEGMENT.match(segment)
            if match is None:
                raise ValueError(
                    f"invalid template path {text!r} at {segment!r}: use field names joined by "
                    "'.', '*' for every value of a map and '[*]' for every item of a list"
                )
            steps.append(("values",) if match["name"] == "*" else ("field", match["name"]))
            if match["items"]:
                steps.append(("items",))
    return TemplatePath(text=text, steps=tuple(steps))


# --- Compilation ------------------------------------------------------------------------


def _namespaces(patterns: list[str]) -> NamespaceMatcher:
    regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
    return NamespaceMatcher(patterns=tuple(patterns), regex=regex)


def _resource(raw: dict, defaults: ResourceSpec | None = None) -> ResourceSpec:
    """A resource declaration; a pool's inherits the cluster-wide one's per-Pod limits."""
    return ResourceSpec(
        name=raw["name"],
        sharing=raw["sharing"],
        per_node=raw.get("perNode"),
        max_per_pod=raw.get("maxPerPod", defaults.max_per_pod if defaults else None),
        fail_requests_greater_than_one=raw.get(
            "failRequestsGreaterThanOne",
            defaults.fail_requests_greater_than_one if defaults else False,
        ),
    )


def _rule_modes(base: dict[str, RuleModes], ruleset: dict) -> MappingProxyType:
    """``ruleset``'s modes over ``base``. Its ``default`` changes the mode of rules that are
    on; a rule (or scope) that is Off in ``base`` comes back only where ``ruleset`` names it,
    so a namespace override's default never re-enables what the policy turned off."""
    default = ruleset.get("default", {})
    out: dict[str, RuleModes] = {}
    for rule in RULE_IDS:
        current = base[rule]
        named = ruleset.get(rule, {})
        entry = {**default, **named}
        if entry.get("enabled") is False:
            out[rule] = RuleModes("Off", "Off")
            continue
        gpu_pods = entry.get("gpuPods", current.gpu_pods)
        other_pods = entry.get("otherPods", current.other_pods)
        out[rule] = RuleModes(
            "Off" if current.gpu_pods == "Off" and "gpuPods" not in named else gpu_pods,
            "Off" if current.other_pods == "Off" and "otherPods" not in named else other_pods,
        )
    return MappingProxyType(out)


def _frozen(mapping: dict) -> MappingProxyType:
    return MappingProxyType({k: tuple(v) if isinstance(v, list) else v for k, v in mapping.items()})


def _compile(doc: dict, source: str, digest: str) -> Policy:
    spec = doc["spec"]
    catalogue = dict(mig.CATALOGUE)
    mig_spec = spec.get("migCatalogue", {})
    for product in mig_spec.get("customProducts", []):
        catalogue[product["name"]] = {p: 1 for p in product["profiles"]}
    products = mig_spec.get("products", ["*"])
    profile_counts = _catalogued_profiles(catalogue, products)

    resources_ = {r["name"]: _resource(r) for r in spec.get("resources", [])}
    pools = tuple(
        Pool(
            name=p["name"],
            node_selector=MappingProxyType(dict(p["nodeSelector"])),
            resources=MappingProxyType(
                {r["name"]: _resource(r, resources_.get(r["name"])) for r in p["resources"]}
            ),
            gpus_per_node=p.get("gpusPerNode"),
            taints=tuple(_frozen(t) for t in p.get("taints", [])),
            preferred_affinity=tuple(
                MappingProxyType(
                    {
                        "weight": a["weight"],
                        "matchExpressions": tuple(_frozen(e) for e in a["matchExpressions"]),
                    }
                )
                for a in p.get("preferredAffinity", [])
            ),
            require_node_affinity=p.get("requireNodeAffinity", True),
            namespaces=_namespaces(p["namespaces"]) if "namespaces" in p else None,
        )
        for p in spec.get("pools", [])
    )
    builtin = {
        r: RuleModes(DEFAULT_RULE_MODES["gpuPods"], DEFAULT_RULE_MODES["otherPods"])
        for r in RULE_IDS
    }
    rules = _rule_modes(builtin, spec.get("rules", {}))
    overrides = tuple(
        NamespaceOverride(_namespaces(o["namespaces"]), _rule_modes(dict(rules), o["rules"]))
        for o in spec.get("namespaceOverrides", [])
    )
    exemptions = tuple(
        Exemption(
            namespaces=_namespaces(e["namespaces"]),
            service_accounts=frozenset(e["serviceAccounts"]) if "serviceAccounts" in e else None,
            rules=frozenset(e["rules"]) if "rules" in e else None,
        )
        for e in spec.get("exemptions", [])
    )
    workloads: dict[tuple[str, str], WorkloadKind] = {}
    for group, kind, resource, paths in BUILTIN_WORKLOADS:
        workloads[(group, kind)] = WorkloadKind(
            group, kind, resource, tuple(compile_template_path(p) for p in paths)
        )
    for w in spec.get("workloads", []):
        workloads[(w["group"], w["kind"])] = WorkloadKind(
            w["group"],
            w["kind"],
            w.get("resource", w["kind"].lower() + "s"),
            tuple(compile_template_path(p) for p in w["templates"]),
        )
    domains = tuple(spec.get("vendorDomains", ["nvidia.com"]))
    declared = set(resources_)
    for pool in pools:
        declared.update(pool.resources)
    for domain in domains:
        for profile in profile_counts:
            declared.add(f"{domain}/mig-{profile}")
            declared.add(f"{domain}/mig-{profile}.shared")
    mutation = spec.get("mutation", {})
    return Policy(
        name=doc["metadata"]["name"],
        source=source,
        sha256=digest,
        vendor_domains=domains,
        resources=MappingProxyType(resources_),
        unknown_resources=spec.get("unknownResources", "Warn"),
        mig_products=tuple(products),
        mig_profiles=frozenset(profile_counts),
        mig_profile_counts=MappingProxyType(profile_counts),
        uncatalogued_mig=mig_spec.get("uncataloguedProfiles", "Warn"),
        pools=pools,
        gpu_node_taints=tuple(_frozen(t) for t in spec.get("gpuNodeTaints", [])),
        host_device_paths=tuple(
            normalise_host_path(p) for p in spec.get("hostDevices", {}).get("paths", [])
        ),
        inject_void=spec.get("deviceVisibility", {}).get("injectVoid", False),
        mutation_enabled=mutation.get("enabled", True),
        mutation_mode=mutation.get("mode", "Apply"),
        rules=rules,
        namespace_overrides=overrides,
        exemptions=exemptions,
        workloads=MappingProxyType(workloads),
        declared_names=frozenset(declared),
        near_misses=MappingProxyType({near_miss_key(n): n for n in sorted(declared)}),
        gpu_label_keys=frozenset(k for pool in pools for k in pool.node_selector),
        gpu_taint_keys=frozenset(
            [t["key"] for t in spec.get("gpuNodeTaints", [])]
            + [t["key"] for pool in pools for t in pool.taints]
        ),
        retired=MappingProxyType(
            {
                r["name"]: (r["replacement"], r.get("reason", ""))
                for r in spec.get("retiredResources", [])
            }
        ),
    )


def normalise_host_path(path: str) -> str:
    """``//dev/./nvidia0/`` is ``/dev/nvidia0``: what the kubelet would mount."""
    return posixpath.normpath(re.sub(r"/+", "/", path)) if path else path


def near_miss_key(name: str) -> str:
    """What a resource name looks like with case, separators and a plural 's' ignored."""
    key = re.sub(r"[-._+]", "", name.lower())
    return key[:-1] if key.endswith("s") else key
