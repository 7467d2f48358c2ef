"""``webhook.core.paths`` and ``webhook.core.targets``: a catalogue path walked through an object
as written (field paths, identities by name), and the views made of each shape of target
(template, podSpec with inherited fields, container, resources with pod fields), on the
packaged catalogue's own kinds."""

from __future__ import annotations

from typing import Any

import pytest

import webhook
from webhook.core.paths import walk_paired, walk_path
from webhook.core.pods import PodView
from webhook.core.targets import walk_templates, walk_views
from webhook.policy.workloads import compile_template_path as compile_path

POLICY = webhook.load_policy(webhook.default_policy_path())
GPU = {"limits": {"nvidia.com/gpu": 1}}


def kind(group: str, name: str) -> Any:
    return POLICY.workloads[(group, name)]


def views(obj: dict[str, Any], group: str, name: str) -> list[PodView]:
    return list(walk_views(obj, kind(group, name), "ml", POLICY))


def test_a_path_names_list_items_by_name_and_maps_by_key() -> None:
    obj = {
        "spec": {
            "groups": [{"name": "head", "x": {}}, {"groupName": "workers", "x": {}}, {"x": {}}],
            "replicas": {"Master": {"x": {}}, "Worker": {"x": "not an object"}},
        }
    }
    assert [(p, i) for p, i, _ in walk_path(obj, compile_path("spec.groups[*].x"))] == [
        ("spec.groups[0].x", "spec.groups[name=head].x"),
        ("spec.groups[1].x", "spec.groups[name=workers].x"),
        ("spec.groups[2].x", "spec.groups[2].x"),
    ]
    # A match must be an object: the Worker's string is not one.
    assert [p for p, _, _ in walk_path(obj, compile_path("spec.replicas.*.x"))] == [
        "spec.replicas[Master].x"
    ]
    assert list(walk_path({"spec": []}, compile_path("spec.groups[*].x"))) == []


def test_paired_paths_meet_under_the_same_items_only() -> None:
    obj = {
        "spec": {
            "services": [
                {"name": "a", "spec": {"resources": {}, "image": "a"}},
                {"name": "b", "spec": {"resources": {}, "image": "b"}},
            ]
        }
    }
    pairs = walk_paired(
        obj, compile_path("spec.services[*].spec.resources"), compile_path("spec.services[*].spec")
    )
    assert [(holder, match[0]) for holder, match in pairs] == [
        ("spec.services[0].spec.resources", "spec.services[0].spec"),
        ("spec.services[1].spec.resources", "spec.services[1].spec"),
    ]


def test_template_targets_are_views_and_templates() -> None:
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "head"}]}}},
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "template": {
                        "metadata": {"annotations": {"a": "b"}},
                        "spec": {"containers": [{"name": "w", "resources": GPU}]},
                    },
                }
            ],
            "autoscalerOptions": {"resources": GPU},
        },
    }
    found = views(job, "ray.io", "RayCluster")
    assert [(v.spec_path, v.identity, v.gpu_relevant) for v in found] == [
        ("spec.headGroupSpec.template.spec", "spec.headGroupSpec.template", False),
        (
            "spec.workerGroupSpecs[0].template.spec",
            "spec.workerGroupSpecs[name=gpu].template",
            True,
        ),
        # The autoscaler is a container of its own, named by its field.
        ("spec", "spec.autoscalerOptions", True),
    ]
    assert found[1].annotations == {"a": "b"}
    assert [c.path for c in found[2].containers] == ["spec.autoscalerOptions"]
    assert [p for p, _, _ in walk_templates(job, kind("ray.io", "RayCluster"))] == [
        "spec.headGroupSpec.template",
        "spec.workerGroupSpecs[0].template",
    ]


def test_a_workflow_template_inherits_pod_fields_and_names_where_they_are() -> None:
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "spec": {
            "hostNetwork": True,
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "templateDefaults": {"nodeSelector": {"pool": "a100"}},
            "templates": [
                {"name": "main", "steps": [[{"name": "s", "template": "train"}]]},
                {
                    "name": "train",
                    "podSpecPatch": "{}",
                    "volumes": [{"name": "own", "emptyDir": {}}],
                    "container": {"name": "main", "resources": GPU},
                },
            ],
        },
    }
    found = views(workflow, "argoproj.io", "Workflow")
    # The steps template runs no Pod; templateDefaults, with no containers, neither.
    assert [v.spec_path for v in found] == ["spec.templates[1]"]
    train = found[0]
    assert train.identity == "spec.templates[name=train]"
    assert train.field_path("hostNetwork") == "spec.hostNetwork"
    assert train.field_path("nodeSelector") == "spec.templateDefaults.nodeSelector"
    assert train.field_path("tolerations") == "spec.templates[1].tolerations"
    assert [v["name"] for v in train.spec["volumes"]] == ["own", "shared"]
    assert train.unjudged == (("spec.templates[1].podSpecPatch", "{}"),)
    assert [c.path for c in train.containers] == ["spec.templates[1].container"]


def test_resources_targets_pair_with_their_pod_fields() -> None:
    pipeline = {
        "apiVersion": "apps.nvidia.com/v1alpha1",
        "kind": "NIMPipeline",
        "spec": {
            "services": [
                {
                    "name": "llm",
                    "spec": {
                        "resources": GPU,
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    },
                },
                {"name": "embed", "spec": {"resources": {}}},
            ]
        },
    }
    found = views(pipeline, "apps.nvidia.com", "NIMPipeline")
    assert [(v.spec_path, v.identity) for v in found] == [
        (
            "spec.services[0].spec",
            "spec.services[name=llm].spec@spec.services[name=llm].spec",
        ),
        (
            "spec.services[1].spec",
            "spec.services[name=embed].spec@spec.services[name=embed].spec",
        ),
    ]
    llm = found[0]
    assert [c.resource_path("nvidia.com/gpu") for c in llm.gpu_containers] == [
        "spec.services[0].spec.resources.limits[nvidia.com/gpu]"
    ]
    assert llm.tolerations() == [{"key": "nvidia.com/gpu", "operator": "Exists"}]


def test_an_operator_host_path_field_is_on_the_view() -> None:
    service = {
        "apiVersion": "apps.nvidia.com/v1alpha1",
        "kind": "NIMService",
        "spec": {"resources": GPU, "storage": {"hostPath": "/var/lib/kubelet"}},
    }
    (view,) = views(service, "apps.nvidia.com", "NIMService")
    assert view.host_paths == (("spec.storage.hostPath", "/var/lib/kubelet"),)


def test_a_train_job_without_resources_judges_its_pod_fields_alone() -> None:
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "spec": {"podSpecOverrides": [{"targetJobs": [{"name": "node"}], "hostNetwork": True}]},
    }
    found = views(job, "trainer.kubeflow.org", "TrainJob")
    assert [(v.spec_path, v.containers) for v in found] == [("spec.podSpecOverrides[0]", ())]
    assert found[0].spec.get("hostNetwork") is True


@pytest.mark.parametrize(
    "malformed", [None, [], "text", {"spec": "text"}, {"spec": {"templates": {}}}]
)
def test_malformed_objects_give_no_views_and_no_error(malformed: Any) -> None:
    obj = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow"}
    if isinstance(malformed, dict):
        obj.update(malformed)
    else:
        obj["spec"] = malformed
    assert views(obj, "argoproj.io", "Workflow") == []
