"""Live ResourceQuotas that contradict the tenants' entitlements: ``cluster check`` reports them
as drift (one finding per tenant, resource and kind, naming the quotas, the namespaces, the
tenant setting and the ``gpu-admission quota`` command that fixes them), and ``audit
--cluster`` notes them; the quotas ``gpu-admission quota`` writes, applied, end the drift. The
fake API server holds the quotas; namespaces and quotas are read in pages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kubeapi import FakeKubeAPI
from tests.support.paths import REPO
from webhook import parse_policy
from webhook.audit.quota_drift import QUOTA_DRIFT_KINDS, find_quota_drift, live_quota
from webhook.cli.main import main

POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata: {name: quotas}
spec:
  gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
  resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
  pools:
    - name: inference
      nodeSelector: {example.com/pool: inference}
      taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
      resources: [{name: nvidia.com/mig-1g.10gb, sharing: MIG}]
  tenants:
    - namespaces: [inference-*]
      contact: "#gpu-platform"
      entitlements:
        resources: [nvidia.com/mig-1g.10gb]
        maxGPUs: {nvidia.com/mig-1g.10gb: 14}
    - namespaces: [training]
      entitlements:
        maxGPUs: {nvidia.com/gpu: 64}
    - namespaces: [research]
      entitlements:
        maxGPUsPerPod: 8
"""
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
INFERENCE_NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "infer-1", "labels": {"example.com/pool": "inference"}},
    "spec": {"taints": [{"key": GPU, "value": "present", "effect": "NoSchedule"}]},
    "status": {"capacity": {MIG: "7"}, "allocatable": {MIG: "7"}},
}


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def quota(namespace: str, name: str, hard: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": hard, **spec},
    }


PRIORITY_SCOPE = {
    "scopeSelector": {
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]
    }
}


def drifting_cluster() -> list[dict[str, Any]]:
    """Namespaces of each tenant, each with the quotas that make one kind of drift or none."""
    return [
        INFERENCE_NODE,
        *(
            namespace(name)
            for name in (
                "inference-chat",
                "inference-eval",
                "inference-scoped",
                "inference-ok",
                "inference-two",
                "training",
                "research",
                "web",
            )
        ),
        # Allows nvidia.com/gpu, and a MIG profile (declared through the catalogue) that the
        # tenant may not use either; its own profile at the maximum.
        quota(
            "inference-chat",
            "gpu-quota",
            {
                f"requests.{GPU}": "4",
                "requests.nvidia.com/mig-3g.40gb": "2",
                f"requests.{MIG}": "14",
            },
        ),
        # Above the maximum, and nvidia.com/gpu "held" under a name the quota never counts.
        quota("inference-eval", "legacy", {f"requests.{MIG}": "20", f"limits.{GPU}": "0"}),
        # nvidia.com/gpu held at 0 for one priority class only.
        quota("inference-scoped", "high", {f"requests.{GPU}": "0"}, **PRIORITY_SCOPE),
        quota("inference-scoped", "mig", {f"requests.{MIG}": "10"}),
        # What the policy implies: nothing to say.
        quota(
            "inference-ok", "gpu-admission-gpus", {f"requests.{GPU}": "0", f"requests.{MIG}": "14"}
        ),
        # An old quota allows what the implied one holds at 0: the strictest wins.
        quota("inference-two", "old", {f"requests.{GPU}": "8", f"requests.{MIG}": "100"}),
        quota(
            "inference-two", "gpu-admission-gpus", {f"requests.{GPU}": "0", f"requests.{MIG}": "14"}
        ),
        # No tenant with entitlements: not compared.
        quota("web", "anything", {f"requests.{GPU}": "100"}),
        # CPU and memory only: not kept.
        quota("training", "compute", {"requests.cpu": "100", "requests.memory": "1Ti"}),
    ]


def write_policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def check(kube_api: FakeKubeAPI, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    command = [sys.executable, "-m", "webhook.cli", "cluster", "check"]
    command += ["--policy", str(write_policy(tmp_path)), "--kubeconfig", str(kubeconfig)]
    return subprocess.run(
        command + list(args), cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_each_kind_of_quota_drift_is_reported_once_per_tenant_and_resource(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(drifting_cluster())
    result = check(kube_api, tmp_path, "-o", "json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    # inference-* (5 of them) and training: research's entitlements imply no quota.
    assert (report["namespacesWithEntitlements"], report["resourceQuotas"]) == (6, 7)
    found = [(d["kind"], d["level"], d["subject"], d["namespaces"]) for d in report["drift"]]
    assert found == [
        ("quota-allows-forbidden-resource", "drift", f"tenants[0]: {GPU}", ["inference-chat"]),
        (
            "quota-allows-forbidden-resource",
            "drift",
            "tenants[0]: nvidia.com/mig-3g.40gb",
            ["inference-chat"],
        ),
        ("quota-above-max-gpus", "drift", f"tenants[0]: {MIG}", ["inference-eval"]),
        ("max-gpus-without-quota", "drift", f"tenants[1]: {GPU}", ["training"]),
        (
            "forbidden-resource-without-quota",
            "info",
            f"tenants[0]: {GPU}",
            ["inference-eval", "inference-scoped"],
        ),
    ]
    assert {d["kind"] for d in report["drift"]} == set(QUOTA_DRIFT_KINDS)
    messages = [d["message"] for d in report["drift"]]
    policy = str(tmp_path / "policy.yaml")
    assert messages[0] == (
        "1 ResourceQuota lets namespace inference-chat of tenants[0].entitlements (inference-*) "
        "request nvidia.com/gpu, which it leaves out (resources: nvidia.com/mig-1g.10gb): "
        "inference-chat/gpu-quota (4); the entitlement rule only warns of it (newChecks: "
        "Warn). Set requests.nvidia.com/gpu to 0 in it, or apply the quota the policy "
        f"implies, which holds it at 0: gpu-admission quota --policy {policy} -n inference-chat "
        "| kubectl apply -f -"
    )
    # A profile the implied quota does not name: only the quota's own entry can hold it.
    assert messages[1].endswith("Set requests.nvidia.com/mig-3g.40gb to 0 in it")
    assert messages[2] == (
        "1 ResourceQuota lets namespace inference-eval of tenants[0].entitlements (inference-*) "
        "request more nvidia.com/mig-1g.10gb than its maxGPUs of 14: inference-eval/legacy "
        "(20); lower requests.nvidia.com/mig-1g.10gb to 14, or apply the quota the policy "
        f"implies: gpu-admission quota --policy {policy} -n inference-eval | kubectl apply -f -"
    )
    assert (
        "namespace training of tenants[1].entitlements (training) has no ResourceQuota"
        in (messages[3])
    )
    assert "holds requests.nvidia.com/gpu to its maxGPUs of 64" in messages[3]
    # What looked as if it held the resource, and does not.
    assert (
        "inference-eval/legacy writes limits.nvidia.com/gpu, a key ResourceQuota never counts "
        "for an extended resource (only requests.nvidia.com/gpu)" in messages[4]
    )
    assert "inference-scoped/high holds it for the Pods of its scopes only" in messages[4]
    assert "-n inference-eval -n inference-scoped | kubectl apply -f -" in messages[4]

    text = check(kube_api, tmp_path)
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    assert lines[4].startswith("forbidden-resource-without-quota (info): 2 namespaces of ")
    assert lines[-1] == (
        "1 node, 7 GPU ResourceQuotas in 6 namespaces with entitlements read (no "
        "devicePluginDaemonSets: device plugins not compared); 4 disagreements (1 note)"
    )


def test_the_quotas_the_policy_implies_end_the_drift(
    kube_api: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fix each message names, applied: only what it cannot hold is left (the MIG profile
    the policy declares through the catalogue, which inference-chat's quota allows)."""
    kube_api.add_all(drifting_cluster())
    names = ["inference-chat", "inference-eval", "inference-scoped", "training"]
    argv = ["quota", "--policy", str(write_policy(tmp_path)), "-o", "json"]
    assert main([*argv, *(arg for name in names for arg in ("-n", name))]) == 0
    kube_api.add_all(json.loads(capsys.readouterr().out)["items"])
    result = check(kube_api, tmp_path, "-o", "json")
    report = json.loads(result.stdout)
    assert [(d["kind"], d["subject"]) for d in report["drift"]] == [
        ("quota-allows-forbidden-resource", "tenants[0]: nvidia.com/mig-3g.40gb")
    ]
    assert result.returncode == 1
    kube_api.remove("/api/v1/namespaces/inference-chat/resourcequotas/gpu-quota")
    result = check(kube_api, tmp_path)
    assert result.returncode == 0, result.stdout
    assert result.stdout.endswith("; the policy and the cluster agree\n")


def test_namespaces_and_quotas_are_read_in_pages(kube_api: FakeKubeAPI, tmp_path: Path) -> None:
    kube_api.add(INFERENCE_NODE)
    for index in range(1200):
        name = f"inference-{index:04d}"
        kube_api.add(namespace(name))
        kube_api.add(
            quota(name, "gpu-admission-gpus", {f"requests.{GPU}": "0", f"requests.{MIG}": "14"})
        )
    # Without entitlements: listed, not kept.
    kube_api.add_all(namespace(f"web-{index}") for index in range(300))
    result = check(kube_api, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1200 GPU ResourceQuotas in 1200 namespaces with entitlements read" in result.stdout
    assert len(kube_api.requests_to("GET", "/api/v1/namespaces")) == 3
    assert len(kube_api.requests_to("GET", "/api/v1/resourcequotas")) == 3


def test_a_policy_without_entitlements_reads_no_quota(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(drifting_cluster())
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    policy = tmp_path / "plain.yaml"
    policy.write_text(POLICY.split("  tenants:")[0])
    command = [sys.executable, "-m", "webhook.cli", "cluster", "check", "--policy", str(policy)]
    result = subprocess.run(
        [*command, "--kubeconfig", str(kubeconfig)], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert kube_api.requests_to("GET", "/api/v1/resourcequotas") == []
    assert kube_api.requests_to("GET", "/api/v1/namespaces") == []


def test_quotas_that_cannot_be_listed_exit_2_naming_the_role(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(drifting_cluster())
    kube_api.forbid("/api/v1/resourcequotas")
    result = check(kube_api, tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    [line] = result.stderr.splitlines()
    assert "cannot list resourcequotas in all namespaces (HTTP 403)" in line
    assert line.endswith(
        "bind the gpu-admission-auditor ClusterRole (manifests/base/auditor-clusterrole.yaml)"
    )


def audit(kube_api: FakeKubeAPI, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    command = [sys.executable, "-m", "webhook.cli", "audit", "--cluster"]
    command += ["--policy", str(write_policy(tmp_path)), "--kubeconfig", str(kubeconfig)]
    return subprocess.run(
        command + list(args), cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_the_live_audit_notes_the_quotas_that_contradict_entitlements(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(drifting_cluster())
    kube_api.serve_discovery({"apps": ["v1"], "batch": ["v1"]})
    kube_api.register("", "v1", "replicationcontrollers", "ReplicationController")
    result = audit(kube_api, tmp_path, "-A")
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "ResourceQuota" in line]
    assert [note.split(":")[2].strip() for note in notes] == [
        "quota-allows-forbidden-resource",
        "quota-allows-forbidden-resource",
        "quota-above-max-gpus",
        "max-gpus-without-quota",
        "forbidden-resource-without-quota",
    ]
    assert notes[0].startswith("gpu-admission: note: quota-allows-forbidden-resource: 1 ")
    # One namespace: its quotas only, no namespace listed.
    result = audit(kube_api, tmp_path, "-n", "inference-eval")
    notes = [line.split(":")[2].strip() for line in result.stderr.splitlines() if "Quota" in line]
    assert notes == ["quota-above-max-gpus", "forbidden-resource-without-quota"]
    assert len(kube_api.requests_to("GET", "/api/v1/namespaces")) == 1  # the -A run's
    assert kube_api.requests_to("GET", "/api/v1/namespaces/inference-eval/resourcequotas")
    # Policy reports are per workload: no quota read.
    before = len(kube_api.requests_to("GET", "/api/v1/resourcequotas"))
    result = audit(kube_api, tmp_path, "-A", "-o", "policyreport")
    assert "ResourceQuota" not in result.stderr
    assert len(kube_api.requests_to("GET", "/api/v1/resourcequotas")) == before


def test_a_live_audit_refused_the_quotas_says_so_and_exits_2(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    kube_api.add_all(drifting_cluster())
    kube_api.serve_discovery({"apps": ["v1"], "batch": ["v1"]})
    kube_api.register("", "v1", "replicationcontrollers", "ReplicationController")
    kube_api.forbid("/api/v1/namespaces")
    result = audit(kube_api, tmp_path, "-A")
    assert result.returncode == 2
    assert "cannot list namespaces (HTTP 403)" in result.stderr
    assert "bind the gpu-admission-auditor ClusterRole" in result.stderr
    assert result.stdout.rstrip().endswith("could not be read (see the errors above)")


def test_what_is_kept_of_a_quota_is_its_gpu_entries() -> None:
    policy = parse_policy(POLICY)
    names = policy.declared_names
    kept = live_quota(
        quota(
            "inference-chat",
            "mixed",
            {
                "requests.cpu": "8",
                f"requests.{GPU}": "4",
                f"limits.{MIG}": "2",
                MIG: "2",
                "requests.example.com/fpga": "1",
            },
            scopes=["NotBestEffort"],
        ),
        names,
    )
    assert kept is not None
    assert (kept.name, kept.scoped, dict(kept.counted)) == ("mixed", True, {GPU: 4})
    assert kept.uncounted == (f"limits.{MIG}", MIG)
    assert live_quota(quota("x", "cpu", {"requests.cpu": "8"}), names) is None


def test_a_quota_with_scopes_holds_nothing_for_the_namespace() -> None:
    """Scoped at the maximum, nothing unscoped: the maximum is not held; an unscoped quota
    within it holds it whatever the scoped ones allow."""
    policy = parse_policy(POLICY)
    scoped = live_quota(
        quota("training", "high", {f"requests.{GPU}": "64"}, **PRIORITY_SCOPE), {GPU}
    )
    wide = live_quota(
        quota("training", "wide", {f"requests.{GPU}": "100"}, **PRIORITY_SCOPE), {GPU}
    )
    held = live_quota(quota("training", "all", {f"requests.{GPU}": "32"}), {GPU})
    assert scoped is not None and wide is not None and held is not None
    training: dict[str, Any] = {"training": None}
    [drift] = find_quota_drift(policy, training, {"training": [scoped]})
    assert drift.kind == "max-gpus-without-quota"
    [drift] = find_quota_drift(policy, training, {"training": [scoped, wide]})
    assert (drift.kind, drift.message.split(": ")[1][:26]) == (
        "quota-above-max-gpus",
        "training/wide (100); lower",
    )
    assert find_quota_drift(policy, training, {"training": [wide, held]}) == []


def test_a_tenant_that_selects_namespaces_by_label_is_compared_by_their_labels(
    kube_api: FakeKubeAPI, tmp_path: Path
) -> None:
    """Its namespaces are found by the labels it selects (only those kept); the fix writes
    the quota with kubectl, since gpu-admission quota judges a namespace by its name."""
    selecting = POLICY.replace(
        "    - namespaces: [inference-*]\n",
        "    - namespaceSelector: {matchLabels: {example.com/tier: inference}}\n",
    )
    labelled = namespace("vision")
    labelled["metadata"]["labels"] = {"example.com/tier": "inference", "team": "vision"}
    kube_api.add_all(
        [
            INFERENCE_NODE,
            labelled,
            namespace("inference-chat"),  # named like the others' namespaces: not selected
            quota("vision", "legacy", {f"requests.{GPU}": "2"}),
            quota("inference-chat", "legacy", {f"requests.{GPU}": "2"}),
        ]
    )
    (tmp_path / "policy.yaml").write_text(selecting)
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    command = [sys.executable, "-m", "webhook.cli", "cluster", "check", "-o", "json"]
    command += ["--policy", str(tmp_path / "policy.yaml"), "--kubeconfig", str(kubeconfig)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    drift = json.loads(result.stdout)["drift"]
    assert [(d["kind"], d["namespaces"]) for d in drift] == [
        ("quota-allows-forbidden-resource", ["vision"]),
        ("max-gpus-without-quota", ["vision"]),
    ]
    assert (
        "tenants[0].entitlements (namespaces selected by example.com/tier=inference)"
        in (drift[0]["message"])
    )
    assert drift[0]["message"].endswith(
        "apply the quota the policy implies, which holds it at 0: kubectl create quota "
        "gpu-admission-gpus -n vision --hard=requests.nvidia.com/gpu=0,"
        "requests.nvidia.com/mig-1g.10gb=14"
    )
    # One namespace audited: its labels read alone (a field selector), then its quotas.
    kube_api.serve_discovery({"apps": ["v1"], "batch": ["v1"]})
    kube_api.register("", "v1", "replicationcontrollers", "ReplicationController")
    command = [sys.executable, "-m", "webhook.cli", "audit", "--cluster", "-n", "vision"]
    command += ["--policy", str(tmp_path / "policy.yaml"), "--kubeconfig", str(kubeconfig)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    notes = [line.split(":")[2].strip() for line in result.stderr.splitlines() if "Quota" in line]
    assert notes == ["quota-allows-forbidden-resource", "max-gpus-without-quota"]
    [listed] = kube_api.requests_to("GET", "/api/v1/namespaces")[-1:]
    assert listed.query["fieldSelector"] == ["metadata.name=vision"]
