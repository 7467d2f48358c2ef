"""The rules, each declared once: its id, title, severity, scope and what it restricts.

Everything else reads these declarations: the policy model (``RULE_IDS``, ``SECURITY_RULES``),
the check registry (one check module per declared rule, ``webhook.checks.registry``), the policy
schema's rule names and the README's rule table (both written by ``make sync-data`` and checked
for drift by ``tests/test_data_sync.py``), the severities of policy reports and the SARIF rule
descriptions. Rule ids are stable: they appear in policies, metrics, logs and tests, so they
never change once released. Adding a rule is a declaration here, a check module and its tests;
``make sync-data`` writes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["high", "medium", "low"]


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule. ``security``: it binds every Pod that can reach a GPU node, whatever it asks for
    (scoped by reachability, ``webhook.core.scope``); otherwise Pods that ask for a GPU or aim
    at GPU nodes (scoped by GPU-relevance). ``restricts``: what it refuses, for the docs (one
    Markdown table cell)."""

    id: str
    title: str
    severity: Severity
    security: bool
    restricts: str
    # It judges DRA claim specs too: the only rules run on a ResourceClaim or a
    # ResourceClaimTemplate, which hold no Pod.
    claims: bool = False


RULES: tuple[Rule, ...] = (
    Rule(
        id="gpu-quantity",
        title="GPU quantities are whole, non-negative numbers set in limits.",
        severity="medium",
        security=False,
        restricts=(
            "GPU quantities that are not whole (`0.5`, `500m`), negative, set in requests only, or"
            " with requests ≠ limits"
        ),
    ),
    Rule(
        id="resource-name",
        title="GPU resource names are exact.",
        severity="medium",
        security=False,
        restricts=(
            "near misses of known names (did you mean?), malformed MIG names, MIG profiles no "
            "declared product offers, retired names, undeclared names under the vendor domain "
            "(warning), more than 100 undeclared names in one Pod template"
        ),
    ),
    Rule(
        id="privileged",
        title="No privileged containers in Pods that can reach a GPU node.",
        severity="high",
        security=True,
        restricts="`securityContext.privileged: true`",
    ),
    Rule(
        id="host-devices",
        title=(
            "No host paths, devices or mounts from the node except the data directories the policy"
            " allows."
        ),
        severity="high",
        security=True,
        restricts=(
            "hostPath volumes, normalised (`/var/run` read as `/run`), in three classes: (a) "
            "*node-control paths*, always: `/`, `/dev`, `/proc`, `/sys`, `/etc`, `/boot`, `/root`,"
            " `/home`, `/run`, `/var/lib`, `/var/log`, `/var/spool`, the host's programs, and "
            "where distributions move them (`/var/home`, `/var/roothome`, `/sysroot`, `/ostree` on"
            " Fedora CoreOS, RHCOS and bootc; `/local` on Bottlerocket; `/system` on Talos; "
            "`/mnt/k8s-disks` on EKS; `/mnt/.ephemeral` on Bottlerocket and EKS Auto Mode; "
            "`/mnt/aks` on AKS; `/mnt/stateful_partition` on GKE; `/opt/containerd`, "
            "`/opt/rke2`...), anything below them or a parent of them, relative paths, paths the "
            "policy adds; (b) *other tenants' data* (`/opt/local-path-provisioner`, "
            "`/var/openebs`, `/mnt/disks`...) unless the allow-list names it; (c) *anything else* "
            "not on `allowedPaths` or the namespace's `hostPaths` grant (warned while the policy "
            "lists none and `newChecks` is Warn). Annotations that inject host devices or mounts "
            "(NRI's `devices.`/`mounts.noderesource.dev`, GKE's `devices.gke.io`) unless granted. "
            "`webhook/policy/hostpaths.py` lists every path with its source"
        ),
    ),
    Rule(
        id="device-visibility",
        title=(
            "No device-visibility tricks: a container sees only the GPUs the scheduler allocated "
            "to it."
        ),
        severity="high",
        security=True,
        restricts=(
            "`NVIDIA_VISIBLE_DEVICES` (but `void`/`none`), `NVIDIA_MIG_CONFIG_DEVICES`, "
            "`NVIDIA_MIG_MONITOR_DEVICES`, `NVIDIA_IMEX_CHANNELS` in any container, GPU or not; "
            "the toolkit's other variables in containers that request no GPU; `valueFrom` for "
            "them; mounts under `/var/run/nvidia-container-devices`; CDI annotations "
            "(`cdi.k8s.io/*`, `nvidia.cdi.k8s.io/*`, NRI's `cdi-devices.noderesource.dev` unless "
            "granted); `CUDA_VERSION` without `NVIDIA_REQUIRE_CUDA` or "
            "`NVIDIA_VISIBLE_DEVICES=void` in a container that requests no GPU (a legacy CUDA "
            "image gets every GPU); the node-shared variables (`NVIDIA_MOFED`, `NVIDIA_NVSWITCH`, "
            "`NVIDIA_GDRCOPY`, `NVIDIA_GDS`) in GPU containers unless granted (warned while "
            "`newChecks` is Warn); `envFrom` (warning); with `injectVoid`, a missing "
            "`NVIDIA_VISIBLE_DEVICES=void`"
        ),
    ),
    Rule(
        id="host-access",
        title="No privileged-equivalent access to the host from a Pod that can reach a GPU node.",
        severity="high",
        security=True,
        restricts=(
            "`hostPID`, Windows `hostProcess`, added capabilities `SYS_ADMIN`, `SYS_MODULE`, "
            "`SYS_RAWIO`, `DAC_READ_SEARCH`, `BPF`, `SYS_BOOT`, `ALL` (any case, with or without "
            "`CAP_`; no grant covers them); `hostIPC` and `SYS_PTRACE` unless granted (warnings "
            "while `newChecks` is Warn)"
        ),
    ),
    Rule(
        id="pod-security",
        title=(
            "Pod Security baseline, with the grants GPU workloads need, for Pods that reach GPU "
            "nodes."
        ),
        severity="high",
        security=True,
        restricts=(
            "Kubernetes' Pod Security baseline (v1.37) beyond the grants: `hostNetwork` (never "
            "with `NET_ADMIN`/`NET_RAW`), host ports, capabilities beyond baseline's thirteen, "
            "SELinux types, users and roles, seccomp and AppArmor `Unconfined`, `procMount` "
            "(unless `hostUsers: false`), unsafe sysctls, probe and lifecycle `host`; NRI "
            "annotations that move a host interface in, set sysctls or otherwise change the "
            "container on the node. New in this release: warned while `newChecks` is Warn"
        ),
    ),
    Rule(
        id="sharing-mode",
        title="One sharing mode per Pod, on a pool that offers it.",
        severity="medium",
        security=False,
        restricts=(
            "several sharing modes in one Pod, a Pod pinned to a pool that lacks its resources, "
            "time-sliced requests above 1; through DRA too (warned while `newChecks` is Warn): "
            "modes mixed in one claim or claim template, or between a Pod's extended resources "
            "and the claims its templates make (with the node inventory's templates; a Pod "
            "whose claims cannot be read is warned that the check was skipped)"
        ),
        claims=True,
    ),
    Rule(
        id="pool-access",
        title=(
            "The Pod's GPU pool is unambiguous, open to its namespace, and the only place it can "
            "land."
        ),
        severity="medium",
        security=False,
        restricts=(
            "an ambiguous pool choice, a pool closed to the namespace, a pool annotation naming no"
            " pool; where pools are reserved for namespaces, a Pod that could still land in one "
            "closed to it, GPU or not (a Pod asking for no GPU that tolerates the pool's taints by"
            " key; through a wildcard toleration, never denied: a warning, or an audit record "
            "where the policy audits Pods that ask for no GPU), or a Pod with `nodeName` outside "
            "the binder namespaces (`tenants[].binder`; with the node inventory: only a node of "
            "a pool closed to it, or a node it does not know); where a tenant may use some "
            "products only, a GPU Pod whose node selection does not keep it to them "
            "(`nvidia.com/gpu.product In`, which the mutating webhook adds; warned while "
            "`newChecks` is Warn)"
        ),
    ),
    Rule(
        id="entitlement",
        title="A tenant uses the GPU resources and counts it is entitled to.",
        severity="medium",
        security=False,
        restricts=(
            "where the policy states a tenant's entitlements: a declared GPU resource they do "
            "not list (in a DRA claim or claim template, a GPU device class not in "
            "`deviceClasses`), more GPU devices in one container or one Pod than they allow "
            "(warned while `newChecks` is Warn); warned, never denied: a workload whose "
            "replicas ask for more of a resource at once than its `maxGPUs`"
        ),
        claims=True,
    ),
    Rule(
        id="queue",
        title="A tenant's GPU workloads go through its queue.",
        severity="medium",
        security=False,
        restricts=(
            "where the policy requires a tenant's queue: a GPU workload or bare GPU Pod without "
            "the queue label (Kueue's `kueue.x-k8s.io/queue-name` by default, where Kueue reads "
            "it), naming a queue not allowed, or without one of the allowed `schedulerName`s "
            "(KAI's, Volcano's); objects a controller creates (`request.userInfo` in "
            "`controllers`) are not asked again (warned while `newChecks` is Warn)"
        ),
    ),
    Rule(
        id="dra-claims",
        title="DRA claims ask for device classes, configurations and MIG profiles that exist.",
        severity="medium",
        security=False,
        restricts=(
            "in ResourceClaims and ResourceClaimTemplates (warned while `newChecks` is Warn): a "
            "near miss of a known device class (did you mean?), an undeclared class under a "
            "vendor domain (as `unknownResources` says), with the node inventory a class the "
            "cluster does not have (warning); NVIDIA's opaque parameters the driver would "
            "refuse after scheduling (kinds, fields, values, sharing strategies whose feature "
            "gate is off; unknown kinds and fields warned), an opaque driver that is a near "
            "miss of `gpu.nvidia.com`; MIG profiles in simple CEL selectors that no declared "
            "product offers (as `migCatalogue.uncataloguedProfiles` says)"
        ),
        claims=True,
    ),
    Rule(
        id="dra-admin-access",
        title="DRA admin access to devices only where a tenant grant allows it.",
        severity="high",
        security=False,
        restricts=(
            "a claim or claim template asking for `adminAccess: true` (which sees and manages "
            "devices other Pods use) in a namespace no `tenants[].grants.draAdminAccess` "
            "covers, on top of the API server's namespace label (warned while `newChecks` is "
            "Warn)"
        ),
        claims=True,
    ),
    Rule(
        id="topology",
        title="A Pod must fit on one node.",
        severity="low",
        security=False,
        restricts="a Pod that cannot fit on one node of its pool, or above the per-Pod maximum",
    ),
    Rule(
        id="daemonset-tolerations",
        title="GPU DaemonSets tolerate their nodes' taints in the template.",
        severity="low",
        security=False,
        restricts="a GPU DaemonSet whose template does not tolerate its nodes' taint (warning)",
    ),
)
BY_ID = {rule.id: rule for rule in RULES}
