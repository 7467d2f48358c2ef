"""Compiling a checked policy (``webhook.policy.compile``): what the request path reads is
worked out once, here, from the document. Rule modes and their steps are tested in
``test_policy.py``; this module tests the rest of what compilation derives."""

from __future__ import annotations

import textwrap

import webhook
from webhook.policy.tenants import DEFAULT_GRANTED_CAPABILITIES


def compiled(*parts: str) -> webhook.Policy:
    spec = "\n".join(textwrap.dedent(part).strip("\n") for part in parts)
    body = textwrap.indent(spec, "  ")
    text = (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        f"metadata: {{name: t}}\nspec:\n{body}\n"
    )
    return webhook.parse_policy(text, source="t.yaml")


TAINTED = "gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]\n"


def test_without_tenants_everyone_gets_the_three_capabilities_rdma_needs():
    policy = compiled(TAINTED)
    grants = policy.grants("any-namespace")
    assert set(grants.capabilities) == set(DEFAULT_GRANTED_CAPABILITIES)
    assert all(grants.allows_capability(c, "x") for c in DEFAULT_GRANTED_CAPABILITIES)
    assert not grants.host_network and not grants.host_ipc and not grants.host_paths


def test_a_tenants_block_grants_exactly_what_it_says_and_matching_entries_add_up():
    policy = compiled(
        TAINTED,
        """
        tenants:
          - namespaces: ["team-*"]
            grants: {capabilities: [cap_ipc_lock, {name: NET_ADMIN, containers: [rxdm]}]}
          - namespaces: [team-a]
            grants:
              capabilities: [{name: NET_ADMIN, containers: [tcpx]}]
              hostNetwork: true
              hostPaths: [/raid/datasets/, /mnt]
        """,
    )
    a, b = policy.grants("team-a"), policy.grants("team-b")
    assert a.allows_capability("IPC_LOCK", "anything") and b.allows_capability("IPC_LOCK", "x")
    assert a.capabilities["NET_ADMIN"] == frozenset({"rxdm", "tcpx"})
    assert b.capabilities["NET_ADMIN"] == frozenset({"rxdm"})
    assert a.host_network and not b.host_network
    # Canonical, and /mnt (which holds /mnt/k8s-disks) dropped.
    assert a.host_paths == ("/raid/datasets",)
    assert policy.grants("other").capabilities == {}


def test_allowed_paths_are_canonical_and_never_allowed_ones_dropped():
    policy = compiled(
        TAINTED + "hostDevices: {allowedPaths: [/data/, /mnt, //scratch/./x, /var/lib/x]}"
    )
    assert policy.host_path_allow_list == ("/data", "/scratch/x")
    assert compiled(TAINTED).host_path_allow_list is None


def test_new_checks_warn_unless_the_policy_enforces_them():
    assert compiled(TAINTED).new_checks_advisory
    assert not compiled(TAINTED, "newChecks: Enforce").new_checks_advisory


def test_every_pod_reaches_gpu_nodes_unless_a_hard_taint_keeps_it_off():
    assert not compiled(TAINTED).every_pod_reaches_gpu_nodes
    assert compiled("{}").every_pod_reaches_gpu_nodes  # no taint declared
    soft = "gpuNodeTaints: [{key: nvidia.com/gpu, effect: PreferNoSchedule}]"
    assert compiled(soft).every_pod_reaches_gpu_nodes  # only discourages
    assert compiled(TAINTED, "gpuNodesTainted: false").every_pod_reaches_gpu_nodes


POOLS = """
pools:
  - name: open
    nodeSelector: {pool: open}
    taints: [{key: pool, value: open, effect: NoSchedule}]
    resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
  - name: reserved
    nodeSelector: {pool: reserved}
    taints: [{key: dedicated, value: team-a, effect: NoExecute}]
    resources: [{name: nvidia.com/mig-1g.10gb, sharing: MIG}]
    namespaces: [team-a]
"""


def test_what_the_request_path_reads_of_pools_is_worked_out_once():
    policy = compiled(TAINTED, POOLS)
    assert policy.pooled_names == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"}
    assert policy.has_reserved_pools
    assert policy.gpu_label_keys == {"pool"}
    assert policy.gpu_taint_keys == {"nvidia.com/gpu", "pool", "dedicated"}
    assert [[t["key"] for t in c] for c in policy.gpu_node_classes] == [
        ["nvidia.com/gpu"],
        ["pool"],
        ["dedicated"],
    ]
    # Every catalogued MIG profile of the declared products is a declared name.
    assert "nvidia.com/mig-3g.40gb" in policy.declared_names


def test_exempted_names_and_globs_are_worked_out_once():
    policy = compiled(
        TAINTED,
        """
        exemptions:
          - namespaces: [kube-system, gpu-operator]
          - namespaces: ["infra-*"]
            rules: [privileged]
        """,
    )
    assert policy.exempted_names == {"kube-system", "gpu-operator"}
    assert policy.exempts_by_glob
    assert not compiled(TAINTED, "exemptions: [{namespaces: [a]}]").exempts_by_glob


def test_cluster_check_reads_every_catalogued_product_and_the_named_device_plugins():
    policy = compiled(
        TAINTED,
        """
        migCatalogue:
          products: [A100-80GB, NVIDIA-A800-SXM4-80GB]
          customProducts: [{name: NVIDIA-A800-SXM4-80GB, profiles: [1g.10gb, 7g.80gb]}]
        devicePluginDaemonSets:
          - {namespace: gpu-operator, name: nvidia-device-plugin-daemonset}
        """,
    )
    # Every product, not only those in force: a node's product is compared with all of them.
    assert policy.mig_catalogue["H100-94GB"] >= {"1g.12gb", "7g.94gb"}
    assert policy.mig_catalogue["NVIDIA-A800-SXM4-80GB"] == {"1g.10gb", "7g.80gb"}
    assert "2g.24gb" not in policy.mig_profiles  # decisions still read the products in force
    assert [str(d) for d in policy.device_plugin_daemonsets] == [
        "gpu-operator/nvidia-device-plugin-daemonset"
    ]
    assert compiled(TAINTED).device_plugin_daemonsets == ()
