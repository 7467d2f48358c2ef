"""``audit --policy NEW --against OLD``: the pre-flight of a policy change lists exactly the
objects whose verdict or findings change, over a fixed set of workloads."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import REPO
from webhook.cli.main import main

GPU = {"limits": {"nvidia.com/gpu": 1}}


def pod(name: str, containers: list[dict], **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"containers": containers, **spec},
    }


WORKLOADS = [
    # Denied by the old policy for half a GPU only: the new one stops checking quantities.
    pod(
        "half", [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}}]
    ),
    # A node agent that reaches GPU nodes through a wildcard toleration and mounts /: warned
    # by the old policy, denied by the new one (reachablePods: Enforce).
    pod(
        "agent",
        [{"name": "a", "image": "agent"}],
        tolerations=[{"operator": "Exists"}],
        volumes=[{"name": "root", "hostPath": {"path": "/"}}],
    ),
    # Denied by both, but the new policy drops one of its two denials.
    pod(
        "both",
        [
            {
                "name": "c",
                "image": "cuda",
                "resources": {"limits": {"nvidia.com/gpu": "1.5"}},
                "securityContext": {"privileged": True},
            }
        ],
    ),
    # Denied by both for the same reason, and clean under both: not listed.
    pod(
        "privileged",
        [{"name": "c", "image": "cuda", "resources": GPU, "securityContext": {"privileged": True}}],
    ),
    pod("clean", [{"name": "c", "image": "cuda", "resources": GPU}]),
]


def write_inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    old = yaml.safe_load((REPO / "policies/default.yaml").read_text("utf-8"))
    new = json.loads(json.dumps(old))
    new["metadata"]["name"] = "tightened"
    new["spec"]["rules"] = {
        "default": {"gpuPods": "Enforce", "reachablePods": "Enforce", "otherPods": "Audit"},
        "gpu-quantity": {"enabled": False},
    }
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    (tmp_path / "new.yaml").write_text(yaml.safe_dump(new))
    (tmp_path / "apps.yaml").write_text(yaml.safe_dump_all(WORKLOADS))
    return tmp_path / "old.yaml", tmp_path / "new.yaml", tmp_path / "apps.yaml"


def preflight(capsys, tmp_path: Path, *extra: str) -> tuple[int, str]:
    old, new, apps = write_inputs(tmp_path)
    code = main(["audit", "-f", str(apps), "--policy", str(new), "--against", str(old), *extra])
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


def test_exactly_the_verdict_changes_are_listed(tmp_path: Path, capsys) -> None:
    code, out = preflight(capsys, tmp_path, "-o", "json")
    assert code == 1  # something would start being denied
    changes = json.loads(out)
    summary = [
        (
            c["object"].split("  ")[0],
            c["verdict"],
            [line.split("]")[0] + "]" for line in c["denialsAdded"]],
            [line.split("]")[0] + "]" for line in c["denialsRemoved"]],
        )
        for c in changes
    ]
    assert summary == [
        ("Pod/half", "stops denying", [], ["[gpu-quantity]"]),
        ("Pod/agent", "starts denying", ["[host-devices]"], []),
        ("Pod/both", "unchanged", [], ["[gpu-quantity]"]),
    ]
    agent = changes[1]
    assert [w.split("]")[0] + "]" for w in agent["warningsRemoved"]] == ["[host-devices]"]
    assert agent["warningsAdded"] == []


def test_the_table_ends_with_a_summary(tmp_path: Path, capsys) -> None:
    code, out = preflight(capsys, tmp_path)
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("STOPS DENYING  Pod/half")
    assert "  - deny  [gpu-quantity] spec.containers[0].resources.limits[nvidia.com/gpu]" in out
    assert lines[-1] == (
        "policy tightened against default: 1 object(s) would start being denied, 1 would stop "
        "being denied, 1 judged differently with the same verdict"
    )


def test_the_same_policy_changes_nothing(tmp_path: Path, capsys) -> None:
    old, _, apps = write_inputs(tmp_path)
    code = main(["audit", "-f", str(apps), "--policy", str(old), "--against", str(old)])
    out, _ = capsys.readouterr()
    assert code == 0
    assert out.splitlines() == [
        "policy default against default: 0 object(s) would start being denied, 0 would stop "
        "being denied, 0 judged differently with the same verdict"
    ]


def test_a_cluster_is_listed_once_and_judged_by_both(
    tmp_path: Path, capsys, kube_api, kube_api_kubeconfig
) -> None:
    old, new, _ = write_inputs(tmp_path)
    for obj in WORKLOADS:
        kube_api.add(obj)
    kube_api.register("", "v1", "replicationcontrollers", "ReplicationController")
    kube_api.serve_discovery({"apps": ["v1"], "batch": ["v1"]})
    argv = ["audit", "--cluster", "-A", "--kubeconfig", str(kube_api_kubeconfig)]
    code = main([*argv, "--policy", str(new), "--against", str(old), "-o", "json"])
    out, _ = capsys.readouterr()
    assert code == 1
    changes = sorted((c["object"], c["verdict"]) for c in json.loads(out))
    assert [(o.split("  ")[0], v) for o, v in changes] == [
        ("Pod/agent", "starts denying"),
        ("Pod/both", "unchanged"),
        ("Pod/half", "stops denying"),
    ]
    assert all("(uid " in o for o, _ in changes)  # live objects, named by their uid
    assert len(kube_api.requests_to("GET", "/api/v1/pods")) == 1  # one listing for both


def test_standard_input_is_judged_by_both_policies(tmp_path: Path, capsys, monkeypatch) -> None:
    old, _, apps = write_inputs(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(apps.read_text()))
    code = main(["audit", "-f", "-", "--policy", str(old), "--against", str(old)])
    assert code == 0
    assert "0 object(s) would start being denied" in capsys.readouterr().out


def test_objects_of_one_name_in_two_groups_are_not_confused(
    tmp_path: Path, capsys, kube_api, kube_api_kubeconfig
) -> None:
    """A batch Job newly denied beside a Volcano Job of the same name denied by both: the
    pre-flight pairs them by uid, and the Job starts being denied."""
    old, new, _ = write_inputs(tmp_path)
    template = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "c",
                    "image": "cuda",
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                    "securityContext": {"privileged": True},
                }
            ],
        }
    }
    kube_api.add(
        {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": "train", "namespace": "team-a"},
            "spec": {"tasks": [{"name": "t", "template": template}]},
        }
    )
    kube_api.add(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "train", "namespace": "team-a"},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "c", "image": "cuda", "tolerations": [], "volumeMounts": []}
                        ],
                        "tolerations": [{"operator": "Exists"}],
                        "volumes": [{"name": "r", "hostPath": {"path": "/"}}],
                    }
                }
            },
        }
    )
    kube_api.register("", "v1", "replicationcontrollers", "ReplicationController")
    kube_api.serve_discovery({"batch": ["v1"], "batch.volcano.sh": ["v1alpha1"]})
    argv = ["audit", "--cluster", "-A", "--kubeconfig", str(kube_api_kubeconfig)]
    code = main([*argv, "--policy", str(new), "--against", str(old), "-o", "json"])
    changes = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [c["verdict"] for c in changes] == ["starts denying"]
    assert changes[0]["denialsAdded"][0].startswith("[host-devices] spec.template.spec.volumes")


# ------------------------------------------------------- adding an entitlement, in pre-flight

MIG = "nvidia.com/mig-1g.10gb"
ENTITLEMENT = {
    "namespaces": ["team-a"],
    "contact": "#team-a-gpus",
    "entitlements": {"resources": [MIG], "maxGPUsPerPod": 2},
}


def gpu_pod(name: str, namespace: str, limits: dict, **container: Any) -> dict:
    obj = pod(name, [{"name": "c", "image": "cuda", "resources": {"limits": limits}, **container}])
    obj["metadata"]["namespace"] = namespace
    return obj


def deployment(name: str, namespace: str, limits: dict) -> dict:
    template = gpu_pod(name, namespace, limits)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": template["spec"]},
        },
    }


# In and out of the entitled tenant: only team-a's objects that ask for what it may not use
# (a resource it does not list, more than 2 devices in one Pod) are judged differently.
ENTITLED_WORKLOADS = [
    gpu_pod("full-gpu", "team-a", {"nvidia.com/gpu": 1}),
    gpu_pod("three-mig", "team-a", {MIG: 3}),
    gpu_pod("one-mig", "team-a", {MIG: 1}),
    pod("cpu", [{"name": "c", "image": "app"}]),
    deployment("serve", "team-a", {"nvidia.com/gpu": 1}),
    deployment("serve-mig", "team-a", {MIG: 2}),
    # Denied by both policies already (privileged): it gains the entitlement's finding.
    gpu_pod("root", "team-a", {"nvidia.com/gpu": 1}, securityContext={"privileged": True}),
    gpu_pod("full-gpu", "team-b", {"nvidia.com/gpu": 1}),
    gpu_pod("three-mig", "team-b", {MIG: 3}),
    deployment("serve", "team-b", {"nvidia.com/gpu": 4}),
    # Exempt in both (the default policy's operator namespaces).
    gpu_pod("operator", "gpu-operator", {"nvidia.com/gpu": 1}),
    # NCCL's capability, granted by default in both: an entitlement takes no grant away.
    gpu_pod("nccl", "team-a", {MIG: 1}, securityContext={"capabilities": {"add": ["IPC_LOCK"]}}),
    gpu_pod(
        "nccl",
        "team-b",
        {"nvidia.com/gpu": 1},
        securityContext={"capabilities": {"add": ["IPC_LOCK"]}},
    ),
]
# (object, what the entitlement says of it) for each object it judges differently.
ENTITLED_CHANGES = [
    ("Pod/full-gpu", 'namespace "team-a" may not use nvidia.com/gpu'),
    ("Pod/three-mig", "the Pod requests 3 GPU devices in all, above the 2 per Pod"),
    ("Deployment/serve", 'namespace "team-a" may not use nvidia.com/gpu'),
    ("Pod/root", 'namespace "team-a" may not use nvidia.com/gpu'),
]


def entitled_policies(
    tmp_path: Path, new_checks: str, *, tenants_block: bool = True
) -> tuple[Path, Path]:
    """OLD: the default policy with ``newChecks`` (without its tenants block, which states
    the default grants, unless ``tenants_block``); NEW: the same with team-a's entitlement."""
    old = yaml.safe_load((REPO / "policies/default.yaml").read_text("utf-8"))
    old["spec"]["newChecks"] = new_checks
    if not tenants_block:
        del old["spec"]["tenants"]
    new = json.loads(json.dumps(old))
    new["metadata"]["name"] = "entitled"
    new["spec"].setdefault("tenants", []).insert(0, ENTITLEMENT)
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    (tmp_path / "new.yaml").write_text(yaml.safe_dump(new))
    return tmp_path / "old.yaml", tmp_path / "new.yaml"


def assert_entitlement_changes(changes: list[dict], new_checks: str) -> None:
    """Exactly the objects the entitlement judges differently, each with its reason alone:
    denials that start (Enforce), or warnings that start with the verdict kept (Warn)."""
    found = [(c["object"].split("  ")[0], c) for c in changes]
    assert [subject for subject, _ in found] == [subject for subject, _ in ENTITLED_CHANGES]
    for (subject, says), (_, change) in zip(ENTITLED_CHANGES, found, strict=True):
        added = change["denialsAdded"] if new_checks == "Enforce" else change["warningsAdded"]
        assert len(added) == 1 and added[0].startswith("[entitlement] "), change
        assert says in added[0] and "tenants[0].entitlements (team-a)" in added[0]
        assert "#team-a-gpus" in added[0]
        unchanged = change["warningsAdded"] if new_checks == "Enforce" else change["denialsAdded"]
        assert unchanged == change["denialsRemoved"] == change["warningsRemoved"] == []
        already_denied = subject == "Pod/root"
        expected = "starts denying" if new_checks == "Enforce" and not already_denied else ""
        assert change["verdict"] == (expected or "unchanged"), change


@pytest.mark.parametrize("tenants_block", [True, False], ids=["beside-grants", "first-tenant"])
@pytest.mark.parametrize("new_checks", ["Warn", "Enforce"])
def test_adding_an_entitlement_shows_exactly_what_it_starts_denying_in_files(
    tmp_path: Path, capsys, new_checks: str, tenants_block: bool
) -> None:
    old, new = entitled_policies(tmp_path, new_checks, tenants_block=tenants_block)
    apps = tmp_path / "apps.yaml"
    apps.write_text(yaml.safe_dump_all(ENTITLED_WORKLOADS))
    code = main(
        ["audit", "-f", str(apps), "--policy", str(new), "--against", str(old), "-o", "json"]
    )
    out, err = capsys.readouterr()
    assert err == ""
    assert code == (1 if new_checks == "Enforce" else 0)
    assert_entitlement_changes(json.loads(out), new_checks)


def owned_by(owner: dict, kind: str, name: str, uid: str) -> dict:
    """An object the owner's controller made from its template (a ReplicaSet, a Pod)."""
    obj = json.loads(json.dumps(owner))
    obj["kind"], obj["apiVersion"] = kind, "apps/v1" if kind == "ReplicaSet" else "v1"
    obj["metadata"] = {
        "name": name,
        "namespace": owner["metadata"]["namespace"],
        "uid": uid,
        "ownerReferences": [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ],
    }
    if kind == "Pod":
        obj["spec"] = owner["spec"]["template"]["spec"]
    return obj


@pytest.mark.parametrize("new_checks", ["Warn", "Enforce"])
def test_adding_an_entitlement_shows_exactly_what_it_starts_denying_in_a_cluster(
    tmp_path: Path, capsys, kube_api, kube_api_kubeconfig, new_checks: str
) -> None:
    """The same objects, live: a Deployment's ReplicaSet and Pod are listed under it, never
    as changes of their own."""
    old, new = entitled_policies(tmp_path, new_checks)
    for obj in ENTITLED_WORKLOADS:
        kube_api.add(obj)
    serve = next(
        o
        for o in kube_api.items("/apis/apps/v1/deployments")
        if o["metadata"]["name"] == "serve" and o["metadata"]["namespace"] == "team-a"
    )
    replica_set = owned_by(serve, "ReplicaSet", "serve-5d8", "rs-uid")
    kube_api.add(replica_set)
    kube_api.add(owned_by(replica_set | {"spec": serve["spec"]}, "Pod", "serve-5d8-x", "pod-uid"))
    kube_api.register("", "v1", "replicationcontrollers", "ReplicationController")
    kube_api.serve_discovery({"apps": ["v1"], "batch": ["v1"]})
    argv = ["audit", "--cluster", "-A", "--kubeconfig", str(kube_api_kubeconfig)]
    code = main([*argv, "--policy", str(new), "--against", str(old), "-o", "json"])
    out, _ = capsys.readouterr()
    assert code == (1 if new_checks == "Enforce" else 0)
    order = [subject for subject, _ in ENTITLED_CHANGES]
    changes = sorted(json.loads(out), key=lambda c: order.index(c["object"].split("  ")[0]))
    assert_entitlement_changes(changes, new_checks)
    assert all("(uid " in c["object"] for c in changes)
