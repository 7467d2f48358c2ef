"""topology: a Pod must fit on one node."""

from __future__ import annotations

import pytest

from tests.support.admission import (
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


def limit(index: int, name: str = GPU, where: str = "containers") -> str:
    return f"spec.{where}[{index}].resources.limits[{name}]"


def sidecar(name: str, gpu: int) -> dict:
    return container(name, gpu=gpu, restartPolicy="Always")


# --- The policy's per-Pod maximum (default policy: maxPerPod 8 for nvidia.com/gpu) ----------


def test_nine_gpus_in_one_container_are_denied():
    decision = validate(pod(container(gpu=9)))
    assert denied(decision) == [("topology", limit(0))]
    assert status_message(decision) == (
        f"{limit(0)}: Invalid value: 9: the Pod requests 9 {GPU} in all, above the policy's "
        "maximum of 8 per Pod; use several Pods, or a training controller (PyTorchJob, MPIJob, "
        "JobSet) that spreads the work over nodes"
    )


@pytest.mark.parametrize("value", [8, "8", "8000m"])
def test_eight_gpus_are_allowed(value):
    assert_allowed_clean(validate(pod(container(gpu=value))))


def test_app_containers_are_summed():
    decision = validate(pod(container("a", gpu=4), container("b", gpu=4), container("c", gpu=1)))
    # Reported once for the Pod, at the first container that asks for the resource.
    assert denied(decision) == [("topology", limit(0))]
    assert "the Pod requests 9 nvidia.com/gpu in all" in status_message(decision)


def test_init_containers_count_by_their_maximum_not_their_sum():
    obj = pod(container("train", gpu=8), init=[container("a", gpu=8), container("b", gpu=8)])
    assert_allowed_clean(validate(obj))


def test_an_init_container_above_the_maximum_is_denied():
    decision = validate(pod(container("train", gpu=1), init=[container("warm", gpu=9)]))
    assert denied(decision) == [("topology", limit(0, where="initContainers"))]


def test_sidecar_init_container_runs_beside_the_app():
    decision = validate(pod(container("train", gpu=8), init=[sidecar("proxy", 1)]))
    assert denied(decision) == [("topology", limit(0, where="initContainers"))]
    assert "the Pod requests 9 nvidia.com/gpu in all" in status_message(decision)


def test_sidecar_started_before_an_init_container_runs_beside_it():
    obj = pod(container("train", gpu=0), init=[sidecar("proxy", 1), container("warm", gpu=8)])
    decision = validate(obj)
    assert denied(decision) == [("topology", limit(0, where="initContainers"))]
    assert "requests 9" in status_message(decision)


def test_sidecar_started_after_an_init_container_does_not_run_beside_it():
    obj = pod(container("train", gpu=0), init=[container("warm", gpu=8), sidecar("proxy", 1)])
    assert_allowed_clean(validate(obj))


def test_ephemeral_containers_are_not_reserved_by_the_scheduler():
    obj = pod(container("train", gpu=8), ephemeral=[container("debug", gpu=8)])
    assert "topology" not in {f.rule for f in validate(obj).findings}


def test_undeclared_resources_have_no_bound():
    assert "topology" not in {
        f.rule for f in validate(pod(container(gpu=64, resource=MIG))).findings
    }


# --- Node capacity of the pool -----------------------------------------------------------


@pytest.mark.parametrize("value", [1, 4])
def test_within_the_pools_node_is_allowed(value):
    assert_allowed_clean(validate(pod(container(gpu=value)), pools_policy()))


def test_more_than_one_node_of_the_pool_offers_is_denied():
    decision = validate(pod(container(gpu=5)), pools_policy())
    assert denied(decision) == [("topology", limit(0))]
    assert status_message(decision) == (
        f"{limit(0)}: Invalid value: 5: the Pod requests 5 {GPU} in all, but the largest node "
        'of pool "a100" offers 4: a Pod must fit on one node; use several Pods or a training '
        "controller"
    )


def test_pinned_pod_is_bounded_by_its_pool():
    obj = pod(container("a", gpu=3), container("b", gpu=2), node_selector={POOL_LABEL: "a100"})
    decision = validate(obj, pools_policy())
    assert denied(decision) == [("topology", limit(0))]
    assert "must fit on one node" in status_message(decision)


def test_mig_per_node_is_catalogue_count_times_gpus_per_node():
    # 1g.10gb: at most 7 per GPU (A100-80GB, H100-80GB), 4 GPUs a node: 28.
    assert_allowed_clean(validate(pod(container(gpu=28, resource=MIG)), pools_policy()))
    decision = validate(pod(container(gpu=29, resource=MIG)), pools_policy())
    assert denied(decision) == [("topology", limit(0, MIG))]
    assert 'the largest node of pool "a100" offers 28' in status_message(decision)


def test_mig_per_node_follows_the_declared_products():
    a100_40 = policy(
        f"""
migCatalogue: {{products: [A100-40GB]}}
pools:
  - name: a100
    nodeSelector: {{{POOL_LABEL}: a100}}
    gpusPerNode: 2
    resources: [{{name: nvidia.com/mig-1g.10gb, sharing: MIG}}]
"""
    )
    # 1g.10gb: at most 4 per A100-40GB, 2 GPUs a node: 8.
    assert_allowed_clean(validate(pod(container(gpu=8, resource=MIG)), a100_40))
    assert denied(validate(pod(container(gpu=9, resource=MIG)), a100_40)) == [
        ("topology", limit(0, MIG))
    ]


def test_per_node_declared_on_the_resource():
    per_node = policy("resources: [{name: nvidia.com/gpu, sharing: Exclusive, perNode: 2}]")
    assert_allowed_clean(validate(pod(container(gpu=2)), per_node))
    decision = validate(pod(container(gpu=3)), per_node)
    assert denied(decision) == [("topology", limit(0))]
    assert "but the largest node offers 2: a Pod must fit on one node" in status_message(decision)


def test_largest_node_among_the_candidate_pools():
    two = policy(
        f"""
pools:
  - name: small
    nodeSelector: {{{POOL_LABEL}: small}}
    gpusPerNode: 2
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
  - name: large
    nodeSelector: {{{POOL_LABEL}: large}}
    gpusPerNode: 8
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
"""
    )
    assert_allowed_clean(validate(pod(container(gpu=8)), two))
    pinned = pod(container(gpu=8), node_selector={POOL_LABEL: "small"})
    decision = validate(pinned, two)
    assert denied(decision) == [("topology", limit(0))]
    assert 'the largest node of pool "small" offers 2' in status_message(decision)


def test_cluster_wide_maximum_applies_to_pooled_resources():
    inherits = policy(
        f"""
resources: [{{name: nvidia.com/gpu, sharing: Exclusive, maxPerPod: 2}}]
pools:
  - name: big
    nodeSelector: {{{POOL_LABEL}: big}}
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
"""
    )
    decision = validate(pod(container(gpu=3)), inherits)
    assert denied(decision) == [("topology", limit(0))]


# --- Every container list, every kind -----------------------------------------------------


@pytest.mark.parametrize("where", ["containers", "initContainers"])
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_every_kind_and_container_list(kind, where):
    good = validate(kind.wrap(place(container("x", gpu=8), where)))
    assert "topology" not in {f.rule for f in good.findings}

    decision = validate(kind.wrap(place(container("x", gpu=9), where)))
    assert denied(decision) == [("topology", f"{kind.prefix}{limit(0, where=where)}")]
    assert "above the policy's maximum of 8 per Pod" in status_message(decision)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_summed_across_containers_in_every_kind(kind):
    obj = kind.wrap(template(container("a", gpu=4), container("b", gpu=4), container("c", gpu=1)))
    assert denied(validate(obj)) == [("topology", f"{kind.prefix}{limit(0)}")]
