"""Properties of the mutate path over generated Pods (hypothesis, derandomized).

For every generated Pod, under the default policy and a pool policy:

- the response denies exactly the Pods with a fractional GPU quantity, and patches nothing then;
- the patch is add-only, applies with the ``jsonpatch`` library and with ``kubectl patch
  --local`` (Go's JSON-Patch, as the API server applies it) to the same object;
- the patched Pod is a valid 1.32 Pod, the patch introduces no problem the API server would
  reject (Exists tolerations without values, Equal ones with keys, no empty nodeSelectorTerms),
  and it keeps everything the user wrote (lists only grow at their end);
- every taint of the chosen pool(s) is tolerated; with a single pool the Pod is confined to
  its nodes (every nodeSelectorTerm carries the pool's expression unless the nodeSelector
  already pins it) and prefers what the pool prefers;
- mutating the patched Pod plans nothing.

Also with injectVoid: every container without a GPU gets NVIDIA_VISIBLE_DEVICES, GPU
containers are untouched. And with the GPU defaults: a bare GPU Pod without a deadline gets
the policy's, every GPU container of a Pod of several GPUs mounts a memory-backed volume at
/dev/shm, nothing else changes and no class is ever added to a Pod. kubectl runs on every
patch of the ``*_with_kubectl`` properties (60 examples per policy); the ``*_more_examples``
ones apply with jsonpatch only. And no operation is redundant: each one changes the Pod.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.patching import (
    DEFAULT_DOC,
    GENERATION_KEY,
    POOL_KEY,
    POOLS_DOC,
    admits_node,
    apply_jsonpatch,
    apply_kubectl,
    assert_add_only,
    can_reach_gpu_nodes,
    decide,
    decode_patch,
    policy_from,
    pool_selection,
    preferred_terms,
    required_terms,
    semantic_problems,
    term_requires,
    tolerated,
    validate_pod,
)
from webhook.policy.model import INJECTED_ANNOTATION, POOL_ANNOTATION, Policy
from webhook.policy.quantity import parse_quantity

DEFAULT = policy_from(DEFAULT_DOC)
POOLS = policy_from(POOLS_DOC)
POOLS_VOID = policy_from(POOLS_DOC, deviceVisibility={"injectVoid": True})
# Every GPU default: only a bare Pod's deadline and the shared memory of Pods of several GPUs
# apply to Pods (the classes go on workload templates).
POOLS_DEFAULTS = policy_from(
    POOLS_DOC,
    mutation={
        "enabled": True,
        "gpuDefaults": {
            "runtimeClassName": "nvidia-cdi",
            "priorityClassName": "gpu-batch",
            "activeDeadlineSeconds": {"barePods": 3600, "jobs": 86400},
            "sharedMemory": {"enabled": True, "sizeLimit": "8Gi"},
        },
    },
)
POLICIES = {
    "default": DEFAULT,
    "pools": POOLS,
    "pools-void": POOLS_VOID,
    "pools-defaults": POOLS_DEFAULTS,
}
SHM = "/dev/shm"

MIRROR = "kubernetes.io/config.mirror"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"

# --- The generator ------------------------------------------------------------------------

GPU_RESOURCES = [
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-3g.40gb",
    "nvidia.com/mig-1g.10gb.shared",
    "nvidia.com/mig-7g.80gb",
]
WHOLE = ["1", "2", "0", 1, "1000m"]
FRACTIONAL = ["0.5", "500m"]

ENVS = {
    "absent": ...,
    "null": None,
    "empty": [],
    "other": [{"name": "LOG_LEVEL", "value": "debug"}],
    "visible": [{"name": VISIBLE, "value": "all"}],
}

TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
    {"key": POOL_KEY, "operator": "Equal", "value": "training", "effect": "NoSchedule"},
    {"key": POOL_KEY, "operator": "Equal", "value": "mig"},
    {"key": "nvidia.com/gpu", "operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"operator": "Exists"},
    {"key": "example.com/spot", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent", "effect": "NoSchedule"},
    {"key": POOL_KEY, "operator": "Exists", "effect": "NoExecute"},
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
]


def _in(key: str, *values: str) -> dict:
    return {"key": key, "operator": "In", "values": list(values)}


EXPRESSIONS = [
    _in(POOL_KEY, "training"),
    _in(POOL_KEY, "mig"),
    _in(POOL_KEY, "shared"),
    _in(POOL_KEY, "training", "mig", "shared"),
    {"key": POOL_KEY, "operator": "NotIn", "values": ["mps"]},
    _in("topology.kubernetes.io/zone", "a", "b"),
    {"key": "kubernetes.io/arch", "operator": "Exists"},
    {"key": "example.com/cpu-only", "operator": "DoesNotExist"},
]
FIELDS = [{"key": "metadata.name", "operator": "In", "values": ["node-1", "node-2"]}]
PREFERENCES = [
    {"weight": 50, "preference": {"matchExpressions": [_in(GENERATION_KEY, "hopper")]}},
    {"weight": 50, "preference": {"matchExpressions": [_in(GENERATION_KEY, "ampere")]}},
    {"weight": 20, "preference": {"matchExpressions": [_in(GENERATION_KEY, "hopper")]}},
    {"weight": 1, "preference": {"matchExpressions": [_in("topology.kubernetes.io/zone", "a")]}},
]
NODE_SELECTORS = [
    {POOL_KEY: "training"},
    {POOL_KEY: "shared"},
    {POOL_KEY: "mig"},
    {"kubernetes.io/arch": "amd64"},
    {GENERATION_KEY: "hopper", POOL_KEY: "mig"},
]
ANNOTATION_KEYS = [
    "example.com/team",
    "example.com/a~b",
    "c~1d",
    "e~0f/g",
    "plain",
    INJECTED_ANNOTATION,
    POOL_ANNOTATION,
]
POOL_NAMES = ["training", "shared", "mps", "mig", "restricted", "nope"]


@st.composite
def containers(
    draw, prefix: str, *, max_size: int, min_size: int, envs: list[str], resources: list
) -> list:
    out = []
    for index in range(draw(st.integers(min_size, max_size))):
        container: dict[str, Any] = {"name": f"{prefix}{index}", "image": "example.com/app:1"}
        resource = draw(st.sampled_from([None, *resources]))
        if resource is not None:
            quantity = draw(st.sampled_from(WHOLE * 6 + FRACTIONAL))
            where = draw(st.sampled_from(["limits", "limits", "both"]))
            container["resources"] = {"limits": {resource: quantity}}
            if where == "both":
                container["resources"]["requests"] = {resource: quantity}
        env = ENVS[draw(st.sampled_from(envs))]
        if env is not ...:
            container["env"] = copy.deepcopy(env)
        out.append(container)
    return out


@st.composite
def terms(draw) -> list:
    out = []
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
        term: dict[str, Any] = {}
        shape = draw(
            st.sampled_from(
                [
                    "expressions",
                    "expressions",
                    "fields",
                    "both",
                    "null-expressions",
                    "empty-and-fields",
                ]
            )
        )
        if shape in ("expressions", "both"):
            term["matchExpressions"] = draw(
                st.lists(st.sampled_from(EXPRESSIONS), min_size=1, max_size=2, unique_by=str)
            )
        if shape == "empty-and-fields":
            term["matchExpressions"] = []
        if shape == "null-expressions":
            term["matchExpressions"] = None
        if shape != "expressions":
            term["matchFields"] = copy.deepcopy(FIELDS)
        out.append(term)
    return out


@st.composite
def affinities(draw) -> Any:
    shape = draw(st.sampled_from(["absent", "null", "empty", "node-null", *["node"] * 6]))
    if shape == "absent":
        return ...
    if shape in ("null", "empty", "node-null"):
        return {"null": None, "empty": {}, "node-null": {"nodeAffinity": None}}[shape]
    node: dict[str, Any] = {}
    required = draw(st.sampled_from(["absent", "null", "terms", "terms", "terms"]))
    if required == "null":
        node["requiredDuringSchedulingIgnoredDuringExecution"] = None
    elif required == "terms":
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": draw(terms())
        }
    preferred = draw(st.sampled_from(["absent", "null", "list"]))
    if preferred == "null":
        node["preferredDuringSchedulingIgnoredDuringExecution"] = None
    elif preferred == "list":
        node["preferredDuringSchedulingIgnoredDuringExecution"] = copy.deepcopy(
            draw(st.lists(st.sampled_from(PREFERENCES), max_size=3, unique_by=str))
        )
    return {"nodeAffinity": node}


@st.composite
def pods(draw) -> dict:
    metadata: dict[str, Any] = {"name": "p"}
    annotations = draw(st.sampled_from(["absent", "null", "map", "map"]))
    if annotations == "null":
        metadata["annotations"] = None
    elif annotations == "map":
        keys = draw(st.lists(st.sampled_from(ANNOTATION_KEYS), max_size=3, unique=True))
        metadata["annotations"] = {
            k: draw(st.sampled_from(POOL_NAMES)) if k == POOL_ANNOTATION else f"v-{i}"
            for i, k in enumerate(keys)
        }
        if draw(st.integers(0, 19)) == 0:
            metadata["annotations"][MIRROR] = "0123456789abcdef"
    # Mostly one GPU resource per Pod: a mix is mostly a Pod that no single pool can take.
    count = draw(st.sampled_from([1, 1, 1, 2]))
    # nvidia.com/mig-1g.10gb twice: it is the one that two pools offer alike (in "research").
    choices = [*GPU_RESOURCES, "nvidia.com/mig-1g.10gb"]
    resources = draw(
        st.lists(st.sampled_from(choices), min_size=count, max_size=count, unique=True)
    )
    spec: dict[str, Any] = {
        "containers": draw(
            containers("c", min_size=1, max_size=3, envs=list(ENVS), resources=resources)
        ),
    }
    init = draw(containers("i", min_size=0, max_size=2, envs=list(ENVS), resources=resources))
    if init or draw(st.booleans()):
        spec["initContainers"] = init
    tolerations = draw(st.sampled_from(["absent", "null", "list"]))
    owner = draw(st.sampled_from(["none", "none", "none", "controller", "owner"]))
    if owner != "none":
        reference = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u-1"}
        metadata["ownerReferences"] = [
            {**reference, "controller": True} if owner == "controller" else reference
        ]
    if draw(st.integers(0, 4)) == 0:
        spec["activeDeadlineSeconds"] = 600
    volumes = draw(st.sampled_from(["none", "none", "name-taken", "memory", "mounted", "mounted"]))
    if volumes == "name-taken":
        spec["volumes"] = [{"name": "gpu-admission-shm", "configMap": {"name": "settings"}}]
    elif volumes in ("memory", "mounted"):
        spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
        if volumes == "mounted":
            spec["containers"][0]["volumeMounts"] = [{"name": "dshm", "mountPath": SHM}]
    if tolerations == "null":
        spec["tolerations"] = None
    elif tolerations == "list":
        spec["tolerations"] = copy.deepcopy(
            draw(st.lists(st.sampled_from(TOLERATIONS), max_size=3, unique_by=str))
        )
    affinity = draw(affinities())
    if affinity is not ...:
        spec["affinity"] = affinity
    selector = draw(st.sampled_from(["absent", "absent", "empty", "labels"]))
    if selector == "empty":
        spec["nodeSelector"] = {}
    elif selector == "labels":
        spec["nodeSelector"] = dict(draw(st.sampled_from(NODE_SELECTORS)))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


NAMESPACES = st.sampled_from(["ml", "research"])

# --- The properties -----------------------------------------------------------------------


def _fractional(pod: Mapping, policy: Policy) -> bool:
    for list_name in ("initContainers", "containers"):
        for container in pod["spec"].get(list_name) or []:
            for values in (container.get("resources") or {}).values():
                for name, quantity in values.items():
                    if policy.is_vendor_resource(name):
                        parsed = parse_quantity(quantity)
                        if parsed is None or parsed.denominator != 1:
                            return True
    return False


def _extends(before: Any, after: Any, path: str = "") -> list[str]:
    """Where ``after`` does not keep ``before``: maps keep every key, lists only grow at the end,
    scalars stay, null may become anything."""
    if before is None:
        return []
    if isinstance(before, dict):
        if not isinstance(after, dict):
            return [f"{path}: an object became {after!r}"]
        out = []
        for key, value in before.items():
            if key not in after:
                out.append(f"{path}/{key}: removed")
            elif not (path == "/metadata/annotations" and key == INJECTED_ANNOTATION):
                out += _extends(value, after[key], f"{path}/{key}")
        return out
    if isinstance(before, list):
        if not isinstance(after, list) or len(after) < len(before):
            return [f"{path}: a list of {len(before)} became {after!r}"]
        return list(
            itertools.chain.from_iterable(
                _extends(b, a, f"{path}/{i}")
                for i, (b, a) in enumerate(zip(before, after, strict=False))
            )
        )
    return [] if before == after else [f"{path}: {before!r} became {after!r}"]


def _gpu_containers(pod: Mapping, policy: Policy) -> set[tuple[str, int]]:
    out = set()
    for list_name in ("initContainers", "containers"):
        for index, container in enumerate(pod["spec"].get(list_name) or []):
            # "Requests a GPU": a declared (or retired) GPU resource, in requests or limits, in
            # any quantity but a clean zero.
            resources = container.get("resources") or {}
            asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
            quantities = [
                parse_quantity(q)
                for n, q in asked.items()
                if n in policy.declared_names or n in policy.retired
            ]
            if any(q is None or q != 0 for q in quantities):
                out.add((list_name, index))
    return out


def _gpus(pod: Mapping, policy: Policy) -> int:
    """The Pod's GPUs as the scheduler counts them (no sidecars here): the app containers'
    sum, or the most one init container asks for."""

    def sharing(name: str) -> set[str]:
        declared = [policy.resources.get(name), *(p.resources.get(name) for p in policy.pools)]
        return {spec.sharing for spec in declared if spec is not None}

    def count(container: Mapping) -> int:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        return sum(
            int(parse_quantity(q) or 0)
            for n, q in asked.items()
            if n in policy.retired
            or n in policy.declared_names
            and sharing(n) <= {"Exclusive", "MIG"}
        )

    apps = sum(count(c) for c in pod["spec"].get("containers") or [])
    return max([apps, *(count(c) for c in pod["spec"].get("initContainers") or [])])


def _deadline_expected(pod: Mapping, policy: Policy, gpu: set[tuple[str, int]]) -> bool:
    """A bare Pod (no controller owns it) that asks for a GPU and sets no deadline."""
    owners = pod["metadata"].get("ownerReferences") or []
    return bool(
        policy.gpu_defaults.bare_pod_deadline
        and gpu
        and pod["spec"].get("activeDeadlineSeconds") is None
        and not any(o.get("controller") for o in owners)
    )


def check(pod: dict, policy: Policy, namespace: str, *, kubectl: bool) -> list[dict]:
    """Every property for one Pod; returns the patch. ``kubectl``: apply it with kubectl too
    (and check that the generated Pod itself is valid)."""
    if kubectl and required_terms(pod) != []:  # nodeSelectorTerms: [] is the invalid one
        validate_pod(pod)
    untouched = copy.deepcopy(pod)
    decision = decide(pod, policy, namespace=namespace)
    assert pod == untouched, "planning the patch changed the Pod under review"
    ops = decode_patch(decision)
    if _fractional(pod, policy):
        assert not decision.allowed
        assert {f.rule for f in decision.findings} == {"gpu-quantity"}
        assert ops == [] and not decision.patch
        return ops
    assert decision.allowed, decision.response["response"].get("status")
    annotations = pod["metadata"].get("annotations") or {}
    if MIRROR in annotations:
        assert ops == []
        return ops

    selection = pool_selection(pod, policy, namespace)
    voiding = policy.inject_void and can_reach_gpu_nodes(pod, policy, namespace)
    gpu = _gpu_containers(pod, policy)
    deadline = _deadline_expected(pod, policy, gpu)
    shared_memory = policy.gpu_defaults.shared_memory and _gpus(pod, policy) > 1
    if not (selection.pools or selection.taints or voiding or deadline or shared_memory):
        assert ops == [], "nothing to do, or nowhere to go: no patch"
        return ops

    # The patch: add-only, the same with jsonpatch and with Go's JSON-Patch.
    assert_add_only(ops)
    patched = apply_jsonpatch(pod, ops) if ops else copy.deepcopy(pod)
    if kubectl and ops:
        assert apply_kubectl(pod, ops) == patched, "jsonpatch and kubectl disagree"

    # A valid Pod, no new problem, nothing the user wrote lost or changed.
    if required_terms(patched) != []:
        validate_pod(patched)
    new = set(semantic_problems(patched)) - set(semantic_problems(pod))
    assert not new, new
    lost = _extends(pod, patched)
    assert not lost, lost

    # What the pool needs is there.
    for taint in selection.taints:
        assert tolerated(patched, taint), f"taint {dict(taint)} is not tolerated"
    if len(selection.pools) == 1:
        pool = selection.pools[0]
        labels = dict(pool.node_selector)
        selector = patched["spec"].get("nodeSelector") or {}
        if pool.require_node_affinity and not all(selector.get(k) == v for k, v in labels.items()):
            terms_after = required_terms(patched)
            assert terms_after, "no empty (or missing) nodeSelectorTerms"
            assert all(term_requires(t, labels) for t in terms_after), terms_after
        for preference in pool.preferred_affinity:
            expressions = [
                dict(e, values=list(e["values"])) for e in preference["matchExpressions"]
            ]
            wanted = {
                "weight": preference["weight"],
                "preference": {"matchExpressions": expressions},
            }
            assert wanted in preferred_terms(patched)
    # Confined: no pool closed to the namespace, still some chosen pool if there was one.
    for pool in selection.closed:
        assert not admits_node(patched, pool.node_selector), f"pool {pool.name} is reachable"
    if any(admits_node(pod, p.node_selector) for p in selection.pools):
        assert any(admits_node(patched, p.node_selector) for p in selection.pools)
    # The GPU defaults of a Pod: a deadline for a bare GPU Pod that sets none, nothing else
    # changed; shared memory at /dev/shm in every container of a Pod of several whole GPUs.
    if deadline:
        assert patched["spec"]["activeDeadlineSeconds"] == policy.gpu_defaults.bare_pod_deadline
    else:
        assert patched["spec"].get("activeDeadlineSeconds") == pod["spec"].get(
            "activeDeadlineSeconds"
        )
    assert "runtimeClassName" not in patched["spec"]
    assert "priorityClassName" not in patched["spec"]
    volumes = {v["name"]: v for v in patched["spec"].get("volumes") or []}
    for list_name in ("initContainers", "containers"):
        for index, container in enumerate(patched["spec"].get(list_name) or []):
            before = pod["spec"][list_name][index].get("volumeMounts")
            mounts = container.get("volumeMounts") or []
            had_shm = any(m.get("mountPath") == SHM for m in before or [])
            if shared_memory and not had_shm:
                [mount] = [m for m in mounts if m["mountPath"] == SHM]
                assert volumes[mount["name"]]["emptyDir"]["medium"] == "Memory"
            else:
                assert container.get("volumeMounts") == before, f"{list_name}[{index}]"
    if voiding:
        for list_name in ("initContainers", "containers"):
            for index, container in enumerate(patched["spec"].get(list_name) or []):
                names = [v["name"] for v in container.get("env") or []]
                if (list_name, index) in gpu:
                    assert container.get("env") == pod["spec"][list_name][index].get("env")
                else:
                    assert VISIBLE in names, f"{list_name}[{index}] is not voided"

    # The record of what was injected comes with every patch, and only then.
    if ops:
        assert ops[-1]["path"] in (
            "/metadata/annotations",
            "/metadata/annotations/gpu-admission.io~1injected",
        )
        assert patched["metadata"]["annotations"][INJECTED_ANNOTATION]

    # Idempotence.
    again = decide(patched, policy, namespace=namespace)
    assert again.allowed
    assert decode_patch(again) == [], "mutating the mutated Pod must plan nothing"
    return ops


FAST = settings(
    derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("name", list(POLICIES))
@settings(FAST, max_examples=60)
@given(pod=pods(), namespace=NAMESPACES)
def test_mutate_path_properties_with_kubectl(name, pod, namespace):
    check(pod, POLICIES[name], namespace, kubectl=True)


@pytest.mark.parametrize("name", list(POLICIES))
@settings(FAST, max_examples=120)
@given(pod=pods(), namespace=NAMESPACES)
def test_mutate_path_properties_more_examples(name, pod, namespace):
    check(pod, POLICIES[name], namespace, kubectl=False)


def test_the_generator_reaches_every_interesting_case():
    """The properties above are only as good as the Pods they see."""
    seen: dict[str, int] = {}

    @settings(FAST, max_examples=200)
    @given(pod=pods(), namespace=NAMESPACES)
    def tally(pod, namespace):
        terms = required_terms(pod) or []
        for name, policy in POLICIES.items():
            decision = decide(pod, policy, namespace=namespace)
            ops = decode_patch(decision)
            selection = pool_selection(pod, policy, namespace)
            facts = {
                "denied": not decision.allowed,
                "patched": bool(ops),
                "unpatched-gpu-pod": decision.allowed and not ops and bool(selection.requested),
                "single-pool": len(selection.pools) == 1,
                "several-pools": len(selection.pools) > 1,
                "pool-violation": bool(selection.problems),
                "term-appended": any("/matchExpressions/-" in o["path"] for o in ops),
                "term-without-expressions": bool(ops)
                and any(not t.get("matchExpressions") for t in terms),
                "toleration-appended": any(o["path"] == "/spec/tolerations/-" for o in ops),
                "void-appended": any(o["path"].endswith("/env/-") for o in ops),
                "void-created": any(o["path"].endswith("/env") for o in ops),
                "deadline": any(o["path"] == "/spec/activeDeadlineSeconds" for o in ops),
                "shm-volume": any(o["path"].startswith("/spec/volumes") for o in ops),
                "shm-shared": bool(ops)
                and not any(o["path"].startswith("/spec/volumes") for o in ops)
                and any(o["path"].endswith("/volumeMounts") for o in ops),
                "shm-renamed": any(
                    o["path"] == "/spec/volumes/-"
                    and o["value"]["name"].startswith("gpu-admission-shm-")
                    for o in ops
                ),
            }
            for fact, true in facts.items():
                seen[f"{name}:{fact}"] = seen.get(f"{name}:{fact}", 0) + bool(true)

    tally()
    expected = [
        f"{n}:{f}"
        for n in ("default", "pools")
        for f in ("denied", "patched", "unpatched-gpu-pod", "toleration-appended")
    ]
    expected += [
        "pools:single-pool",
        "pools:several-pools",
        "pools:pool-violation",
        "pools:term-appended",
        "pools:term-without-expressions",
        "pools-void:void-appended",
        "pools-void:void-created",
        "pools-defaults:deadline",
        "pools-defaults:shm-volume",
        "pools-defaults:shm-shared",
        "pools-defaults:shm-renamed",
    ]
    assert not [f for f in expected if seen.get(f, 0) < 3], seen


# --- No redundant operations -------------------------------------------------------------


@settings(FAST, max_examples=150, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(pod=pods(), namespace=NAMESPACES)
def test_no_operation_is_redundant(pod, namespace):
    ops = check(pod, POOLS, namespace, kubectl=False)
    doc = copy.deepcopy(pod)
    for op in ops:
        after = apply_jsonpatch(doc, [op])
        assert after != doc, f"redundant: {op}"
        doc = after
