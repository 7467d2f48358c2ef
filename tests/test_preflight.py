"""``audit --policy NEW --against OLD``: the pre-flight of a policy change lists exactly the
objects whose verdict or findings change, over a fixed set of workloads."""

from __future__ import annotations

import io
import json
from pathlib import Path

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
