"""What moved into the ``tenants`` block: the pools reserved for a tenant (``reservedPools``,
was ``pools[].namespaces``), binder namespaces (``binder``, was ``binderNamespaces``),
exemptions (was ``spec.exemptions``) and rule modes (``rules``, was ``namespaceOverrides``).
Each decides as the field it replaces, and the old fields keep working beside them."""

from __future__ import annotations

import jsonpatch
import pytest

from tests.support.admission import (
    BASE_SPEC,
    POOL_LABEL,
    assert_allowed_clean,
    container,
    denied_rules,
    mutate,
    pod,
    policy,
    rules_in,
    status_message,
    validate,
    with_spec,
)
from webhook.policy.load import PolicyError

POOLS = f"""
resources:
  - {{name: nvidia.com/gpu, sharing: Exclusive, maxPerPod: 16}}
pools:
  - name: open
    nodeSelector: {{{POOL_LABEL}: open}}
    taints: [{{key: {POOL_LABEL}, value: open, effect: NoSchedule}}]
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
  - name: reserved
    nodeSelector: {{{POOL_LABEL}: reserved}}
    taints: [{{key: {POOL_LABEL}, value: reserved, effect: NoSchedule}}]
    resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
"""


def in_pool(name: str) -> dict:
    obj = pod(container(gpu=1))
    obj["metadata"]["annotations"] = {"gpu-admission.io/pool": name}
    return obj


def required_values(obj: dict, namespace: str, chosen) -> list:
    patched = jsonpatch.apply_patch(obj, list(mutate(obj, chosen, namespace=namespace).patch))
    affinity = patched["spec"]["affinity"]["nodeAffinity"]
    [term] = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [expression] = term["matchExpressions"]
    return expression["values"]


# --- reservedPools ------------------------------------------------------------------------


RESERVED = policy(
    POOLS
    + """
tenants:
  - namespaces: [team-a]
    reservedPools: [reserved]
  - namespaces: ["team-b-*"]
    reservedPools: [reserved]
""",
    name="reserved",
)


@pytest.mark.parametrize("namespace", ["team-a", "team-b-1"])
def test_a_reserved_pool_is_open_to_every_entry_that_names_it(namespace: str) -> None:
    assert_allowed_clean(validate(in_pool("reserved"), RESERVED, namespace=namespace))
    assert required_values(pod(container(gpu=1)), namespace, RESERVED) == ["open", "reserved"]


def test_a_reserved_pool_is_closed_to_every_other_namespace() -> None:
    decision = validate(in_pool("reserved"), RESERVED, namespace="ml")
    assert denied_rules(decision) == {"pool-access"}
    assert 'namespace "ml" may not use pool "reserved"' in status_message(decision)
    assert required_values(pod(container(gpu=1)), "ml", RESERVED) == ["open"]


def test_a_pool_no_entry_names_stays_open_to_every_namespace() -> None:
    for namespace in ("ml", "team-a"):
        assert_allowed_clean(validate(in_pool("open"), RESERVED, namespace=namespace))


def test_the_old_pool_namespaces_and_reserved_pools_add_up() -> None:
    both = policy(
        POOLS
        + "    namespaces: [legacy]\n"  # the reserved pool's, written the old way
        + "tenants: [{namespaces: [team-a], reservedPools: [reserved]}]\n",
        name="both",
    )
    [reserved] = [p for p in both.pools if p.name == "reserved"]
    assert reserved.namespaces is not None and reserved.namespaces.patterns == ("legacy", "team-a")
    for namespace in ("legacy", "team-a"):
        assert_allowed_clean(validate(in_pool("reserved"), both, namespace=namespace))
    assert denied_rules(validate(in_pool("reserved"), both, namespace="ml")) == {"pool-access"}


def test_a_closed_pool_names_where_access_is_granted() -> None:
    obj = pod(container(gpu=1))
    only_reserved = policy(
        POOLS.replace("  - name: open", "  - name: open\n    namespaces: [nobody]")
        + "tenants: [{namespaces: [team-a], reservedPools: [reserved]}]\n",
        name="closed",
    )
    decision = validate(obj, only_reserved, namespace="ml")
    assert denied_rules(decision) == {"pool-access"}
    assert "(spec.tenants[].reservedPools)" in status_message(decision)


# --- binder -------------------------------------------------------------------------------


BINDER = policy(
    POOLS
    + """
tenants:
  - namespaces: [team-a]
    reservedPools: [reserved]
  - namespaces: [gang-scheduler]
    binder: true
""",
    name="binder",
)


def test_a_binder_namespace_may_name_a_node() -> None:
    obj = with_spec(pod(container(gpu=1)), nodeName="gpu-node-1")
    assert_allowed_clean(validate(obj, BINDER, namespace="gang-scheduler"))
    decision = validate(obj, BINDER, namespace="ml")
    assert denied_rules(decision) == {"pool-access"}
    assert "make the namespace a binder in the policy (spec.tenants[].binder)" in status_message(
        decision
    )


def test_binder_false_binds_nothing() -> None:
    not_binder = policy(POOLS + BINDER_FALSE, name="not-binder")
    obj = with_spec(pod(container(gpu=1)), nodeName="gpu-node-1")
    assert not_binder.binder_namespaces is None
    assert denied_rules(validate(obj, not_binder, namespace="gang-scheduler")) == {"pool-access"}


BINDER_FALSE = """
tenants:
  - namespaces: [team-a]
    reservedPools: [reserved]
  - namespaces: [gang-scheduler]
    binder: false
"""


def test_binder_namespaces_and_binder_entries_add_up() -> None:
    both = policy(
        POOLS
        + "binderNamespaces: [volcano-system]\n"
        + "tenants: [{namespaces: [team-a], reservedPools: [reserved]},"
        + " {namespaces: [gang-scheduler], binder: true}]\n",
        name="binders",
    )
    assert both.binder_namespaces is not None
    assert both.binder_namespaces.patterns == ("volcano-system", "gang-scheduler")


# --- exemptions ---------------------------------------------------------------------------

PRIVILEGED = pod(container(gpu=1, privileged=True))


def test_a_tenant_exemption_lifts_its_rules_in_its_namespaces_only() -> None:
    exempt = policy(
        BASE_SPEC
        + """
tenants:
  - namespaces: [gpu-operator]
    exemptions:
      - rules: [privileged]
        reason: The operator's validator runs privileged.
""",
        name="exempt",
    )
    assert_allowed_clean(validate(PRIVILEGED, exempt, namespace="gpu-operator"))
    assert denied_rules(validate(PRIVILEGED, exempt, namespace="ml")) == {"privileged"}


def test_a_tenant_exemption_narrowed_to_service_accounts() -> None:
    exempt = policy(
        BASE_SPEC
        + """
tenants:
  - namespaces: [gpu-operator]
    exemptions:
      - serviceAccounts: [validator]
        reason: The operator's validator runs privileged.
""",
        name="narrowed",
    )
    as_validator = with_spec(PRIVILEGED, serviceAccountName="validator")
    assert_allowed_clean(validate(as_validator, exempt, namespace="gpu-operator"))
    assert denied_rules(validate(PRIVILEGED, exempt, namespace="gpu-operator")) == {"privileged"}


def test_exemptions_never_select_by_label_in_a_tenant_either() -> None:
    with pytest.raises(PolicyError) as raised:
        policy(
            BASE_SPEC
            + "tenants: [{namespaces: [ml], exemptions: [{matchLabels: {a: b}, reason: x}]}]\n"
        )
    [error] = raised.value.errors
    assert "spec.tenants[0].exemptions[0].matchLabels: exemptions cannot select by object" in error


def test_a_tenant_exemption_states_why() -> None:
    with pytest.raises(PolicyError) as raised:
        policy(BASE_SPEC + "tenants: [{namespaces: [ml], exemptions: [{rules: [privileged]}]}]\n")
    assert "spec.tenants[0].exemptions[0]: 'reason' is a required property" in str(raised.value)


# --- rules --------------------------------------------------------------------------------


def test_tenant_rules_set_the_modes_of_its_namespaces() -> None:
    warned = policy(
        BASE_SPEC + 'tenants: [{namespaces: ["ml-*"], rules: {privileged: {gpuPods: Warn}}}]\n',
        name="warned",
    )
    decision = validate(PRIVILEGED, warned, namespace="ml-train")
    assert decision.allowed and rules_in(decision, "Warn") == {"privileged"}
    assert denied_rules(validate(PRIVILEGED, warned, namespace="web")) == {"privileged"}


@pytest.mark.parametrize(
    "spec, mode",
    [
        # The first matching entry that states rules decides; one stating none is passed over.
        (
            """
tenants:
  - namespaces: [ml-train]
    binder: true
  - namespaces: ["ml-*"]
    rules: {privileged: {gpuPods: Audit}}
  - namespaces: [ml-train]
    rules: {privileged: {gpuPods: Warn}}
""",
            "Audit",
        ),
        # The old overrides are consulted first.
        (
            """
namespaceOverrides: [{namespaces: [ml-train], rules: {privileged: {gpuPods: Warn}}}]
tenants: [{namespaces: ["ml-*"], rules: {privileged: {gpuPods: Audit}}}]
""",
            "Warn",
        ),
    ],
)
def test_the_first_matching_rules_win(spec: str, mode: str) -> None:
    decision = validate(PRIVILEGED, policy(BASE_SPEC + spec), namespace="ml-train")
    assert rules_in(decision, mode) == {"privileged"}


# --- what the block grants ----------------------------------------------------------------


def test_entries_that_state_no_grants_keep_the_default_grants() -> None:
    moved = policy(
        BASE_SPEC + "tenants: [{namespaces: [ml], exemptions: [{rules: [topology], reason: x}]}]\n"
    )
    assert moved.grants("ml").allows_capability("IPC_LOCK", "app")
    assert moved.grants("web").allows_capability("SYS_NICE", "app")


@pytest.mark.parametrize(
    "entry",
    [
        "{namespaces: [a], reservedPools: [open]}",
        "{namespaces: [a], binder: true}",
        "{namespaces: [a], exemptions: [{reason: node agent}]}",
        "{namespaces: [a], rules: {default: {gpuPods: Warn}}}",
    ],
)
def test_an_entry_may_state_any_one_setting(entry: str) -> None:
    policy(POOLS + f"tenants: [{entry}]\n")


def test_an_entry_stating_nothing_is_refused() -> None:
    with pytest.raises(PolicyError):
        policy(POOLS + "tenants: [{namespaces: [a], contact: ops@example.com}]\n")
