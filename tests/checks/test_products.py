"""Product entitlements (issue 34): a tenant entitled to some GPU products
(``tenants[].entitlements.products``) is confined to them as a reserved pool confines: the
mutating webhook adds ``nvidia.com/gpu.product In [their label values]`` to every required
nodeSelectorTerm of its GPU Pods, and the entitlement rule requires that confinement of the
final Pod (a Pod that names another product is refused, never patched into pending forever).
Warned while newChecks is Warn; templates are not judged for the confinement their Pods get."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

import webhook
from tests.patching import apply_both, assert_add_only, validate_pod
from tests.support.admission import (
    KINDS,
    admission,
    assert_allowed_clean,
    container,
    denied,
    mutate,
    pod,
    policy,
    status_message,
    template,
    validate,
    warnings,
    with_spec,
)
from webhook.core.inventory import NodeFields, NodeSnapshot, node_info
from webhook.policy.mig import product_label_values

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"
PRODUCT = "nvidia.com/gpu.product"

SPEC = """
newChecks: {new_checks}
gpuNodeTaints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
resources:
  - {{name: nvidia.com/gpu, sharing: Exclusive}}
  - {{name: nvidia.com/mig-1g.10gb, sharing: MIG}}
tenants:
  - namespaces: [vision]
    contact: "#gpu-platform"
    entitlements:
      products: [NVIDIA-H100-80GB-HBM3, NVIDIA-L4]
  - namespaces: ["*"]
    grants: {{capabilities: [IPC_LOCK]}}
"""


@cache
def entitled(new_checks: str = "Enforce") -> webhook.Policy:
    return policy(SPEC.format(new_checks=new_checks), name=f"products-{new_checks}")


def terms(obj: dict) -> list[dict]:
    affinity = obj["spec"].get("affinity", {}).get("nodeAffinity", {})
    return affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
        "nodeSelectorTerms", []
    )


def required_term(*expressions: dict) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]
            }
        }
    }


def product_in(*values: str) -> dict:
    return {"key": PRODUCT, "operator": "In", "values": list(values)}


# --- The label values of a product ---------------------------------------------------------


def test_a_catalogued_product_brings_its_shared_and_mig_single_strategy_forms() -> None:
    catalogue = entitled().mig_catalogue
    values = product_label_values(H100, catalogue)
    assert {H100, f"{H100}-SHARED", f"{H100}-MIG-1g.10gb", f"{H100}-MIG-1g.10gb-SHARED"} <= set(
        values
    )
    assert f"{H100}-MIG-7g.80gb" in values
    assert all(v.startswith(H100) for v in values)
    assert not any(v.startswith(A100) for v in values)


def test_a_product_the_catalogue_cannot_partition_is_itself_and_shared() -> None:
    assert product_label_values("NVIDIA-L4", entitled().mig_catalogue) == (
        "NVIDIA-L4",
        "NVIDIA-L4-SHARED",
    )


# --- Validation of the final Pod -------------------------------------------------------------


def test_an_unconfined_gpu_pod_is_refused_saying_what_to_add() -> None:
    decision = validate(pod(container(gpu=1)), entitled(), namespace="vision")
    assert denied(decision) == [("pool-access", "spec.affinity.nodeAffinity")]
    message = status_message(decision)
    assert "the Pod can land on GPUs of any product" in message
    assert (
        "tenants[0].entitlements (vision) allows only NVIDIA-H100-80GB-HBM3, NVIDIA-L4" in message
    )
    assert f'"key": "{PRODUCT}", "operator": "In"' in message
    assert "the mutating webhook adds it" in message


def test_a_pod_that_selects_another_product_is_refused_naming_it_and_whom_to_ask() -> None:
    obj = with_spec(pod(container(gpu=1)), nodeSelector={PRODUCT: A100})
    decision = validate(obj, entitled(), namespace="vision")
    assert denied(decision) == [("pool-access", "spec.affinity.nodeAffinity")]
    message = status_message(decision)
    assert f'namespace "vision" may not use "{A100}"' in message
    assert "ask #gpu-platform to be entitled" in message


@pytest.mark.parametrize(
    "fields",
    [
        {"nodeSelector": {PRODUCT: H100}},
        {"nodeSelector": {PRODUCT: f"{H100}-MIG-1g.10gb"}},
        {"affinity": required_term(product_in(H100, "NVIDIA-L4-SHARED"))},
    ],
    ids=["nodeSelector", "single-strategy form", "In requirement"],
)
def test_a_pod_kept_to_its_products_is_admitted(fields: dict) -> None:
    obj = with_spec(pod(container(gpu=1)), **fields)
    assert_allowed_clean(validate(obj, entitled(), namespace="vision"))


@pytest.mark.parametrize(
    "affinity, named",
    [
        (required_term(product_in(H100, A100)), [A100]),
        (required_term({"key": PRODUCT, "operator": "NotIn", "values": [A100]}), []),
        (required_term({"key": PRODUCT, "operator": "Exists"}), []),
    ],
    ids=["In with another product", "NotIn", "Exists"],
)
def test_a_requirement_that_does_not_keep_it_to_its_products_is_refused(
    affinity: dict, named: list[str]
) -> None:
    obj = with_spec(pod(container(gpu=1)), affinity=affinity)
    decision = validate(obj, entitled(), namespace="vision")
    assert denied(decision) == [("pool-access", "spec.affinity.nodeAffinity")]
    message = status_message(decision)
    assert all(f'may not use "{name}"' in message for name in named)


def test_every_alternative_term_must_keep_it_to_its_products() -> None:
    affinity = required_term(product_in(H100))
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ].append({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]})
    obj = with_spec(pod(container(gpu=1)), affinity=affinity)
    assert denied(validate(obj, entitled(), namespace="vision")) == [
        ("pool-access", "spec.affinity.nodeAffinity")
    ]


def test_it_is_a_warning_while_new_checks_is_warn() -> None:
    decision = validate(pod(container(gpu=1)), entitled("Warn"), namespace="vision")
    assert decision.allowed
    assert any("can land on GPUs of any product" in w for w in warnings(decision))


def test_a_vendor_resource_the_policy_does_not_declare_is_confined_too() -> None:
    obj = pod(container(gpu=1, resource="nvidia.com/gpu.shared"))
    decision = validate(obj, entitled(), namespace="vision")
    assert ("pool-access", "spec.affinity.nodeAffinity") in denied(decision)
    assert any(
        PRODUCT in str(op["value"]) for op in mutate(obj, entitled(), namespace="vision").patch
    )


def test_pods_without_a_gpu_and_other_tenants_are_not_confined() -> None:
    assert_allowed_clean(validate(pod(container()), entitled(), namespace="vision"))
    assert_allowed_clean(validate(pod(container(gpu=1)), entitled(), namespace="training"))


def deployment(**fields: Any) -> dict:
    [kind] = [k for k in KINDS if k.name == "Deployment"]
    return kind.wrap(template(container(gpu=1), **fields))


def test_templates_are_not_refused_for_the_confinement_their_pods_get() -> None:
    obj = deployment()
    assert obj["kind"] == "Deployment"
    assert_allowed_clean(validate(obj, entitled(), namespace="vision"))


def test_a_template_that_names_another_product_is_refused_when_it_is_written() -> None:
    """Every Pod made from it would be refused (its ReplicaSet's events the only word): the
    template is told at kubectl apply."""
    obj = deployment(node_selector={PRODUCT: A100})
    decision = validate(obj, entitled(), namespace="vision")
    assert denied(decision) == [("pool-access", "spec.template.spec.affinity.nodeAffinity")]
    assert f'may not use "{A100}"' in status_message(decision)
    allowed = deployment(node_selector={PRODUCT: H100})
    assert_allowed_clean(validate(allowed, entitled(), namespace="vision"))


def test_a_named_node_is_judged_by_its_product_label_in_the_inventory() -> None:
    def node(name: str, product: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {PRODUCT: product}},
            "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": "8"}},
        }

    fields = NodeFields.of(entitled())
    nodes = NodeSnapshot(
        {n: node_info(node(n, p), fields) for n, p in (("h", H100), ("a", A100))}, fields
    )
    allowed = with_spec(pod(container(gpu=1)), nodeName="h")
    refused = with_spec(pod(container(gpu=1)), nodeName="a")
    request = {"namespace": "vision"}
    assert webhook.decide(
        admission(allowed, **request), entitled(), mutate=False, nodes=nodes
    ).allowed
    decision = webhook.decide(admission(refused, **request), entitled(), mutate=False, nodes=nodes)
    assert f'may not use "{A100}"' in status_message(decision)
    # Without the inventory a named node's product cannot be told: not confined.
    decision = validate(allowed, entitled(), namespace="vision")
    assert denied(decision) == [("pool-access", "spec.nodeName")]
    assert "remove nodeName and let the scheduler place the Pod" in status_message(decision)


# --- The mutation ------------------------------------------------------------------------------


def confined(obj: dict, new_checks: str = "Enforce") -> dict:
    decision = mutate(obj, entitled(new_checks), namespace="vision")
    assert_add_only(decision.patch)
    return apply_both(obj, decision.patch)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"affinity": required_term({"key": "zone", "operator": "In", "values": ["a"]})},
        {"nodeSelector": {"zone": "a"}},
    ],
    ids=["no affinity", "a term of its own", "another nodeSelector"],
)
def test_the_mutation_confines_a_gpu_pod_and_the_result_is_admitted(fields: dict) -> None:
    obj = with_spec(pod(container(gpu=1)), **fields)
    patched = confined(obj)
    validate_pod(patched)
    expected = product_in(*sorted(entitled().tenants[0].entitlements.product_values))
    assert all(expected in term["matchExpressions"] for term in terms(patched))
    assert (
        "product-affinity=tenants[0]"
        in patched["metadata"]["annotations"]["gpu-admission.io/injected"]
    )
    assert_allowed_clean(validate(patched, entitled(), namespace="vision"))
    assert mutate(patched, entitled(), namespace="vision").patch == ()


def product_confinement(obj: dict, namespace: str) -> list[dict]:
    """The operations of the mutation's patch that confine the Pod to products."""
    return [
        op
        for op in mutate(obj, entitled(), namespace=namespace).patch
        if PRODUCT in str(op["value"])
    ]


def test_the_mutation_leaves_a_pod_that_names_another_product_to_validation() -> None:
    obj = with_spec(pod(container(gpu=1)), nodeSelector={PRODUCT: A100})
    assert product_confinement(obj, "vision") == []


def test_the_mutation_leaves_other_tenants_and_cpu_pods_alone() -> None:
    assert product_confinement(pod(container(gpu=1)), "training") == []
    assert product_confinement(pod(container()), "vision") == []


def test_products_and_a_pool_confinement_go_into_the_same_new_term() -> None:
    text = SPEC.format(new_checks="Enforce") + (
        "pools:\n"
        "  - name: h100\n"
        "    nodeSelector: {pool: h100}\n"
        "    resources: [{name: nvidia.com/gpu, sharing: Exclusive}]\n"
    )
    both = policy(text, name="products-and-pool")
    obj = pod(container(gpu=1))
    decision = mutate(obj, both, namespace="vision")
    patched = apply_both(obj, decision.patch)
    [term] = terms(patched)
    keys = [e["key"] for e in term["matchExpressions"]]
    assert keys == ["pool", PRODUCT]
    assert_allowed_clean(validate(patched, both, namespace="vision"))


def test_a_product_written_in_one_of_its_forms_is_warned() -> None:
    text = SPEC.format(new_checks="Warn").replace(
        "products: [NVIDIA-H100-80GB-HBM3, NVIDIA-L4]",
        "products: [NVIDIA-H100-80GB-HBM3-MIG-1g.10gb, NVIDIA-L4-SHARED]",
    )
    found = [w.message for w in policy(text, name="forms").warnings if "is a form of" in w.message]
    assert found == [
        f"{H100}-MIG-1g.10gb is a form of {H100} (GPU feature discovery adds -MIG-<profile> and "
        f"-SHARED to the product label): name the product, {H100}, and every form of it is "
        "allowed",
        "NVIDIA-L4-SHARED is a form of NVIDIA-L4 (GPU feature discovery adds -MIG-<profile> and "
        "-SHARED to the product label): name the product, NVIDIA-L4, and every form of it is "
        "allowed",
    ]


@pytest.mark.parametrize(
    "spec",
    [
        SPEC.format(new_checks="Warn"),
        SPEC.format(new_checks="Enforce")
        + "rules: {pool-access: {gpuPods: Warn, otherPods: Warn}}\n",
        SPEC.format(new_checks="Enforce") + "exemptions: [{namespaces: [vision]}]\n",
    ],
    ids=["newChecks Warn", "pool-access Warn", "exempt"],
)
def test_the_mutation_confines_only_where_the_rule_would_deny(spec: str) -> None:
    """A check new in this release warns, and changes nothing, before it denies: a product
    misspelt in the policy must not leave the tenant's Pods pending during a Warn rollout."""
    chosen = policy(spec, name="not-confining")
    patch = mutate(pod(container(gpu=1)), chosen, namespace="vision").patch
    # The mutation still runs (the GPU taint's toleration), only without the products.
    assert any(op["path"] == "/spec/tolerations" for op in patch)
    assert not any(PRODUCT in str(op["value"]) for op in patch)


def test_an_exception_for_the_entitlement_rule_does_not_open_other_products() -> None:
    """Products are places, like pools: an exception written to let a large Pod through
    (rules: [entitlement]) does not let it onto another product."""
    text = SPEC.format(new_checks="Enforce") + (
        "exceptions:\n"
        "  - name: big-training\n"
        "    owner: ml-platform@example.com\n"
        "    expires: '2999-01-01'\n"
        "    namespace: vision\n"
        "    match: {names: [trainer]}\n"
        "    rules: [entitlement]\n"
    )
    excepted = policy(text, name="products-excepted")
    obj = with_spec(pod(container(gpu=1)), nodeSelector={PRODUCT: A100})
    obj["metadata"]["name"] = "trainer"
    decision = validate(obj, excepted, namespace="vision")
    assert denied(decision) == [("pool-access", "spec.affinity.nodeAffinity")]


@pytest.mark.parametrize("written", ["H100", "h100-80gb", "GeForce-RTX-4090"])
def test_a_product_no_feature_discovery_label_looks_like_is_warned(written: str) -> None:
    text = SPEC.format(new_checks="Warn").replace(
        "products: [NVIDIA-H100-80GB-HBM3, NVIDIA-L4]", f"products: [{written}]"
    )
    found = [w.message for w in policy(text, name=f"typo-{written}").warnings]
    assert any(
        m.startswith(f"{written} does not look like a product GPU feature discovery labels")
        for m in found
    ), found


@pytest.mark.parametrize("written", [H100, "A100-SXM4-40GB", "Tesla-T4", "NVIDIA-L4"])
def test_products_as_feature_discovery_labels_them_are_not_warned(written: str) -> None:
    text = SPEC.format(new_checks="Warn").replace(
        "products: [NVIDIA-H100-80GB-HBM3, NVIDIA-L4]", f"products: [{written}]"
    )
    assert not [w for w in policy(text, name=f"ok-{written}").warnings if written in w.message]


def test_a_preferred_pool_of_another_product_is_warned() -> None:
    """Sent to a pool that selects the A100s, and kept to the H100s and L4s: the Pod can
    never be scheduled; lint says so before any Pod pends."""
    text = SPEC.format(new_checks="Warn").replace(
        '    contact: "#gpu-platform"\n',
        '    contact: "#gpu-platform"\n    poolPreference: [h100, a100]\n',
    ) + (
        "pools:\n"
        "  - name: h100\n"
        f"    nodeSelector: {{{PRODUCT}: {H100}}}\n"
        "    resources: [{name: nvidia.com/gpu, sharing: Exclusive}]\n"
        "  - name: a100\n"
        f"    nodeSelector: {{{PRODUCT}: A100-SXM4-40GB}}\n"
        "    resources: [{name: nvidia.com/gpu, sharing: Exclusive}]\n"
    )
    found = [w.message for w in policy(text, name="other-product").warnings]
    assert [m for m in found if "which this entry prefers or reserves" in m] == [
        f"pool 'a100', which this entry prefers or reserves, selects {PRODUCT}=A100-SXM4-40GB, "
        "not one of these products: the Pods sent there are also kept to these products and "
        "can never be scheduled; add the pool's product, or send the tenant to another pool"
    ]
