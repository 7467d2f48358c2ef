"""The built-in catalogue of GPU workload kinds (webhook/policy/data/catalogue.yaml).

Every kind is judged on real-shaped samples: the real manifests of ../shared/conformance where
they exist, else the samples in tests/fixtures/catalogue, each written from the kind's
published API reference (its header names the source). A sample asks for a GPU in every place
its kind's catalogue entry judges; the test turns each of those requests into half a GPU and
expects a finding at each, and none elsewhere: every target is reached, at the right path.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conformance.corpus import CORPUS, requires_corpus
from tests.support.paths import REPO
from tests.test_engine_robustness import JSON_VALUES, field_paths
from webhook.admission.engine import review as engine_review
from webhook.admission.objects import decide_object
from webhook.cli.main import main
from webhook.policy.load import default_policy_path, load_policy
from webhook.policy.workloads import catalogue, catalogued_kinds

SAMPLES = REPO / "tests" / "fixtures" / "catalogue"
SHIPPED = [REPO / "policies" / "default.yaml", *sorted((REPO / "policies/examples").glob("*.yaml"))]
GPU = "nvidia.com/gpu"
RESOURCE_FIELDS = ("resources", "resourcesPerNode")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists"}


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text("utf-8")) if isinstance(d, dict)]


def samples() -> Iterator[tuple[str, dict]]:
    """(source, object) of every catalogued kind found in the samples and the corpus."""
    kinds = catalogued_kinds()
    paths = sorted(SAMPLES.glob("*.yaml"))
    if CORPUS.is_dir():
        paths += sorted(CORPUS.glob("*.yaml"))
    for path in paths:
        for index, obj in enumerate(documents(path)):
            group = str(obj.get("apiVersion", "")).rpartition("/")[0]
            if (group, obj.get("kind")) in kinds:
                yield f"{path.name}#{index}", obj


SAMPLE_OBJECTS = list(samples())


def gpu_requests(node: Any, path: str = "") -> Iterator[tuple[str, dict, str]]:
    """(field path, the limits/requests map, its key) of every GPU request in an object."""
    if isinstance(node, dict):
        for key, value in node.items():
            child = f"{path}.{key}" if path else key
            if key in RESOURCE_FIELDS and isinstance(value, dict):
                for where in ("limits", "requests"):
                    if isinstance(value.get(where), dict) and GPU in value[where]:
                        yield f"{child}.{where}[{GPU}]", value[where], GPU
            yield from gpu_requests(value, child)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from gpu_requests(item, f"{path}[{index}]")


def normalised(path: str) -> str:
    """Map keys as fields: the engine names a map's entries ``[Master]``, a walk ``.Master``."""
    return re.sub(r"\[(?!\d+\])([^\]]+)\]", r".\1", path)


# ---------------------------------------------------------------------------- the catalogue


def test_each_kind_is_catalogued_once_with_a_plural_resource() -> None:
    keys = [(e["group"], e["kind"]) for e in catalogue()]
    assert len(keys) == len(set(keys))
    for entry in catalogue():
        assert entry["resource"] == entry["resource"].lower() and entry["resource"].endswith("s")


def test_every_catalogued_kind_names_its_source() -> None:
    sources = yaml.safe_load((SAMPLES / "SOURCES.yaml").read_text("utf-8"))
    assert {(s["group"], s["kind"]) for s in sources} == catalogued_kinds()
    assert all(len(s["source"]["commit"]) == 40 for s in sources if "commit" in s["source"])


@requires_corpus
def test_every_catalogued_kind_has_a_sample() -> None:
    """Each kind is judged on at least one sample (the corpus adds more when present)."""
    seen = {(str(o["apiVersion"]).rpartition("/")[0], o["kind"]) for _, o in SAMPLE_OBJECTS}
    assert catalogued_kinds() - seen == set()


@pytest.mark.parametrize("policy_path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_policy_judges_the_whole_catalogue(policy_path: Path) -> None:
    policy = load_policy(policy_path)
    assert catalogued_kinds() <= set(policy.workloads)


# ------------------------------------------------------------------------- every target


@pytest.mark.parametrize(("source", "obj"), SAMPLE_OBJECTS, ids=[s for s, _ in SAMPLE_OBJECTS])
def test_every_gpu_request_of_a_sample_is_judged_where_it_is(source: str, obj: dict) -> None:
    policy = load_policy(default_policy_path())
    outcome = decide_object(obj, policy, "team-a")
    assert outcome.judged, outcome.skipped
    fixture = not source.startswith(tuple(p.name for p in CORPUS.glob("*.yaml")))
    if fixture:  # written to ask for whole GPUs in every target
        assert not [f for f in outcome.findings if f.rule == "gpu-quantity"]
    broken = copy.deepcopy(obj)
    places = []
    for path, requests, key in gpu_requests(broken):
        requests[key] = "0.5"
        places.append(normalised(path))
    if not places:
        # A real manifest without a GPU request (a CPU-only MPIJob, a DRA claim) is judged,
        # but cannot show its targets: the fixtures do, for every kind.
        assert not fixture, f"{source} asks for no GPU: it cannot show its targets are reached"
        return
    outcome = decide_object(broken, policy, "team-a")
    found = sorted(normalised(f.path) for f in outcome.findings if f.rule == "gpu-quantity")
    assert found == sorted(places)
    assert not outcome.allowed


PODLEVEL = sorted(SAMPLES.glob("*__podlevel*.yaml"))


@pytest.mark.parametrize("path", PODLEVEL, ids=lambda p: p.name)
def test_pod_level_fields_outside_a_template_are_judged(path: Path) -> None:
    """Each sample sets a forbidden pod-level field where its kind keeps it outside a pod
    template (an Argo Workflow's spec, a TrainJob override, a KServe component, NIMService's
    storage.hostPath): denied by a security rule, at that field."""
    policy = load_policy(default_policy_path())
    [obj] = documents(path)
    outcome = decide_object(obj, policy, "team-a")
    security = [f for f in outcome.denied if f.rule in ("host-devices", "host-access")]
    assert security, [f.violation.render() for f in outcome.findings]
    assert not outcome.allowed
    assert all(not f.path.startswith(("spec.containers", "spec.template.spec")) for f in security)


# ---------------------------------------------------------- the Volcano Job with 0.4 GPU

VOLCANO_JOB = {
    "apiVersion": "batch.volcano.sh/v1alpha1",
    "kind": "Job",
    "metadata": {"name": "fractional", "namespace": "team-a"},
    "spec": {
        "minAvailable": 1,
        "schedulerName": "volcano",
        "tasks": [
            {
                "name": "worker",
                "replicas": 1,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "cuda",
                                "image": "nvidia/cuda:12.4.0-base-ubuntu22.04",
                                "resources": {"limits": {GPU: 0.4}},
                            }
                        ],
                    }
                },
            }
        ],
    },
}


@pytest.mark.parametrize("policy_path", SHIPPED, ids=lambda p: p.name)
def test_a_volcano_job_asking_for_04_gpu_is_reported_under_every_shipped_policy(
    policy_path: Path,
) -> None:
    policy = load_policy(policy_path)
    outcome = decide_object(VOLCANO_JOB, policy, "team-a")
    [finding] = [f for f in outcome.findings if f.rule == "gpu-quantity"]
    assert (
        finding.path == "spec.tasks[0].template.spec.containers[0].resources.limits[nvidia.com/gpu]"
    )
    enforces = policy.rule_modes("team-a")["gpu-quantity"].gpu_pods == "Enforce"
    assert finding.mode == ("Enforce" if enforces else finding.mode)
    assert outcome.allowed is not enforces


def test_the_shipped_policies_include_ones_that_enforce_and_ones_that_do_not() -> None:
    modes = {p.name: load_policy(p).rule_modes("team-a")["gpu-quantity"].gpu_pods for p in SHIPPED}
    assert "Enforce" in modes.values() and set(modes.values()) - {"Enforce"}


# ------------------------------------------------------------------------- switching off


def test_a_kind_switched_off_is_skipped_and_named(tmp_path: Path, capsys) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: no-volcano}\nspec:\n  catalogue:\n    disabled:\n"
        "      - {group: batch.volcano.sh, kind: Job}\n"
    )
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(VOLCANO_JOB))
    assert main(["review", "-f", str(manifest), "--policy", str(policy)]) == 0
    out = capsys.readouterr().out
    assert "SKIPPED  Job/fractional" in out
    assert "Job (batch.volcano.sh) is not a workload this policy declares" in out


def test_switching_off_a_kind_the_catalogue_lacks_is_an_error(tmp_path: Path, capsys) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: typo}\nspec:\n  catalogue:\n    disabled:\n"
        "      - {group: batch.volcano.sh, kind: Jobs}\n"
    )
    assert main(["policy", "validate", str(policy)]) == 1
    assert "Jobs in group 'batch.volcano.sh' is not in the catalogue" in capsys.readouterr().out


def test_a_policy_redefines_a_catalogued_kind(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: own}\nspec:\n  workloads:\n"
        "    - {group: batch.volcano.sh, kind: Job, templates: ['spec.other[*].template']}\n"
    )
    workload = load_policy(policy).workloads[("batch.volcano.sh", "Job")]
    assert not workload.catalogued
    assert [t.path.text for t in workload.targets] == ["spec.other[*].template"]


# --------------------------------------------------------------------- malformed objects

# One seed per shape that walks more than a template: inline PodSpecs with inherited fields
# and unjudged ones (Argo), resources with pod fields elsewhere (Trainer, NIM), single
# containers inside an inline PodSpec (KServe).
SHAPE_SEEDS = [
    {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "w", "namespace": "team-a"},
        "spec": {
            "hostNetwork": True,
            "volumes": [{"name": "d", "hostPath": {"path": "/data"}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "templates": [
                {"name": "main", "steps": [[{"name": "a", "template": "gpu"}]]},
                {
                    "name": "gpu",
                    "podSpecPatch": "{}",
                    "volumes": [{"name": "s", "emptyDir": {}}],
                    "container": {"image": "x", "resources": {"limits": {GPU: 1}}},
                    "sidecars": [{"name": "s", "image": "y"}],
                    "containerSet": {"containers": [{"name": "c", "image": "z"}]},
                },
            ],
        },
    },
    {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t", "namespace": "team-a"},
        "spec": {
            "trainer": {
                "image": "x",
                "env": [{"name": "A", "value": "b"}],
                "resourcesPerNode": {"limits": {GPU: 1}},
            },
            "podSpecOverrides": [
                {
                    "targetJobs": [{"name": "node"}],
                    "volumes": [{"name": "d", "emptyDir": {}}],
                    "containers": [{"name": "node", "env": [{"name": "B", "value": "c"}]}],
                }
            ],
        },
    },
    {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "i", "namespace": "team-a"},
        "spec": {
            "predictor": {
                "nodeSelector": {"a": "b"},
                "model": {"modelFormat": {"name": "x"}, "resources": {"limits": {GPU: 1}}},
                "containers": [{"name": "extra", "image": "e"}],
                "workerSpec": {"containers": [{"name": "w", "resources": {"limits": {GPU: 1}}}]},
            }
        },
    },
    {
        "apiVersion": "apps.nvidia.com/v1alpha1",
        "kind": "NIMService",
        "metadata": {"name": "n", "namespace": "team-a"},
        "spec": {
            "image": {"repository": "r"},
            "resources": {"limits": {GPU: 1}},
            "tolerations": [{"key": "k", "operator": "Exists"}],
        },
    },
]


SEED_PATHS = [(i, p) for i, seed in enumerate(SHAPE_SEEDS) for p in field_paths(seed)[1:]]


def test_the_shape_seeds_are_judged() -> None:
    policy = load_policy(default_policy_path())
    for seed in SHAPE_SEEDS:
        assert decide_object(seed, policy, "team-a").judged


@settings(derandomize=True, max_examples=300, deadline=None)
@given(where=st.sampled_from(SEED_PATHS), value=JSON_VALUES)
def test_any_field_of_a_catalogued_kind_replaced_by_any_json_value_is_judged(where, value):
    index, path = where
    obj = copy.deepcopy(SHAPE_SEEDS[index])
    node = obj
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    seed = SHAPE_SEEDS[index]  # the request's kind is the envelope's, whatever the object says
    group, _, version = seed["apiVersion"].rpartition("/")
    for policy_path in SHIPPED[:2]:
        policy = load_policy(policy_path)
        for operation in ("CREATE", "UPDATE"):
            request = {
                "uid": "u",
                "kind": {"group": group, "version": version, "kind": seed["kind"]},
                "operation": operation,
                "namespace": "team-a",
                "object": obj,
            }
            if operation == "UPDATE":
                request["oldObject"] = SHAPE_SEEDS[index]
            review = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": request,
            }
            for mutate in (False, True):
                response = engine_review(review, policy, mutate=mutate)
                assert response["response"]["uid"] == "u"


@pytest.mark.parametrize(
    "obj",
    [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "t", "namespace": "team-a"},
            "spec": {
                "runtimeRef": {"name": "torch"},  # the GPUs come from the runtime
                "runtimePatches": [
                    {
                        "trainingRuntimeSpec": {
                            "template": {
                                "spec": {
                                    "replicatedJobs": [
                                        {
                                            "name": "node",
                                            "template": {
                                                "spec": {
                                                    "template": {
                                                        "spec": {
                                                            "hostPID": True,
                                                            "tolerations": [GPU_TOLERATION],
                                                            "containers": [{"name": "node"}],
                                                        }
                                                    }
                                                }
                                            },
                                        }
                                    ]
                                }
                            }
                        }
                    }
                ],
            },
        },
        {
            "apiVersion": "apps.nvidia.com/v1alpha1",
            "kind": "NIMService",
            "metadata": {"name": "n", "namespace": "team-a"},
            "spec": {
                "image": {"repository": "r"},
                "storage": {"hostPath": "/"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            },
        },
    ],
    ids=["trainjob-without-resources", "nimservice-without-resources"],
)
def test_pod_fields_are_judged_without_the_resources(obj: dict) -> None:
    outcome = decide_object(obj, load_policy(default_policy_path()), "team-a")
    assert {f.rule for f in outcome.denied} & {"host-access", "host-devices"}


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        (
            {
                "apiVersion": "serving.kserve.io/v1beta1",
                "kind": "InferenceService",
                "metadata": {"name": "i", "namespace": "team-a"},
                "spec": {
                    "predictor": {
                        "annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"},
                        "model": {"modelFormat": {"name": "x"}, "resources": {"limits": {GPU: 1}}},
                    }
                },
            },
            "spec.predictor.annotations[cdi.k8s.io/gpu]",
        ),
        (
            {
                "apiVersion": "apps.nvidia.com/v1alpha1",
                "kind": "NIMService",
                "metadata": {"name": "n", "namespace": "team-a"},
                "spec": {
                    "annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"},
                    "resources": {"limits": {GPU: 1}},
                },
            },
            "spec.annotations[cdi.k8s.io/gpu]",
        ),
    ],
    ids=["kserve-component", "nimservice"],
)
def test_pod_annotations_written_outside_metadata_are_judged(obj: dict, path: str) -> None:
    outcome = decide_object(obj, load_policy(default_policy_path()), "team-a")
    assert [f.path for f in outcome.denied if f.rule == "device-visibility"] == [path]


def test_argo_template_defaults_reach_every_template() -> None:
    """The controller merges templateDefaults into each template: its pod-level fields are
    judged with every template that runs a Pod, at their own path."""
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "w", "namespace": "team-a"},
        "spec": {
            "templateDefaults": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            "templates": [
                {"name": "main", "steps": [[{"name": "a", "template": "gpu"}]]},
                {"name": "gpu", "container": {"image": "x", "resources": {"limits": {GPU: 1}}}},
            ],
        },
    }
    outcome = decide_object(workflow, load_policy(default_policy_path()), "team-a")
    assert [f.path for f in outcome.denied] == ["spec.templateDefaults.volumes[0].hostPath.path"]
