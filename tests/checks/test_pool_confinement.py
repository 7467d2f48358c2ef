"""Pools that hold: an admitted GPU Pod can land only where the policy lets its namespace,
whatever the mutating webhook did (it fails open, may only record, may not require affinity).

Scenarios per class of the pools issue: selection on every declared resource the Pod asks for;
selection independent of rule modes; a reserved pool unreachable when several pools offer the
resource; confinement checked on the final Pod; ambiguity; for Pods and for Deployment, Job and
CronJob templates, under Enforce, Warn, Audit and an exemption.
"""

from __future__ import annotations

import jsonpatch
import pytest

from tests.support.admission import (
    KINDS,
    POOL_LABEL,
    assert_allowed_clean,
    by_mode,
    container,
    denied_rules,
    mutate,
    pod,
    policy,
    template,
    validate,
    with_spec,
)

POOLS = f"""
resources:
  - {{name: nvidia.com/gpu, sharing: Exclusive, maxPerPod: 16}}
pools:
  - name: open
    nodeSelector: {{{POOL_LABEL}: open}}
    gpusPerNode: 8
    taints: [{{key: {POOL_LABEL}, value: open, effect: NoSchedule}}]
    resources:
      - {{name: nvidia.com/gpu, sharing: Exclusive}}
      - {{name: nvidia.com/mig-1g.10gb, sharing: MIG}}
  - name: reserved
    nodeSelector: {{{POOL_LABEL}: reserved}}
    gpusPerNode: 4
    taints: [{{key: {POOL_LABEL}, value: reserved, effect: NoSchedule}}]
    namespaces: [team-a]
    resources:
      - {{name: nvidia.com/gpu, sharing: Exclusive}}
      - {{name: nvidia.com/mig-3g.40gb, sharing: MIG}}
binderNamespaces: [gang-scheduler]
"""
CONFINED = policy(POOLS, name="confined")
WILDCARD = {"operator": "Exists"}
TEMPLATE_KINDS = [k for k in KINDS if k.name in ("Deployment", "Job", "CronJob")]


def mutated(obj: dict, chosen=CONFINED, namespace: str = "ml") -> dict:
    return jsonpatch.apply_patch(obj, list(mutate(obj, chosen, namespace=namespace).patch))


def required(obj: dict) -> list:
    node = obj["spec"].get("affinity", {}).get("nodeAffinity", {})
    return node.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
        "nodeSelectorTerms", []
    )


def modes(mode: str, exempt: bool = False) -> policy:
    rules = f"rules: {{pool-access: {{gpuPods: {mode}, otherPods: {mode}}}}}\n"
    exemption = "exemptions: [{namespaces: [ml], rules: [pool-access]}]\n" if exempt else ""
    return policy(POOLS + rules + exemption, name=f"confined-{mode}-{exempt}")


# --- Selection on everything declared that the Pod asks for -------------------------------


def test_a_profile_no_pool_offers_beside_one_a_pool_offers_is_denied():
    obj = pod(container(limits={"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1}))
    decision = validate(obj, CONFINED)
    assert "sharing-mode" in denied_rules(decision)
    assert not mutate(obj, CONFINED).patch  # not sent to "open", where it would pend


@pytest.mark.parametrize("pin", ["nodeSelector", "affinity", "annotation"])
def test_pinned_to_a_pool_without_the_resource_is_denied_however_pinned(pin):
    obj = pod(container(limits={"nvidia.com/mig-3g.40gb": 1}))
    if pin == "nodeSelector":
        obj["spec"]["nodeSelector"] = {POOL_LABEL: "open"}
    elif pin == "affinity":
        term = {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": ["open"]}]}
        obj["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    else:
        obj["metadata"]["annotations"] = {"gpu-admission.io/pool": "open"}
    decision = validate(obj, CONFINED, namespace="team-a")
    assert denied_rules(decision) == {"sharing-mode"}
    message = decision.response["response"]["status"]["message"]
    assert "nvidia.com/gpu" in message and "mig-3g.40gb" in message


def test_companion_resources_go_with_any_pool_and_choose_none():
    companions = policy(
        POOLS + "companionResources: [nvidia.com/gpumem, nvidia.com/gpucores]\n", name="hami"
    )
    obj = pod(container(gpu=1, limits={"nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 30}))
    assert_allowed_clean(validate(obj, companions))
    patched = mutated(obj, companions)
    assert patched["spec"]["tolerations"] == [
        {"key": POOL_LABEL, "operator": "Equal", "value": "open", "effect": "NoSchedule"}
    ]
    # Undeclared, they are unknown resources (a warning by default), and still choose no pool.
    decision = validate(obj, CONFINED)
    assert decision.allowed and {f.rule for f in decision.findings} == {"resource-name"}
    assert mutated(obj)["spec"]["tolerations"] == patched["spec"]["tolerations"]


# --- A reserved pool is unreachable -------------------------------------------------------


def test_a_pod_is_confined_to_the_pools_its_namespace_may_use():
    patched = mutated(pod(container(gpu=1)))
    assert required(patched) == [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": ["open"]}]}
    ]
    assert_allowed_clean(validate(patched, CONFINED))


def test_a_namespace_with_access_is_confined_to_every_pool_it_may_use():
    patched = mutated(pod(container(gpu=1)), namespace="team-a")
    assert required(patched) == [
        {
            "matchExpressions": [
                {"key": POOL_LABEL, "operator": "In", "values": ["open", "reserved"]}
            ]
        }
    ]
    assert len(patched["spec"]["tolerations"]) == 2
    assert_allowed_clean(validate(patched, CONFINED, namespace="team-a"))


# --- Only the validate path's word counts --------------------------------------------------


@pytest.mark.parametrize(
    "escape",
    [
        {"tolerations": [WILDCARD]},
        {"tolerations": [WILDCARD], "nodeSelector": {"kubernetes.io/hostname": "gpu-r-1"}},
        {"tolerations": [{"key": POOL_LABEL, "operator": "Exists"}]},
    ],
    ids=["wildcard", "hostname-and-wildcard", "pool-key-exists"],
)
def test_a_pod_that_can_still_land_in_a_reserved_pool_is_denied(escape):
    obj = with_spec(pod(container(gpu=1)), **escape)
    decision = validate(obj, CONFINED)
    assert denied_rules(decision) == {"pool-access"}
    message = decision.response["response"]["status"]["message"]
    assert 'pool "reserved"' in message and "NotIn" in message
    # The mutating webhook's patch closes it.
    assert "pool-access" not in denied_rules(validate(mutated(obj), CONFINED))


def test_a_gpu_pod_with_node_name_is_denied_outside_binder_namespaces():
    obj = with_spec(pod(container(gpu=1)), nodeName="gpu-r-1")
    assert denied_rules(validate(obj, CONFINED)) == {"pool-access"}
    assert_allowed_clean(validate(obj, CONFINED, namespace="gang-scheduler"))


def test_the_taint_of_a_reserved_pool_keeps_an_unmutated_pod_off_it():
    # The mutating webhook timed out: no toleration, no affinity. The Pod may pend, but it
    # cannot land in the reserved pool, so it is admitted.
    assert_allowed_clean(validate(pod(container(gpu=1)), CONFINED))


def test_record_mode_and_no_required_affinity_still_confine():
    record = policy(POOLS + "mutation: {mode: Record}\n", name="record")
    obj = with_spec(pod(container(gpu=1)), tolerations=[WILDCARD])
    assert not mutate(obj, record).patch or mutate(obj, record).patch_recorded
    assert denied_rules(validate(obj, record)) == {"pool-access"}

    loose = policy(
        POOLS.replace(
            "    gpusPerNode: 8\n", "    gpusPerNode: 8\n    requireNodeAffinity: false\n"
        ),
        name="loose",
    )
    patched = mutated(obj, loose)
    assert required(patched) == [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "NotIn", "values": ["reserved"]}]}
    ]
    assert_allowed_clean(validate(patched, loose))


def test_mirror_pods_are_audited_not_denied():
    obj = with_spec(pod(container(gpu=1)), nodeName="gpu-r-1")
    obj["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    decision = validate(obj, CONFINED)
    assert decision.allowed
    assert {f.mode for f in decision.findings} == {"Audit"}


# --- Selection is independent of modes ----------------------------------------------------

ONLY_RESERVED = {"nvidia.com/mig-3g.40gb": 1}
# pool-access in each mode, and exempt: (mode, exempt, whether the Pod is admitted)
EVERY_MODE = pytest.mark.parametrize(
    ("mode", "exempt", "verdict"),
    [
        ("Enforce", False, False),
        ("Warn", False, True),
        ("Audit", False, True),
        ("Enforce", True, True),
    ],
    ids=["enforce", "warn", "audit", "exempt"],
)


@EVERY_MODE
def test_a_refused_pool_is_reported_by_mode_and_still_confines(mode, exempt, verdict):
    chosen = modes(mode, exempt)
    obj = pod(container(limits=ONLY_RESERVED))
    assert validate(obj, chosen).allowed is verdict
    patched = mutated(obj, chosen)
    assert required(patched) == [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": ["reserved"]}]}
    ]
    assert patched["spec"]["tolerations"][0]["value"] == "reserved"


@pytest.mark.parametrize("mode", ["Warn", "Audit"])
def test_topology_is_checked_against_the_pool_of_a_pod_admitted_despite_pool_access(mode):
    # 6 GPUs: fine in "open" (8 per node), too many for one node of "reserved" (4).
    obj = pod(container(gpu=6), annotations={"gpu-admission.io/pool": "reserved"})
    decision = validate(obj, modes(mode))
    assert denied_rules(decision) == {"topology"}


@pytest.mark.parametrize("kind", TEMPLATE_KINDS, ids=[k.name for k in TEMPLATE_KINDS])
@EVERY_MODE
def test_templates_follow_the_pool_access_mode(kind, mode, exempt, verdict):
    obj = kind.wrap(template(container(limits=ONLY_RESERVED)))
    decision = validate(obj, modes(mode, exempt))
    assert decision.allowed is verdict
    if mode in ("Warn", "Audit") and not exempt:
        assert by_mode(decision, mode)


@pytest.mark.parametrize("kind", TEMPLATE_KINDS, ids=[k.name for k in TEMPLATE_KINDS])
def test_templates_are_not_denied_for_the_confinement_their_pods_get(kind):
    # The mutating webhook confines the Pods a workload creates; a template is not a Pod.
    assert_allowed_clean(validate(kind.wrap(template(container(gpu=1))), CONFINED))
    pinned = kind.wrap(
        template(container(limits={"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1}))
    )
    assert "sharing-mode" in denied_rules(validate(pinned, CONFINED))


@pytest.mark.parametrize(
    "pin",
    [{"nodeSelector": {POOL_LABEL: "open"}}, {"nodeSelector": {POOL_LABEL: "reserved"}}],
    ids=["open", "reserved"],
)
def test_a_profile_offered_outside_the_pools_pinned_to_a_pool_is_denied(pin):
    # nvidia.com/mig-2g.20gb is catalogued, offered by no pool: only GPU nodes outside the
    # pools could have it, and the Pod's nodeSelector keeps it off those.
    obj = with_spec(pod(container(limits={"nvidia.com/mig-2g.20gb": 1})), **pin)
    decision = validate(obj, CONFINED)
    assert denied_rules(decision) == {"sharing-mode"}
    assert (
        "GPU nodes outside the declared pools" in decision.response["response"]["status"]["message"]
    )
    unpinned = pod(container(limits={"nvidia.com/mig-2g.20gb": 1}))
    assert "sharing-mode" not in denied_rules(validate(unpinned, CONFINED))
