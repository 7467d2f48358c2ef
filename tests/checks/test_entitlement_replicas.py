"""entitlement, replicas × GPUs: a workload whose template's Pods, as many as its kind runs at
once (counted where the catalogue declares it), ask for more of a resource than the tenant's
maxGPUs allows the namespace is warned, never denied (the count changes through /scale, which
no webhook sees), naming the count, the setting and whom to ask."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import pytest
import yaml

import webhook
from tests.support.admission import (
    admission,
    assert_allowed_clean,
    container,
    policy,
    template,
    validate,
)
from tests.test_catalogue import SAMPLE_OBJECTS, normalised
from webhook.cli.main import main
from webhook.core.replicas import replicas_of
from webhook.core.targets import walk_views

SPEC = """
newChecks: {new_checks}
gpuNodeTaints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
resources:
  - {{name: nvidia.com/gpu, sharing: Exclusive}}
  - {{name: nvidia.com/mig-1g.10gb, sharing: MIG}}
tenants:
  - namespaces: [research]
    entitlements: {{maxGPUsPerPod: 8}}
  - namespaces: [team-a]
    contact: "#team-a-gpus"
    entitlements:
      maxGPUs: {{nvidia.com/gpu: 4}}
"""
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"


@cache
def entitled(new_checks: str = "Enforce") -> webhook.Policy:
    return policy(SPEC.format(new_checks=new_checks), name=f"replicas-{new_checks}")


def gpus(count: Any, resource: str = GPU) -> dict:
    """A template whose one container asks for ``count`` of ``resource``."""
    return template(container(gpu=count, resource=resource))


def workload(api_version: str, kind: str, spec: dict) -> dict:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "work", "namespace": "team-a"},
        "spec": spec,
    }


def deployment(replicas: int | None, per_pod: int, kind: str = "Deployment") -> dict:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "work"}}, "template": gpus(per_pod)}
    if replicas is not None:
        spec["replicas"] = replicas
    return workload("apps/v1", kind, spec)


def warned(obj: dict, policy_: webhook.Policy | None = None, **kwargs: Any) -> list[tuple]:
    """(path, message) of each replicas finding, checked to be a warning of an admitted object."""
    decision = validate(obj, policy_ or entitled(), namespace="team-a", **kwargs)
    assert decision.allowed
    found = [f for f in decision.findings if f.violation.subject == "replicas"]
    assert all(f.mode == "Warn" for f in found)
    return [(f.path, f.violation.detail()) for f in found]


def test_replicas_times_gpus_above_max_gpus_is_a_warning_naming_count_setting_and_fix() -> None:
    decision = validate(deployment(4, 2), entitled(), namespace="team-a")
    assert decision.allowed
    [finding] = decision.findings
    assert (finding.rule, finding.mode, finding.path) == ("entitlement", "Warn", "spec.replicas")
    assert finding.violation.render() == (
        "spec.replicas: Invalid value: 4: replicas 4 × 2 nvidia.com/gpu per Pod = 8, above the 4 "
        "that tenants[1].entitlements (team-a) allows this namespace at once (its ResourceQuota "
        "refuses the Pods beyond it: they are not created, and their controller reports "
        "FailedCreate); 2 of these Pods fit at once: run at most 2, or ask #team-a-gpus for a "
        "larger maxGPUs"
    )
    # The response carries it as a warning, under newChecks Enforce too.
    [warning] = decision.response["response"]["warnings"]
    assert "replicas 4 × 2 nvidia.com/gpu per Pod = 8" in warning


@pytest.mark.parametrize("new_checks", ["Warn", "Enforce"])
@pytest.mark.parametrize("mode", ["Enforce", "Warn"])
def test_it_is_a_warning_whatever_the_rule_mode_and_new_checks(new_checks: str, mode: str) -> None:
    text = SPEC.format(new_checks=new_checks) + f"rules:\n  entitlement: {{gpuPods: {mode}}}\n"
    [(path, message)] = warned(deployment(8, 1), policy(text, name=f"{mode}-{new_checks}"))
    assert (path, message.split(",")[0]) == (
        "spec.replicas",
        "replicas 8 × 1 nvidia.com/gpu per Pod = 8",
    )


def test_within_max_gpus_and_outside_the_tenant_nothing_is_said() -> None:
    assert_allowed_clean(validate(deployment(2, 2), entitled(), namespace="team-a"))
    # research states entitlements without maxGPUs; web none.
    assert_allowed_clean(validate(deployment(9, 8), entitled(), namespace="research"))
    assert_allowed_clean(validate(deployment(9, 8), entitled(), namespace="web"))
    # A resource maxGPUs does not name, and a Pod (one of them).
    obj = deployment(9, 1)
    obj["spec"]["template"] = gpus(1, MIG)
    assert warned(obj) == []
    assert warned({"apiVersion": "v1", "kind": "Pod", **gpus(8)}) == []


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "ReplicaSet"])
def test_an_unset_replicas_counts_one(kind: str) -> None:
    [(path, message)] = warned(deployment(None, 8, kind))
    assert path == "spec.replicas"
    assert message.startswith("replicas 1 × 8 nvidia.com/gpu per Pod = 8, above the 4 ")
    assert "not one of these Pods fits: request at most 4 nvidia.com/gpu in each" in message


@pytest.mark.parametrize(
    "job, said",
    [
        ({"parallelism": 3}, "parallelism 3 × 2"),
        ({"parallelism": 8, "completions": 3}, "completions 3 × 2"),  # fewer left to run
        ({"parallelism": 2, "completions": 10}, None),
        ({"completions": 10}, None),  # parallelism 1
    ],
)
def test_a_job_runs_its_parallelism_at_once_and_no_more_than_its_completions(
    job: dict, said: str | None
) -> None:
    obj = workload("batch/v1", "Job", {**job, "template": gpus(2)})
    found = warned(obj)
    assert [message.split(" nvidia.com/gpu")[0] for _, message in found] == ([said] if said else [])
    if said:
        assert found[0][0] == f"spec.{said.split()[0]}"
    cron = workload(
        "batch/v1", "CronJob", {"schedule": "@daily", "jobTemplate": {"spec": obj["spec"]}}
    )
    assert [p for p, _ in warned(cron)] == [
        f"spec.jobTemplate.spec.{said.split()[0]}" for _ in found
    ]


def lws(size: int, *, leader: bool, replicas: int = 2) -> dict:
    spec: dict[str, Any] = {"size": size, "workerTemplate": gpus(1)}
    if leader:
        spec["leaderTemplate"] = gpus(1)
    return workload(
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
        {"replicas": replicas, "leaderWorkerTemplate": spec},
    )


def test_a_leader_worker_set_counts_its_workers_less_the_leader_it_makes_apart() -> None:
    [(path, message)] = warned(lws(4, leader=True))
    assert path == "spec.replicas"
    assert message.startswith("replicas 2 × (size 4 − 1) × 1 nvidia.com/gpu per Pod = 6, ")
    # Without a leaderTemplate the workerTemplate makes the leader too.
    [(_, message)] = warned(lws(4, leader=False))
    assert message.startswith("replicas 2 × size 4 × 1 nvidia.com/gpu per Pod = 8, ")
    # Groups of one: the leaders alone, one per group.
    found = warned(lws(1, leader=True, replicas=5))
    assert [m.split(",")[0] for _, m in found] == ["replicas 5 × 1 nvidia.com/gpu per Pod = 5"]


def test_each_replica_type_of_a_training_job_is_counted_on_its_own() -> None:
    obj = workload(
        "kubeflow.org/v1",
        "PyTorchJob",
        {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": gpus(2)},
                "Worker": {"replicas": 3, "template": gpus(2)},
            }
        },
    )
    [(path, message)] = warned(obj)
    assert path == "spec.pytorchReplicaSpecs[Worker].replicas"
    assert message.startswith("replicas 3 × 2 nvidia.com/gpu per Pod = 6, ")


def test_a_ray_worker_group_runs_within_its_bounds_on_numOfHosts_pods_each() -> None:
    def cluster(**group: Any) -> dict:
        group = {"groupName": "gpu", "template": gpus(1), **group}
        head = {"template": template(container())}
        spec = {"headGroupSpec": head, "workerGroupSpecs": [group]}
        return workload("ray.io/v1", "RayCluster", spec)

    assert [
        m.split(" nvidia")[0] for _, m in warned(cluster(replicas=1, minReplicas=3, numOfHosts=2))
    ] == ["minReplicas 3 × numOfHosts 2 × 1"]
    [(path, message)] = warned(cluster(replicas=10, maxReplicas=5))
    assert (path, message.split(" nvidia")[0]) == (
        "spec.workerGroupSpecs[0].maxReplicas",
        "maxReplicas 5 × numOfHosts 1 × 1",
    )
    assert warned(cluster()) == []  # no replicas written: KubeRay's default is 0
    assert warned(cluster(replicas=4)) == []


def test_a_jobset_counts_replicated_jobs_times_their_parallelism() -> None:
    job = {"parallelism": 2, "template": gpus(2)}
    obj = workload(
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        {
            "replicatedJobs": [
                {"name": "launcher", "replicas": 1, "template": {"spec": {"template": gpus(1)}}},
                {"name": "workers", "replicas": 2, "template": {"spec": job}},
            ]
        },
    )
    [(path, message)] = warned(obj)
    assert path == "spec.replicatedJobs[1].replicas"
    assert message.startswith("replicas 2 × parallelism 2 × 2 nvidia.com/gpu per Pod = 8, ")


def test_a_count_that_is_not_a_whole_number_says_nothing() -> None:
    for value in ("4", -1, 2.5, True):
        obj = deployment(4, 2)
        obj["spec"]["replicas"] = value
        assert warned(obj) == [], value


def test_an_update_that_scales_up_is_warned_and_scale_itself_is_not_judged() -> None:
    old = deployment(2, 2)
    [(path, _)] = warned(deployment(3, 2), operation="UPDATE", old=old)
    assert path == "spec.replicas"
    # The /scale subresource carries a Scale, not the workload: never judged.
    scale = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "work"}}
    scale["spec"] = {"replicas": 10}
    review = admission(scale, operation="UPDATE", namespace="team-a", sub_resource="scale")
    review["request"]["kind"] = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    decision = webhook.decide(review, entitled(), mutate=False)
    assert decision.allowed and decision.findings == ()


def test_a_policys_own_workload_kind_declares_its_count() -> None:
    text = SPEC.format(new_checks="Warn") + (
        "workloads:\n"
        "  - group: example.com\n"
        "    kind: Trainer\n"
        "    templates: ['spec.pods[*].template']\n"
        "    replicas:\n"
        "      - target: 'spec.pods[*].template'\n"
        "        count: [{path: 'spec.pods[*].count', default: 1}]\n"
    )
    own = policy(text, name="own-kind")
    obj = workload(
        "example.com/v1",
        "Trainer",
        {"pods": [{"count": 3, "template": gpus(2)}, {"template": gpus(2)}]},
    )
    assert [p for p, _ in warned(obj, own)] == ["spec.pods[0].count"]


@pytest.mark.parametrize(
    "replicas, says",
    [
        (
            {"target": "spec.other", "count": [{"path": "spec.count"}]},
            "'spec.other' is none of this entry's templates, podSpecs or resources paths",
        ),
        (
            {"target": "spec.pods[*].template", "count": [{"path": "spec.counts[*].n"}]},
            "invalid replicas path 'spec.counts[*].n': below what it shares with "
            "'spec.pods[*].template' it must name a field, without '*' or '[*]'",
        ),
    ],
)
def test_a_count_that_cannot_pair_with_its_target_is_refused(replicas: dict, says: str) -> None:
    entry = {
        "group": "example.com",
        "kind": "Trainer",
        "templates": ["spec.pods[*].template"],
        "replicas": [replicas],
    }
    text = SPEC.format(new_checks="Warn") + yaml.safe_dump({"workloads": [entry]})
    with pytest.raises(webhook.PolicyError) as error:
        policy(text, name="bad-count")
    assert says in str(error.value)


def test_the_catalogues_counts_are_read_where_the_samples_write_them() -> None:
    """Over the catalogue's samples and the real corpus: each template that asks for a GPU
    where its kind is counted gets a count, read from a whole number at its path (or, where
    the path is not written, the kind's default)."""
    default = webhook.load_policy(webhook.default_policy_path())
    counted = 0
    for source, obj in SAMPLE_OBJECTS:
        workload = default.workloads[(obj["apiVersion"].rpartition("/")[0], obj["kind"])]
        for view in walk_views(obj, workload, "team-a", default):
            replicas = replicas_of(view.counted) if view.counted else None
            if replicas is None:
                continue
            counted += 1
            value: Any = obj
            for step in re.findall(r"[^.\[\]]+|\[\d+\]", normalised(replicas.path)):
                if step.startswith("["):
                    value = value[int(step[1:-1])]
                else:
                    value = value.get(step) if isinstance(value, dict) else None
            if value is not None:
                assert isinstance(value, int) and f" {value}" in replicas.shown, source
    assert counted >= 19  # the catalogue's own samples count 19 templates; the corpus adds more


def test_the_audit_of_manifests_warns_with_the_line_of_the_count(tmp_path, capsys) -> None:
    policy_path = tmp_path / "policy.yaml"
    document = {
        "apiVersion": "gpu-admission.io/v1alpha1",
        "kind": "GPUAdmissionPolicy",
        "metadata": {"name": "replicas"},
        "spec": yaml.safe_load(SPEC.format(new_checks="Enforce")),
    }
    policy_path.write_text(yaml.safe_dump(document))
    manifest = tmp_path / "serve.yaml"
    manifest.write_text(yaml.safe_dump(deployment(4, 2), sort_keys=False))
    lines = manifest.read_text().splitlines()
    written = lines.index("  replicas: 4") + 1
    argv = ["audit", "-f", str(manifest), "--policy", str(policy_path), "-o", "wide"]
    # Every rule enforced (the audit's default) or the policy's own modes: a warning.
    for extra in ([], ["--respect-modes"]):
        assert main([*argv, *extra]) == 0
        out = capsys.readouterr().out
        line = next(line for line in out.splitlines() if "[entitlement]" in line)
        assert line.startswith("  warn  [entitlement] spec.replicas: Invalid value: 4: replicas 4 ")
        assert line.endswith(f"(line {written})")
