"""The policy's GPU defaults on the mutate path (``spec.mutation.gpuDefaults``, the pools'
classes): ``webhook.decide(review, policy, mutate=True)``.

Every patch is decoded from the response, checked to be add-only, applied with the
``jsonpatch`` library AND with ``kubectl patch --local``, the two results compared, the result
validated against the Kubernetes 1.32 schema (a workload's templates as Pods too, with the API
server's semantic rules), and mutated again, which must plan nothing (idempotence).
"""

from __future__ import annotations

import copy
import json
import shutil
import textwrap
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

import webhook
from tests.patching import (
    DEFAULT_DOC,
    K8S_VERSION,
    POOLS_DOC,
    apply_both,
    assert_add_only,
    decide,
    decode_patch,
    policy_from,
    review,
    validate_pod,
)
from tests.serving import answers as served
from tests.serving import tls_server
from tests.support.paths import REPO
from webhook.admission.objects import decide_object
from webhook.cli.main import main
from webhook.policy.model import INJECTED_ANNOTATION

GPU_DEFAULTS = {
    "runtimeClassName": "nvidia-cdi",
    "priorityClassName": "gpu-batch",
    "activeDeadlineSeconds": {"barePods": 28800, "jobs": 604800},
    "sharedMemory": {"enabled": True, "sizeLimit": "16Gi"},
}
WEBHOOKS = REPO / "manifests" / "webhooks"
SHM_VOLUME = {"name": "gpu-admission-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
SHM_MOUNT = {"name": "gpu-admission-shm", "mountPath": "/dev/shm"}
# The built-in kinds whose Pods end: the only ones given a deadline.
ENDING_KINDS = ("Job", "CronJob")
LONG_RUNNING_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")
BUILT_IN_KINDS = (*LONG_RUNNING_KINDS, *ENDING_KINDS)
API_VERSIONS = {
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "ReplicaSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
    "PyTorchJob": "kubeflow.org/v1",
}


def with_defaults(base: dict, **gpu_defaults: Any) -> webhook.Policy:
    return policy_from(base, mutation={"enabled": True, "gpuDefaults": gpu_defaults})


DEFAULTS = with_defaults(DEFAULT_DOC, **GPU_DEFAULTS)
NO_DEFAULTS = webhook.load_policy(webhook.default_policy_path())


def pools_doc(**classes: dict[str, str]) -> dict:
    """The test pool policy with ``classes`` (pool name -> its classes) set on its pools."""
    doc = copy.deepcopy(POOLS_DOC)
    for pool in doc["spec"]["pools"]:
        pool.update(classes.get(pool["name"], {}))
    return doc


# --- Objects ------------------------------------------------------------------------------


def container(name: str = "main", gpus: str | None = "1", **fields: Any) -> dict:
    out = {"name": name, "image": "registry.example.com/train:1", **fields}
    if gpus is not None:
        out["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return out


def pod(*containers: dict, metadata: dict | None = None) -> dict:
    """A bare Pod of ``containers`` (one GPU container when none is given)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "notebook", "namespace": "ml", **(metadata or {})},
        "spec": {"restartPolicy": "Never", "containers": list(containers or [container()])},
    }


def template(*containers: dict, restart: str = "Always", **spec: Any) -> dict:
    return {
        "metadata": {"labels": {"app": "train"}},
        "spec": {"restartPolicy": restart, "containers": list(containers or [container()]), **spec},
    }


def workload(kind: str, *containers: dict, metadata: dict | None = None, **spec: Any) -> dict:
    """A workload of ``kind`` whose one pod template holds ``containers`` (one GPU container
    when none is given) and ``spec``'s pod-level fields."""
    ending = kind in ENDING_KINDS
    pods = template(*containers, restart="Never" if ending else "Always", **spec)
    selector = {"matchLabels": {"app": "train"}}
    body: dict[str, Any]
    if kind == "Job":
        body = {"template": pods}
    elif kind == "CronJob":
        body = {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": pods}}}
    elif kind == "StatefulSet":
        body = {"selector": selector, "serviceName": "train", "template": pods}
    else:
        body = {"selector": selector, "template": pods}
    return {
        "apiVersion": API_VERSIONS[kind],
        "kind": kind,
        "metadata": {"name": "train", "namespace": "ml", **(metadata or {})},
        "spec": body,
    }


def pod_spec_of(obj: dict) -> dict:
    """The pod spec of a workload's one template."""
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def controlled_by(kind: str) -> dict:
    return {
        "ownerReferences": [
            {
                "apiVersion": "apps/v1" if kind == "Deployment" else "batch/v1",
                "kind": kind,
                "name": "owner",
                "uid": "6f1c2a4e-0d2b-4c1e-9a7b-3f5e8d9c0b1a",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    }


# --- Checking a patch ---------------------------------------------------------------------


def validate(obj: dict) -> None:
    """A valid 1.32 object; a workload's templates are valid Pods as well."""
    if obj["kind"] == "Pod":
        validate_pod(obj)
        return
    if obj["kind"] in BUILT_IN_KINDS:
        try:
            kubernetes_validate.validate(copy.deepcopy(obj), K8S_VERSION, strict=True)
        except jsonschema.ValidationError as err:
            where = ".".join(str(p) for p in err.absolute_path) or "(object)"
            raise AssertionError(f"not a valid {obj['kind']}: {where}: {err.message}") from None
        spec = pod_spec_of(obj)
        validate_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})


def mutate(obj: dict, policy: webhook.Policy, **kwargs: Any) -> tuple[list[dict], dict]:
    """The mutate path's patch for ``obj`` and the patched object, after every check."""
    kind = obj["kind"]
    validate(obj)
    decision = decide(obj, policy, kind=kind, **kwargs)
    assert decision.allowed, decision.response
    ops = decode_patch(decision)
    if not ops:
        assert not decision.patch
        return [], obj
    assert_add_only(ops)
    assert ops == json.loads(json.dumps(list(decision.patch)))
    patched = apply_both(obj, ops)
    validate(patched)
    again = decide(patched, policy, kind=kind, **kwargs)
    assert again.allowed
    assert decode_patch(again) == [], "defaulting the defaulted object must plan nothing"
    return ops, patched


def injected(obj: dict) -> list[str]:
    return obj["metadata"]["annotations"][INJECTED_ANNOTATION].split(",")


def paths(ops: list[dict]) -> list[str]:
    return [op["path"] for op in ops]


# --- Workload templates: runtimeClassName and priorityClassName ----------------------------


def test_a_deployment_template_that_requests_a_gpu_gets_both_classes_and_the_record():
    ops, patched = mutate(workload("Deployment"), DEFAULTS)
    assert ops == [
        {"op": "add", "path": "/spec/template/spec/runtimeClassName", "value": "nvidia-cdi"},
        {"op": "add", "path": "/spec/template/spec/priorityClassName", "value": "gpu-batch"},
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {INJECTED_ANNOTATION: "runtime-class=nvidia-cdi,priority-class=gpu-batch"},
        },
    ]
    # Never a deadline on a long-running controller, nor shared memory in a template: the
    # Pods get that when they are created.
    assert "activeDeadlineSeconds" not in patched["spec"]
    assert "volumes" not in pod_spec_of(patched)


@pytest.mark.parametrize("kind", BUILT_IN_KINDS)
def test_every_built_in_kind_with_a_pod_template_gets_the_classes(kind):
    _, patched = mutate(workload(kind), DEFAULTS)
    spec = pod_spec_of(patched)
    assert (spec["runtimeClassName"], spec["priorityClassName"]) == ("nvidia-cdi", "gpu-batch")
    assert injected(patched)[:2] == ["runtime-class=nvidia-cdi", "priority-class=gpu-batch"]


def test_a_bare_pod_never_gets_a_runtime_or_priority_class():
    """The RuntimeClass and Priority admission plugins ran before the webhook: on a Pod a
    class can only be required, never added."""
    _, patched = mutate(pod(container(gpus="2")), DEFAULTS)
    assert "runtimeClassName" not in patched["spec"]
    assert "priorityClassName" not in patched["spec"]
    assert not any(i.startswith(("runtime-class", "priority-class")) for i in injected(patched))


def test_a_template_that_names_its_own_classes_keeps_them():
    obj = workload("Deployment", runtimeClassName="kata-nvidia", priorityClassName="mine")
    ops, _ = mutate(obj, DEFAULTS)
    assert ops == []


@pytest.mark.parametrize(
    ("written", "added"),
    [
        ({"runtimeClassName": None}, ["runtimeClassName", "priorityClassName"]),
        ({"priorityClassName": ""}, ["runtimeClassName", "priorityClassName"]),
        ({"runtimeClassName": "kata-nvidia"}, ["priorityClassName"]),
        ({"priorityClassName": "mine"}, ["runtimeClassName"]),
    ],
    ids=["null-runtime", "empty-priority", "own-runtime", "own-priority"],
)
def test_only_the_class_a_template_leaves_unset_is_added(written, added):
    """null (and "" for priorityClassName, which the API omits) is no class."""
    obj = workload("Deployment", **written)
    ops, patched = mutate(obj, DEFAULTS)
    assert [p.rsplit("/", 1)[1] for p in paths(ops)[:-1]] == added
    for name, value in written.items():
        if value:
            assert pod_spec_of(patched)[name] == value


@pytest.mark.parametrize("resources", [None, {"cpu": "1"}, {"nvidia.com/gpu": "0"}])
def test_a_template_that_requests_no_gpu_gets_nothing(resources):
    obj = workload("Deployment", container(gpus=None))
    if resources:
        obj["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": resources}
    assert mutate(obj, DEFAULTS)[0] == []


def test_only_the_gpu_templates_of_a_catalogued_kind_get_the_classes():
    """A JobSet's replicated Jobs: the GPU workers get the classes, the CPU coordinator not."""
    jobs = [
        ("coordinator", template(container(gpus=None), restart="Never")),
        ("workers", template(container(gpus="8"), restart="Never")),
    ]
    obj = {
        "apiVersion": API_VERSIONS["JobSet"],
        "kind": "JobSet",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "replicatedJobs": [
                {"name": name, "replicas": 1, "template": {"spec": {"template": pods}}}
                for name, pods in jobs
            ]
        },
    }
    ops, patched = mutate(obj, DEFAULTS)
    assert paths(ops) == [
        "/spec/replicatedJobs/1/template/spec/template/spec/runtimeClassName",
        "/spec/replicatedJobs/1/template/spec/template/spec/priorityClassName",
        "/metadata/annotations",
    ]
    coordinator = patched["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "runtimeClassName" not in coordinator
    # A JobSet is no batch/v1 Job: its own deadline is its operator's business.
    assert "activeDeadlineSeconds" not in json.dumps(patched)


def test_each_template_of_a_pytorchjob_keyed_by_replica_type_is_patched_where_it_is():
    replicas = {
        kind: {"replicas": 1, "template": template(container(gpus="4"), restart="OnFailure")}
        for kind in ("Master", "Worker")
    }
    obj = {
        "apiVersion": API_VERSIONS["PyTorchJob"],
        "kind": "PyTorchJob",
        "metadata": {"name": "ddp", "namespace": "ml"},
        "spec": {"pytorchReplicaSpecs": replicas},
    }
    ops, patched = mutate(obj, with_defaults(DEFAULT_DOC, runtimeClassName="nvidia-cdi"))
    assert paths(ops) == [
        "/spec/pytorchReplicaSpecs/Master/template/spec/runtimeClassName",
        "/spec/pytorchReplicaSpecs/Worker/template/spec/runtimeClassName",
        "/metadata/annotations",
    ]
    assert injected(patched) == ["runtime-class=nvidia-cdi"]


@pytest.mark.parametrize(
    ("kind", "owner"), [("ReplicaSet", "Deployment"), ("Job", "CronJob"), ("Pod", "Job")]
)
def test_an_object_a_controller_owns_is_left_to_its_owner(kind, owner):
    """A ReplicaSet whose template no longer matched its Deployment's would have the
    Deployment make ReplicaSets without end; a CronJob's Job gets its deadline from the
    CronJob; a Job's Pod is no interactive session."""
    if kind == "Pod":
        obj = pod(container(gpus="1"), metadata=controlled_by(owner))
        ops, patched = mutate(obj, DEFAULTS)
        assert "activeDeadlineSeconds" not in patched["spec"]
        assert ops  # its tolerations still
    else:
        assert mutate(workload(kind, metadata=controlled_by(owner)), DEFAULTS)[0] == []


def test_an_owner_that_is_no_controller_does_not_count():
    owners = controlled_by("Deployment")
    owners["ownerReferences"][0]["controller"] = False
    _, patched = mutate(workload("ReplicaSet", metadata=owners), DEFAULTS)
    assert pod_spec_of(patched)["runtimeClassName"] == "nvidia-cdi"


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE"])
def test_a_workload_is_given_its_defaults_on_create_only(operation):
    """A Job's template is immutable, and one changed on an unrelated update would restart a
    Deployment's Pods."""
    obj = workload("Deployment")
    decision = decide(obj, DEFAULTS, kind="Deployment", operation=operation, old=obj)
    assert decision.allowed and decode_patch(decision) == [] and not decision.patch


def test_without_gpu_defaults_no_workload_is_patched():
    for kind in BUILT_IN_KINDS:
        assert mutate(workload(kind), NO_DEFAULTS)[0] == []


def test_mutation_disabled_adds_no_default():
    doc = copy.deepcopy(DEFAULT_DOC)
    doc["spec"]["mutation"] = {"enabled": False, "gpuDefaults": GPU_DEFAULTS}
    policy = webhook.parse_policy(json.dumps(doc), source="<test>")
    assert mutate(workload("Job"), policy)[0] == []
    assert mutate(pod(container(gpus="2")), policy)[0] == []


def test_record_mode_records_a_workloads_defaults_without_applying_them():
    doc = copy.deepcopy(DEFAULT_DOC)
    doc["spec"]["mutation"] = {"enabled": True, "mode": "Record", "gpuDefaults": GPU_DEFAULTS}
    policy = webhook.parse_policy(json.dumps(doc), source="<test>")
    decision = decide(workload("Job"), policy, kind="Job")
    response = decision.response["response"]
    assert "patch" not in response and decision.patch_recorded
    recorded = json.loads(response["auditAnnotations"]["would-patch"])
    assert recorded == decode_patch(decide(workload("Job"), DEFAULTS, kind="Job"))


# --- Classes per pool ---------------------------------------------------------------------


def test_a_pools_priority_class_wins_for_the_templates_whose_pods_land_there():
    policy = with_defaults(
        pools_doc(training={"priorityClassName": "training-high"}),
        priorityClassName="gpu-batch",
    )
    training = workload("Job", container(gpus="8"))
    mig = workload("Job", container(gpus=None, resources={"limits": {"nvidia.com/mig-3g.40gb": 1}}))
    _, patched = mutate(training, policy)
    assert pod_spec_of(patched)["priorityClassName"] == "training-high"
    assert injected(patched) == ["priority-class=training-high"]
    # A pool without a class of its own: the policy's.
    _, patched = mutate(mig, policy)
    assert pod_spec_of(patched)["priorityClassName"] == "gpu-batch"


def test_a_template_that_may_land_in_pools_with_different_classes_gets_none():
    """nvidia.com/mig-1g.10gb is offered by the mig pool and, for research, by restricted."""
    policy = with_defaults(
        pools_doc(restricted={"priorityClassName": "research-high"}),
        priorityClassName="gpu-batch",
    )
    mig = container(gpus=None, resources={"limits": {"nvidia.com/mig-1g.10gb": 1}})
    assert mutate(workload("Deployment", mig), policy, namespace="research")[0] == []
    _, patched = mutate(workload("Deployment", mig), policy, namespace="ml")
    assert pod_spec_of(patched)["priorityClassName"] == "gpu-batch"
    # Pinned to one pool by the pool annotation: that pool's class.
    pinned = workload("Deployment", mig)
    pinned["spec"]["template"]["metadata"]["annotations"] = {"gpu-admission.io/pool": "restricted"}
    _, patched = mutate(pinned, policy, namespace="research")
    assert pod_spec_of(patched)["priorityClassName"] == "research-high"


def test_a_pools_runtime_class_without_a_policy_wide_one():
    """Only the pool that needs one (Kata's confidential GPUs, say) names it."""
    policy = policy_from(
        pools_doc(training={"runtimeClassName": "kata-qemu-nvidia-gpu"}),
        mutation={"enabled": True},
    )
    _, patched = mutate(workload("StatefulSet", container(gpus="1")), policy)
    assert pod_spec_of(patched)["runtimeClassName"] == "kata-qemu-nvidia-gpu"
    shared = container(gpus=None, resources={"limits": {"nvidia.com/gpu.shared": 1}})
    assert mutate(workload("StatefulSet", shared), policy, namespace="ml")[0] == []


# --- activeDeadlineSeconds ----------------------------------------------------------------


def test_a_bare_gpu_pod_gets_the_interactive_deadline():
    ops, patched = mutate(pod(), DEFAULTS)
    assert {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 28800} in ops
    assert patched["spec"]["activeDeadlineSeconds"] == 28800
    assert "active-deadline=28800" in injected(patched)


@pytest.mark.parametrize("written", [60, 999999])
def test_a_deadline_already_set_is_never_changed(written):
    obj = pod()
    obj["spec"]["activeDeadlineSeconds"] = written
    ops, patched = mutate(obj, DEFAULTS)
    assert patched["spec"]["activeDeadlineSeconds"] == written
    assert "/spec/activeDeadlineSeconds" not in paths(ops)


def test_a_pod_without_a_gpu_gets_no_deadline():
    assert mutate(pod(container(gpus=None)), DEFAULTS)[0] == []


def test_a_job_gets_the_deadline_on_the_job_not_on_its_template():
    ops, patched = mutate(workload("Job"), DEFAULTS)
    assert {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 604800} in ops
    assert "activeDeadlineSeconds" not in pod_spec_of(patched)
    assert injected(patched)[-1] == "active-deadline=604800"


def test_a_cronjob_gets_the_deadline_in_its_job_template():
    ops, patched = mutate(workload("CronJob"), DEFAULTS)
    assert patched["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 604800
    assert "activeDeadlineSeconds" not in patched["spec"]
    assert "activeDeadlineSeconds" not in pod_spec_of(patched)
    assert "/spec/jobTemplate/spec/activeDeadlineSeconds" in paths(ops)


@pytest.mark.parametrize("kind", LONG_RUNNING_KINDS)
def test_a_long_running_controller_never_gets_a_deadline(kind):
    """Its Pods would be killed at the deadline and recreated, forever."""
    _, patched = mutate(workload(kind, container(gpus="2")), DEFAULTS)
    assert "activeDeadlineSeconds" not in json.dumps(patched)


def test_a_job_with_its_own_deadline_or_without_a_gpu_keeps_what_it_has():
    obj = workload("Job")
    obj["spec"]["activeDeadlineSeconds"] = 120
    _, patched = mutate(obj, DEFAULTS)
    assert patched["spec"]["activeDeadlineSeconds"] == 120
    assert mutate(workload("Job", container(gpus=None)), DEFAULTS)[0] == []


def test_each_deadline_is_off_unless_set():
    pods_only = with_defaults(DEFAULT_DOC, activeDeadlineSeconds={"barePods": 3600})
    assert mutate(workload("Job"), pods_only)[0] == []
    assert mutate(pod(), pods_only)[1]["spec"]["activeDeadlineSeconds"] == 3600
    jobs_only = with_defaults(DEFAULT_DOC, activeDeadlineSeconds={"jobs": 86400})
    assert "activeDeadlineSeconds" not in mutate(pod(), jobs_only)[1]["spec"]
    _, patched = mutate(workload("Job"), jobs_only)
    assert patched["spec"]["activeDeadlineSeconds"] == 86400
    assert "runtimeClassName" not in pod_spec_of(patched)


# --- /dev/shm -----------------------------------------------------------------------------


def test_a_two_gpu_pod_gets_one_shared_memory_in_every_container():
    """The runtime gives a Pod's containers one /dev/shm: a sidecar that stages data there
    keeps sharing it with the GPU container."""
    obj = pod(container("train", gpus="2"), container("logs", gpus=None))
    ops, patched = mutate(obj, DEFAULTS)
    assert {"op": "add", "path": "/spec/volumes", "value": [SHM_VOLUME]} in ops
    assert {"op": "add", "path": "/spec/containers/0/volumeMounts", "value": [SHM_MOUNT]} in ops
    assert patched["spec"]["containers"][1]["volumeMounts"] == [SHM_MOUNT]
    assert "dev-shm=2" in injected(patched)


def test_time_sliced_replicas_are_one_gpu_and_mps_brings_its_own_shared_memory():
    """Replicas share one GPU's time; MPS's device plugin mounts its daemon's shared memory at
    /dev/shm, which a volume would hide."""
    doc = copy.deepcopy(DEFAULT_DOC)
    doc["spec"]["resources"] = [
        *doc["spec"].get("resources", []),
        {"name": "nvidia.com/gpu.mps", "sharing": "MPS"},
    ]
    shared = policy_from(doc, mutation={"enabled": True, "gpuDefaults": GPU_DEFAULTS})
    for name in ("nvidia.com/gpu.shared", "nvidia.com/gpu.mps"):
        obj = pod(
            container("a", gpus=None, resources={"limits": {name: "1"}}),
            container("b", gpus=None, resources={"limits": {name: "1"}}),
        )
        ops, _ = mutate(obj, shared)
        assert not any(op["path"] == "/spec/volumes" for op in ops), name


def test_a_block_device_or_a_subpath_at_dev_shm_is_left_alone():
    obj = pod(container("train", gpus="2"), container("raw", gpus=None))
    obj["spec"]["containers"][1]["volumeDevices"] = [{"name": "disk", "devicePath": "/dev//shm"}]
    ops, patched = mutate(obj, DEFAULTS)
    assert "volumeMounts" not in patched["spec"]["containers"][1]
    validate_pod(patched)


def test_a_windows_pod_gets_no_memory_backed_volume():
    obj = pod(container("train", gpus="2"))
    obj["spec"]["os"] = {"name": "windows"}
    ops, _ = mutate(obj, DEFAULTS)
    assert not any(op["path"] == "/spec/volumes" for op in ops)


def test_two_containers_of_one_gpu_each_share_one_volume():
    obj = pod(container("rank0"), container("rank1"))
    obj["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    obj["spec"]["containers"][1]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    ops, patched = mutate(obj, DEFAULTS)
    assert patched["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}, SHM_VOLUME]
    assert patched["spec"]["containers"][0]["volumeMounts"] == [SHM_MOUNT]
    assert patched["spec"]["containers"][1]["volumeMounts"][-1] == SHM_MOUNT
    assert "/spec/containers/1/volumeMounts/-" in paths(ops)
    assert "dev-shm=2" in injected(patched)


def test_a_pod_of_one_gpu_gets_no_shared_memory():
    _, patched = mutate(pod(container(gpus="1"), container("cpu", gpus=None)), DEFAULTS)
    assert "volumes" not in patched["spec"]
    assert not any("volumeMounts" in c for c in patched["spec"]["containers"])


def test_gpus_are_counted_as_the_scheduler_counts_them():
    """An init container's GPUs are freed before the app containers start: two init
    containers of one GPU each and one app container of one make a Pod of one GPU."""
    obj = pod(container("app"))
    obj["spec"]["initContainers"] = [container("fetch"), container("warm")]
    _, patched = mutate(obj, DEFAULTS)
    assert "volumes" not in patched["spec"]
    obj["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    _, patched = mutate(obj, DEFAULTS)
    assert [c.get("volumeMounts") for c in patched["spec"]["initContainers"]] == [
        [SHM_MOUNT],
        [SHM_MOUNT],
    ]
    assert patched["spec"]["containers"][0]["volumeMounts"] == [SHM_MOUNT]


@pytest.mark.parametrize("mount_path", ["/dev/shm", "/dev/shm/"])
@pytest.mark.parametrize(
    "volume",
    [{"emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}, {"hostPath": {"path": "/dev/shm"}}],
    ids=["memory", "host"],
)
def test_a_container_that_mounts_something_at_dev_shm_keeps_it(mount_path, volume):
    obj = pod(container("a", gpus="2"))
    obj["spec"]["volumes"] = [{"name": "dshm", **volume}]
    obj["spec"]["containers"][0]["volumeMounts"] = [{"name": "dshm", "mountPath": mount_path}]
    ops, patched = mutate(obj, DEFAULTS)
    assert patched["spec"]["volumes"] == obj["spec"]["volumes"]
    assert patched["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "dshm", "mountPath": mount_path}
    ]
    assert not any("dev-shm" in i for i in injected(patched))


def test_a_memory_volume_another_container_mounts_at_dev_shm_is_shared_with_the_rest():
    """Processes in different containers need the same shared memory: NCCL's transport."""
    obj = pod(container("rank0"), container("rank1"))
    obj["spec"]["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    obj["spec"]["containers"][0]["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    ops, patched = mutate(obj, DEFAULTS)
    assert patched["spec"]["volumes"] == obj["spec"]["volumes"]
    assert patched["spec"]["containers"][1]["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"}
    ]
    assert "dev-shm=1" in injected(patched)


@pytest.mark.parametrize(
    ("taken", "name"),
    [
        (["gpu-admission-shm"], "gpu-admission-shm-1"),
        (["gpu-admission-shm", "gpu-admission-shm-1"], "gpu-admission-shm-2"),
    ],
)
def test_a_taken_volume_name_is_never_clobbered(taken, name):
    obj = pod(container(gpus="2"))
    obj["spec"]["volumes"] = [{"name": n, "configMap": {"name": "settings"}} for n in taken]
    ops, patched = mutate(obj, DEFAULTS)
    assert patched["spec"]["volumes"][: len(taken)] == obj["spec"]["volumes"]
    assert patched["spec"]["volumes"][-1] == {**SHM_VOLUME, "name": name}
    assert patched["spec"]["containers"][0]["volumeMounts"] == [{**SHM_MOUNT, "name": name}]


def test_a_memory_volume_of_the_name_nobody_mounts_is_used_not_added_again():
    """What the webhook added before (a later webhook added the container): used again."""
    obj = pod(container(gpus="2"))
    obj["spec"]["volumes"] = [{"name": "gpu-admission-shm", "emptyDir": {"medium": "Memory"}}]
    ops, patched = mutate(obj, DEFAULTS)
    assert patched["spec"]["volumes"] == obj["spec"]["volumes"]
    assert patched["spec"]["containers"][0]["volumeMounts"] == [SHM_MOUNT]


def test_shared_memory_without_a_size_limit_and_off_by_default():
    policy = with_defaults(DEFAULT_DOC, sharedMemory={"enabled": True})
    ops, patched = mutate(pod(container(gpus="4")), policy)
    assert patched["spec"]["volumes"] == [
        {"name": "gpu-admission-shm", "emptyDir": {"medium": "Memory"}}
    ]
    assert "activeDeadlineSeconds" not in patched["spec"]
    for off in (NO_DEFAULTS, with_defaults(DEFAULT_DOC, sharedMemory={"enabled": False})):
        _, patched = mutate(pod(container(gpus="4")), off)
        assert "volumes" not in patched["spec"]


def test_a_pod_made_from_a_defaulted_template_gets_its_pod_defaults_only():
    """The controller's Pod: shared memory, no deadline (a controller owns it), and the
    classes it already has from its template are not added again."""
    _, deployment = mutate(workload("Deployment", container(gpus="2")), DEFAULTS)
    made = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train-abc", "namespace": "ml", **controlled_by("Deployment")},
        "spec": copy.deepcopy(pod_spec_of(deployment)),
    }
    ops, patched = mutate(made, DEFAULTS)
    assert "activeDeadlineSeconds" not in patched["spec"]
    assert patched["spec"]["runtimeClassName"] == "nvidia-cdi"
    assert not [p for p in paths(ops) if p.endswith(("ClassName", "activeDeadlineSeconds"))]
    assert patched["spec"]["containers"][0]["volumeMounts"] == [SHM_MOUNT]


# --- review and audit ---------------------------------------------------------------------


def test_review_shows_the_workloads_own_defaults_then_what_its_pods_get():
    obj = workload("Job", container(gpus="2"))
    outcome = decide_object(obj, DEFAULTS, "ml", mutate=True)
    own, pods = outcome.mutations
    assert own.workload and own.template_path == "" and own.original == obj
    assert pod_spec_of(own.mutated)["runtimeClassName"] == "nvidia-cdi"
    assert not pods.workload and pods.template_path == "spec.template"
    # The Pods are made from the defaulted template, by the Job: no bare Pods, no deadline.
    assert pods.mutated["spec"]["runtimeClassName"] == "nvidia-cdi"
    assert pods.mutated["spec"]["volumes"] == [SHM_VOLUME]
    assert "activeDeadlineSeconds" not in pods.mutated["spec"]
    [owner] = pods.mutated["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Job", "train", True)
    assert outcome.allowed


# --- The policy: schema, lint, validate --manifests ------------------------------------------


def policy_text(gpu_defaults: str, *, enabled: str = "true", pool: str = "") -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: gpu-admission.io/v1alpha1
        kind: GPUAdmissionPolicy
        metadata: {{name: defaults}}
        spec:
          gpuNodeTaints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
          pools:
            - name: training
              nodeSelector: {{pool: training}}
              resources: [{{name: nvidia.com/gpu, sharing: Exclusive}}]
              taints: [{{key: pool, value: training, effect: NoSchedule}}]
              {pool}
          mutation:
            enabled: {enabled}
            gpuDefaults: {gpu_defaults}
        """
    )


def refusal(text: str) -> str:
    with pytest.raises(webhook.PolicyError) as info:
        webhook.parse_policy(text, source="p.yaml")
    return "\n".join(info.value.errors)


@pytest.mark.parametrize(
    ("gpu_defaults", "fragment"),
    [
        ("{runtimeClassName: Nvidia_CDI}", "gpuDefaults.runtimeClassName"),
        ("{priorityClassName: -gpu}", "gpuDefaults.priorityClassName"),
        ("{activeDeadlineSeconds: {barePods: 0}}", "barePods"),
        ("{activeDeadlineSeconds: {}}", "activeDeadlineSeconds"),
        ("{activeDeadlineSeconds: {pods: 60}}", "pods"),
        ("{sharedMemory: {sizeLimit: 1Gi}}", "'enabled' is a required property"),
        ("{sharedMemory: {enabled: true, sizeLimit: 16 Gi}}", "sizeLimit"),
    ],
)
def test_a_setting_the_api_server_would_refuse_is_a_schema_error(gpu_defaults, fragment):
    message = refusal(policy_text(gpu_defaults))
    assert "p.yaml:" in message and fragment in message


@pytest.mark.parametrize(
    ("gpu_defaults", "pool", "fragment"),
    [
        (
            "{priorityClassName: system-gpu}",
            "",
            "spec.mutation.gpuDefaults.priorityClassName: 'system-gpu': the API server refuses "
            "PriorityClasses named system-*",
        ),
        (
            "{}",
            "priorityClassName: system-high",
            "spec.pools[0].priorityClassName: 'system-high'",
        ),
        (
            "{sharedMemory: {enabled: true, sizeLimit: 16m}}",
            "",
            "'16m' is not a whole number of bytes (0.016: m means milli); write Mi or Gi",
        ),
        ("{sharedMemory: {enabled: true, sizeLimit: '0'}}", "", "'0' is no size"),
    ],
)
def test_a_setting_that_cannot_mean_what_it_says_is_refused(gpu_defaults, pool, fragment):
    assert fragment in refusal(policy_text(gpu_defaults, pool=pool))


def findings(text: str, level: str) -> list[str]:
    return [
        f"{w.path}: {w.message}"
        for w in webhook.parse_policy(text, source="p.yaml").warnings
        if w.level == level and ("gpuDefaults" in w.path or "ClassName" in w.path)
    ]


def test_the_defaults_do_nothing_with_mutation_disabled_a_warning():
    for gpu_defaults, pool, path in [
        ("{activeDeadlineSeconds: {barePods: 3600}}", "", "spec.mutation.gpuDefaults"),
        ("{}", "priorityClassName: training", "spec.pools[0].priorityClassName"),
    ]:
        text = policy_text(gpu_defaults, enabled="false", pool=pool)
        [warning] = findings(text, "warning")
        assert warning.startswith(f"{path}: the GPU defaults do nothing while")
    assert findings(policy_text("{}", enabled="false"), "warning") == []


def test_a_system_priority_class_preempts_node_agents_a_warning():
    [warning] = findings(policy_text("{priorityClassName: system-cluster-critical}"), "warning")
    assert "would preempt node agents" in warning


def test_a_shared_memory_smaller_than_a_containers_own_a_warning():
    text = policy_text("{sharedMemory: {enabled: true, sizeLimit: 32Mi}}")
    [warning] = findings(text, "warning")
    assert "less than the 64Mi /dev/shm a container has without it" in warning
    assert (
        findings(policy_text("{sharedMemory: {enabled: true, sizeLimit: 64Mi}}"), "warning") == []
    )


def test_each_runtime_class_named_is_a_note_to_check_it_exists():
    text = policy_text("{runtimeClassName: nvidia-cdi}", pool="runtimeClassName: kata-nvidia")
    notes = findings(text, "info")
    assert [n.split(":")[0] for n in notes] == [
        "spec.pools[0].runtimeClassName",
        "spec.mutation.gpuDefaults.runtimeClassName",
    ]
    assert all("does not exist gets every one of their Pods refused" in n for n in notes)
    assert "kubectl get runtimeclass kata-nvidia" in notes[0]
    assert "nvidia-cdi" in notes[1]


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().out


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders the kustomization")
def test_validate_manifests_requires_the_workloads_entry_for_template_defaults(tmp_path, capsys):
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text("{runtimeClassName: nvidia-cdi}"))
    code, out = run(capsys, "policy", "validate", str(policy), "--manifests", str(WEBHOOKS))
    assert code == 0, out
    # The manifests of a release before the entry: the Pods' webhook only.
    old = tmp_path / "old"
    old.mkdir()
    (old / "validating.yaml").write_text(
        (WEBHOOKS / "validatingwebhookconfiguration.yaml").read_text()
    )
    mutating = yaml.safe_load((WEBHOOKS / "mutatingwebhookconfiguration.yaml").read_text())
    mutating["webhooks"] = mutating["webhooks"][:1]
    (old / "mutating.yaml").write_text(yaml.safe_dump(mutating))
    code, out = run(capsys, "policy", "validate", str(policy), "--manifests", str(old))
    assert code == 1
    [line] = [line for line in out.splitlines() if "no MutatingWebhookConfiguration" in line]
    assert line.startswith(f"{policy}:14: spec.mutation.gpuDefaults: the policy gives GPU")
    assert "deployments.apps" in line and "jobs.batch" in line
    assert "workloads.mutate.gpu-admission.io" in line
    # A policy that gives workloads no default needs no such entry.
    plain = tmp_path / "plain.yaml"
    plain.write_text(policy_text("{sharedMemory: {enabled: true}}"))
    assert run(capsys, "policy", "validate", str(plain), "--manifests", str(old))[0] == 0


def test_webhooks_rules_mutating_prints_the_entry_for_the_custom_kinds_with_templates(capsys):
    code, out = run(capsys, "webhooks", "rules", "--mutating")
    assert code == 0
    entry = yaml.safe_load(out)
    shipped = yaml.safe_load((WEBHOOKS / "mutatingwebhookconfiguration.yaml").read_text())
    [hook] = [h for h in shipped["webhooks"] if h["name"] == entry["name"]]
    assert entry["matchConditions"] == hook["matchConditions"]
    assert [r for r in hook["rules"] if r["apiVersions"] == ["*"]] == entry["rules"]


# --- Through the real server ----------------------------------------------------------------


def test_the_server_defaults_a_workload_and_a_pod(tmp_path):
    defaults = policy_text(
        "{runtimeClassName: nvidia-cdi, activeDeadlineSeconds: {barePods: 3600, jobs: 86400},"
        " sharedMemory: {enabled: true}}"
    )
    job = workload("Job", container(gpus="2"))
    notebook = pod(container(gpus="2"))
    with tls_server(tmp_path, policy_text=defaults) as server:
        reviews = [review(obj, kind=kind) for obj, kind in ((job, "Job"), (notebook, "Pod"))]
        answers = [{"response": response} for response in served(server, reviews, "/mutate")]
    defaulted_job = apply_both(job, decode_patch(answers[0]))
    validate(defaulted_job)
    assert defaulted_job["spec"]["activeDeadlineSeconds"] == 86400
    assert pod_spec_of(defaulted_job)["runtimeClassName"] == "nvidia-cdi"
    defaulted_pod = apply_both(notebook, decode_patch(answers[1]))
    validate(defaulted_pod)
    assert defaulted_pod["spec"]["activeDeadlineSeconds"] == 3600
    assert defaulted_pod["spec"]["volumes"] == [
        {"name": "gpu-admission-shm", "emptyDir": {"medium": "Memory"}}
    ]
    assert "runtimeClassName" not in defaulted_pod["spec"]


def test_a_template_that_sets_its_own_priority_gets_no_priority_class():
    """The Priority plugin refuses a Pod whose priority (or preemption policy) its class did
    not give it: a template copied from a live Pod keeps working."""
    for field, value in (("priority", 0), ("preemptionPolicy", "Never")):
        obj = workload("Deployment", container("train"))
        pod_spec_of(obj)[field] = value
        _, patched = mutate(obj, DEFAULTS)
        assert "priorityClassName" not in pod_spec_of(patched), field
        assert pod_spec_of(patched)["runtimeClassName"] == "nvidia-cdi"


def test_a_pod_a_controller_sends_gets_no_deadline():
    """A bare Pod made by one of the policy's controllers (an operator that sets no owner
    reference) is not an interactive session: no deadline, which could never be raised."""
    obj = pod(container("train"))
    request = review(obj)
    request["request"]["userInfo"] = {
        "username": "system:serviceaccount:kube-system:job-controller",
        "groups": ["system:serviceaccounts"],
    }
    decision = webhook.decide(copy.deepcopy(request), DEFAULTS, mutate=True)
    assert "activeDeadlineSeconds" not in json.dumps(list(decision.patch))
    _, patched = mutate(obj, DEFAULTS)
    assert patched["spec"]["activeDeadlineSeconds"] == 28800


def test_a_workload_that_names_its_own_priority_class_keeps_it_for_every_pod():
    """Volcano gives a Job's spec.priorityClassName to the Pods whose templates name none
    (and to its PodGroup): a template default would split the job's priorities."""
    tmpl = {"spec": {"restartPolicy": "Never", "containers": [container("train", gpus="8")]}}
    obj = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "priorityClassName": "high-priority",
            "tasks": [{"name": "worker", "replicas": 2, "template": tmpl}],
        },
    }
    outcome = decide_object(obj, DEFAULTS, "ml", mutate=True)
    [own] = [m for m in outcome.mutations if m.workload]
    template_spec = own.mutated["spec"]["tasks"][0]["template"]["spec"]
    assert template_spec["runtimeClassName"] == "nvidia-cdi"
    assert "priorityClassName" not in template_spec
    del obj["spec"]["priorityClassName"]  # without its own, the template gets the default
    [own] = [m for m in decide_object(obj, DEFAULTS, "ml", mutate=True).mutations if m.workload]
    assert own.mutated["spec"]["tasks"][0]["template"]["spec"]["priorityClassName"] == "gpu-batch"
