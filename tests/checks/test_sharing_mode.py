"""sharing-mode: one sharing mode per Pod, on a pool that offers it."""

from __future__ import annotations

import pytest

from tests.support.admission import (
    CONTAINER_LISTS,
    KIND_IDS,
    KINDS,
    POOL_LABEL,
    assert_allowed_clean,
    container,
    denied,
    place,
    pod,
    policy,
    pools_policy,
    status_message,
    template,
    validate,
)

GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
SHARED = "nvidia.com/gpu.shared"
POOL_ANNOTATION = "gpu-admission.io/pool"


def limit(index: int, name: str, where: str = "containers") -> str:
    return f"spec.{where}[{index}].resources.limits[{name}]"


# --- Mixed modes --------------------------------------------------------------------------


def test_full_gpu_and_mig_in_one_container_are_denied():
    decision = validate(pod(container("train", limits={GPU: 1, MIG: 1})))
    assert denied(decision) == [("sharing-mode", limit(0, MIG))]
    assert status_message(decision) == (
        f'{limit(0, MIG)}: Invalid value: "{MIG}": mixes GPU sharing modes in one Pod: '
        f"{MIG} is MIG, while {GPU} (spec.containers[0]) is Exclusive; request one kind of "
        "GPU per Pod; split the work into several Pods"
    )


def test_full_gpu_and_mig_in_different_containers_are_denied():
    decision = validate(pod(container("a", gpu=1), container("b", gpu=1, resource=MIG)))
    assert denied(decision) == [("sharing-mode", limit(1, MIG))]
    assert f"while {GPU} (spec.containers[0]) is Exclusive" in status_message(decision)


def test_full_gpu_and_time_sliced_replica_are_denied():
    decision = validate(pod(container("a", gpu=1), container("b", gpu=1, resource=SHARED)))
    assert denied(decision) == [("sharing-mode", limit(1, SHARED))]
    assert f"{SHARED} is TimeSlicing" in status_message(decision)


def test_mig_and_time_sliced_mig_are_denied():
    decision = validate(pod(container("a", limits={MIG: 1, f"{MIG}.shared": 1})))
    assert denied(decision) == [("sharing-mode", limit(0, f"{MIG}.shared"))]
    assert "is MIGTimeSlicing" in status_message(decision)


def test_three_modes_give_two_violations():
    decision = validate(pod(container("a", limits={GPU: 1, MIG: 1, SHARED: 1})))
    assert denied(decision) == [
        ("sharing-mode", limit(0, MIG)),
        ("sharing-mode", limit(0, SHARED)),
    ]


def test_init_container_mode_counts_too():
    decision = validate(pod(container("app", gpu=1), init=[container("warm", gpu=1, resource=MIG)]))
    assert denied(decision) == [("sharing-mode", limit(0, GPU))]
    assert f"while {MIG} (spec.initContainers[0]) is MIG" in status_message(decision)


@pytest.mark.parametrize(
    "limits",
    [
        {MIG: 1, "nvidia.com/mig-3g.40gb": 1},
        {GPU: 2},
        {GPU: 1, "example.com/fpga": 1},
        {GPU: 1, MIG: 0},
    ],
    ids=["two-mig-profiles", "gpu-only", "gpu-and-other-domain", "zero-mig"],
)
def test_one_mode_is_allowed(limits):
    assert_allowed_clean(validate(pod(container("a", limits=limits))))


def test_a_mig_resource_with_a_different_name_in_another_container_is_the_same_mode():
    obj = pod(
        container("a", gpu=1, resource=MIG),
        container("b", gpu=1, resource="nvidia.com/mig-2g.20gb"),
    )
    assert_allowed_clean(validate(obj))


# --- failRequestsGreaterThanOne -----------------------------------------------------------


def test_two_time_sliced_replicas_are_denied():
    decision = validate(pod(container(gpu=2, resource=SHARED)))
    assert denied(decision) == [("sharing-mode", limit(0, SHARED))]
    assert status_message(decision).startswith(
        f"{limit(0, SHARED)}: Invalid value: 2: {SHARED} is a TimeSlicing replica of a shared GPU"
    )
    assert "failRequestsGreaterThanOne" in status_message(decision)


@pytest.mark.parametrize("value", [1, "1", "1000m"])
def test_one_time_sliced_replica_is_allowed(value):
    assert_allowed_clean(validate(pod(container(gpu=value, resource=SHARED))))


def test_replicas_in_two_containers_are_judged_per_container():
    # Each container asks for one replica: the device plugin's option is per container.
    obj = pod(container("a", gpu=1, resource=SHARED), container("b", gpu=1, resource=SHARED))
    assert_allowed_clean(validate(obj))


# --- Pools: pinned to a pool that lacks the resource ---------------------------------------


def test_node_selector_pinned_to_a_pool_without_the_resource_is_denied():
    obj = pod(container(gpu=1), node_selector={POOL_LABEL: "t4-shared"})
    decision = validate(obj, pools_policy(), namespace="team-a")
    assert denied(decision) == [("sharing-mode", "spec.nodeSelector")]
    message = status_message(decision)
    assert message.startswith(
        'spec.nodeSelector: Invalid value: {"accelerator.example.com/pool": "t4-shared"}: '
    )
    assert (
        'admits only pool "t4-shared" (it offers nvidia.com/gpu.shared), which does not offer '
        "all of nvidia.com/gpu" in message
    )
    assert "pend forever" in message
    assert "nvidia.com/gpu offered by: a100" in message


def test_node_affinity_pinned_to_a_pool_without_the_resource_is_denied():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": POOL_LABEL, "operator": "In", "values": ["t4-shared"]}
                        ]
                    }
                ]
            }
        }
    }
    decision = validate(pod(container(gpu=1), affinity=affinity), pools_policy())
    path = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    assert denied(decision) == [("sharing-mode", path)]
    assert "pend forever" in status_message(decision)


def test_pool_annotation_naming_a_pool_without_the_resource_is_denied():
    obj = pod(container(gpu=1), annotations={POOL_ANNOTATION: "t4-shared"})
    decision = validate(obj, pools_policy(), namespace="team-a")
    path = f"metadata.annotations[{POOL_ANNOTATION}]"
    assert denied(decision) == [("sharing-mode", path)]
    assert status_message(decision) == (
        f'{path}: Invalid value: "t4-shared": pool "t4-shared" does not offer nvidia.com/gpu '
        f"(it offers {SHARED}): the Pod would pend forever; request a resource the pool "
        "offers, or choose another pool; nvidia.com/gpu is offered by pool(s) a100"
    )


def test_pool_annotation_contradicting_the_node_selector_is_denied():
    obj = pod(
        container(gpu=1),
        annotations={POOL_ANNOTATION: "a100"},
        node_selector={POOL_LABEL: "t4-shared"},
    )
    decision = validate(obj, pools_policy())
    assert denied(decision) == [("sharing-mode", f"metadata.annotations[{POOL_ANNOTATION}]")]
    assert 'excludes the nodes of pool "a100"' in status_message(decision)


@pytest.mark.parametrize(
    "pin",
    [
        {"node_selector": {POOL_LABEL: "a100"}},
        {"annotations": {POOL_ANNOTATION: "a100"}},
        {},
    ],
    ids=["nodeSelector", "annotation", "unpinned"],
)
def test_reachable_pool_is_allowed(pin):
    assert_allowed_clean(validate(pod(container(gpu=1), **pin), pools_policy()))


def test_no_pool_offers_all_resources_together():
    # Full cards in one pool, replicas in another: no node offers both (and the modes differ).
    decision = validate(
        pod(container("a", gpu=1), container("b", gpu=1, resource=SHARED)),
        pools_policy(),
        namespace="team-a",
    )
    assert ("sharing-mode", limit(1, SHARED)) in denied(decision)
    assert "no pool offers all of nvidia.com/gpu, nvidia.com/gpu.shared together" in (
        status_message(decision)
    )


def test_mixing_is_denied_even_where_one_pool_offers_both():
    decision = validate(
        pod(container("a", gpu=1), container("b", gpu=1, resource=MIG)), pools_policy()
    )
    assert denied(decision) == [("sharing-mode", limit(1, MIG))]


def test_replica_limit_of_a_pool_resource():
    decision = validate(pod(container(gpu=2, resource=SHARED)), pools_policy(), namespace="team-a")
    assert denied(decision) == [("sharing-mode", limit(0, SHARED))]


def test_replica_limit_of_the_cluster_wide_declaration_applies_in_pools():
    inherits = policy(
        f"""
resources:
  - {{name: {SHARED}, sharing: TimeSlicing, failRequestsGreaterThanOne: true}}
pools:
  - name: ts
    nodeSelector: {{{POOL_LABEL}: ts}}
    resources: [{{name: {SHARED}, sharing: TimeSlicing}}]
"""
    )
    decision = validate(pod(container(gpu=2, resource=SHARED)), inherits)
    assert denied(decision) == [("sharing-mode", limit(0, SHARED))]


# --- Every container list, every kind -----------------------------------------------------


@pytest.mark.parametrize("where", CONTAINER_LISTS)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_every_kind_and_container_list(kind, where):
    good = validate(kind.wrap(place(container("x", limits={MIG: 1}), where)))
    assert "sharing-mode" not in {f.rule for f in good.findings}

    bad = kind.wrap(place(container("x", limits={GPU: 1, MIG: 1}), where))
    decision = validate(bad)
    path = f"{kind.prefix}spec.{where}[0].resources.limits[{MIG}]"
    assert denied(decision) == [("sharing-mode", path)]
    assert f"while {GPU} ({kind.prefix}spec.{where}[0]) is Exclusive" in status_message(decision)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_pinned_to_the_wrong_pool_in_every_kind(kind):
    obj = kind.wrap(template(container(gpu=1), annotations={POOL_ANNOTATION: "t4-shared"}))
    decision = validate(obj, pools_policy(), namespace="team-a")
    assert denied(decision) == [
        ("sharing-mode", f"{kind.prefix}metadata.annotations[{POOL_ANNOTATION}]")
    ]
