"""The policy's GPU defaults (``spec.mutation.gpuDefaults``, pools' classes) as ``add``
operations: what a GPU workload is given where it sets nothing, on CREATE.

Where each default goes follows from when the API server reads it:

- ``runtimeClassName`` and ``priorityClassName`` go on workload templates only (Deployments,
  StatefulSets, DaemonSets, ReplicaSets, Jobs, CronJobs and the catalogued kinds' pod
  templates). The RuntimeClass and Priority admission plugins resolve a Pod's class before any
  webhook runs: set on a Pod afterwards, its overhead and priority would not match it, and the
  API server refuses the Pod. A template's Pods land in its pools (``webhook.core.pools``); a
  pool's class wins there, and a template that may land in pools with different classes gets
  none rather than a guess.
- ``activeDeadlineSeconds`` goes on bare Pods (no controller owner, not sent by one of the
  policy's ``controllers``: most often an interactive session, but a CI runner's or a
  workflow engine's Pod is bare too) and on Jobs (a CronJob's job template), never on
  long-running controllers, whose Pods would be killed and recreated forever. A Pod's deadline
  can be shortened and never raised: the policy's is the longest it gets.
- ``/dev/shm`` goes on Pods of more than one whole GPU or MIG instance (shared replicas are
  one GPU's time; MPS's device plugin mounts its own daemon's shared memory at /dev/shm, which
  a volume would hide, so a Pod asking for an MPS-shared resource gets none), whoever made
  them: a memory-backed emptyDir in every container and init container that mounts nothing
  there, so that they keep sharing one /dev/shm as the runtime gives a Pod's containers, and
  NCCL's transport between GPU containers works. Where some container already mounts a
  memory-backed emptyDir there (whole, not a subPath of it), the others share that one.
  Windows Pods and containers with a block device at /dev/shm are left alone.
- ``priorityClassName`` is left out of a template that sets ``priority`` or
  ``preemptionPolicy`` itself (the Priority plugin refuses a Pod whose priority its class
  did not give it), and out of a workload that names a class for all its Pods
  (``WORKLOAD_PRIORITY_FIELDS``).

An object a controller owns (a Deployment's ReplicaSet, a CronJob's Job, an operator's
StatefulSet) is its owner's to default: a template changed under a Deployment would no longer
match it, and it would make ReplicaSets without end. Every operation is guarded by what the
object already has: defaulting the defaulted object plans nothing.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping
from typing import Any

from webhook.admission import patch
from webhook.core.paths import walk_pointers
from webhook.core.pods import PodView, effective_requests
from webhook.core.pools import resource_spec, select_pool
from webhook.core.scope import requests_gpu
from webhook.policy.model import INJECTED_ANNOTATION, Policy, Pool, WorkloadKind
from webhook.policy.quantity import Quantity

SHM_PATH = "/dev/shm"
SHM_VOLUME = "gpu-admission-shm"
# The containers a Pod is created with (ephemeral ones come later, through their subresource).
POD_CONTAINER_LISTS = ("initContainers", "containers")
# Where a workload names a priority class for all its Pods (Volcano's Job, which gives it to
# the Pods whose templates name none and to its PodGroup; Kubeflow's scheduling policy): a
# template default would split one job's priorities.
WORKLOAD_PRIORITY_FIELDS = (
    ("spec", "priorityClassName"),
    ("spec", "runPolicy", "schedulingPolicy", "priorityClass"),
)
# Where a Job's deadline is, by kind of the batch API: the Job's own spec, a CronJob's template.
JOB_DEADLINE_AT = {
    "Job": ("spec", "activeDeadlineSeconds"),
    "CronJob": ("spec", "jobTemplate", "spec", "activeDeadlineSeconds"),
}


def controlled(obj: Mapping[str, Any]) -> bool:
    """Whether a controller owns the object (an owner reference with ``controller: true``)."""
    metadata = obj.get("metadata")
    owners = metadata.get("ownerReferences") if isinstance(metadata, dict) else None
    return isinstance(owners, list) and any(
        isinstance(owner, dict) and owner.get("controller") is True for owner in owners
    )


def pod_defaults(planned: patch.Planned, view: PodView, policy: Policy) -> list[str]:
    """Plan a Pod's defaults into ``planned`` (the Pod as planned so far); what was added, for
    the ``gpu-admission.io/injected`` annotation."""
    defaults = policy.gpu_defaults
    notes: list[str] = []
    deadline = defaults.bare_pod_deadline
    if (
        deadline is not None
        and view.spec.get("activeDeadlineSeconds") is None
        and not controlled(planned.working)
        and not (view.submission is not None and view.submission.by_controller)
        and any(requests_gpu(c) for c in view.containers)
        and _planned(planned, ("spec", "activeDeadlineSeconds"), deadline)
    ):
        notes.append(f"active-deadline={deadline}")
    if defaults.shared_memory and _gpus(view, policy) > 1:
        mounted = _mount_shared_memory(planned, view, policy)
        if mounted:
            notes.append(f"dev-shm={mounted}")
    return notes


def plan_workload(
    obj: Mapping[str, Any], workload: WorkloadKind, views: list[PodView], policy: Policy
) -> tuple[dict[str, Any], ...]:
    """The ``add`` operations that give a workload's GPU templates their classes (and a Job
    its deadline), with the annotation that records them; none when it has them all.
    ``views``: the engine's views of the object's Pod definitions."""
    if controlled(obj):
        return ()
    defaults = policy.gpu_defaults
    by_spec_path = {view.spec_path: view for view in views}
    planned = patch.Planned(obj)
    runtime_classes: dict[str, None] = {}  # ordered sets, for the annotation
    priority_classes: dict[str, None] = {}
    gpu_templates = 0
    for segments, view in _gpu_templates(obj, workload, by_spec_path):
        gpu_templates += 1
        pools = select_pool(view, policy).pools
        runtime = _class_in(pools, "runtime_class", defaults.runtime_class)
        # null is no class; for priorityClassName (a plain string) so is "", as the API omits it
        if runtime is not None and view.spec.get("runtimeClassName") is None:
            if _planned(planned, (*segments, "runtimeClassName"), runtime):
                runtime_classes[runtime] = None
        priority = _class_in(pools, "priority_class", defaults.priority_class)
        if any(patch.lookup(obj, path) for path in WORKLOAD_PRIORITY_FIELDS):
            priority = None  # the workload's own class is its Pods' (and its PodGroup's)
        own_priority = any(view.spec.get(f) is not None for f in ("priority", "preemptionPolicy"))
        if priority is not None and not view.spec.get("priorityClassName") and not own_priority:
            if _planned(planned, (*segments, "priorityClassName"), priority):
                priority_classes[priority] = None
    notes = []
    if runtime_classes:
        notes.append(f"runtime-class={'+'.join(runtime_classes)}")
    if priority_classes:
        notes.append(f"priority-class={'+'.join(priority_classes)}")
    deadline_at = JOB_DEADLINE_AT.get(workload.kind) if workload.group == "batch" else None
    deadline = defaults.job_deadline
    if deadline is not None and deadline_at is not None and gpu_templates:
        if patch.lookup(planned.working, deadline_at) is None:
            if _planned(planned, deadline_at, deadline):
                notes.append(f"active-deadline={deadline}")
    if not planned.operations:
        return ()
    annotation = patch.add(
        planned.working, ("metadata", "annotations", INJECTED_ANNOTATION), ",".join(notes)
    )
    return (*planned.operations, *(annotation or ()))


def _gpu_templates(
    obj: Mapping[str, Any], workload: WorkloadKind, by_spec_path: Mapping[str, PodView]
) -> Iterator[tuple[tuple[str | int, ...], PodView]]:
    """(segments of the spec, view) of each pod template of the object that requests a GPU.
    Templates only: the other shapes (an inline PodSpec, a container, resources) are an
    operator's own fields, which it may not pass on to its Pods."""
    for target in workload.targets:
        if target.shape != "template":
            continue
        for path, segments, _ in walk_pointers(obj, target.path):
            view = by_spec_path.get(f"{path}.spec")
            if view is not None and any(requests_gpu(c) for c in view.containers):
                yield (*segments, "spec"), view


def _planned(planned: patch.Planned, segments: tuple[str | int, ...], value: Any) -> bool:
    """Plan setting ``segments`` to ``value``; False where a parent is not an object (a
    malformed object the API server refuses anyway)."""
    operations = patch.add(planned.working, segments, value)
    planned.add(operations)
    return bool(operations)


def _class_in(pools: tuple[Pool, ...], attribute: str, default: str | None) -> str | None:
    """The class a template's Pods get in their pools (a pool's own, else ``default``); None
    where the pools give different ones."""
    if not pools:
        return default
    classes = {getattr(pool, attribute) or default for pool in pools}
    return classes.pop() if len(classes) == 1 else None


def _gpus(view: PodView, policy: Policy) -> Quantity:
    """How many whole GPUs and MIG instances the Pod asks for in all, as the scheduler counts
    them (declared GPU resources only: not a companion such as HAMi's memory slices, nor
    time-sliced replicas, which share one GPU); none for a Pod that asks for an MPS-shared
    resource, whose device plugin mounts the MPS daemon's shared memory at /dev/shm."""
    total: Quantity = 0
    for name, quantity in effective_requests(view).items():
        if name in policy.retired:
            total += quantity
            continue
        if name not in policy.declared_names:
            continue
        # The Pod's pool's declaration, else any (a Pod pinned to a pool that lacks it).
        spec = resource_spec(view, policy, name) or next(
            (pool.resources[name] for pool in policy.pools if name in pool.resources), None
        )
        sharing = spec.sharing if spec is not None else None
        if sharing == "MPS":
            return 0
        if sharing in ("Exclusive", "MIG"):
            total += quantity
    return total


def _mounts_shm(container: Mapping[str, Any]) -> str | None:
    """The name of the volume the container mounts at /dev/shm; "" for a mount without a
    name, None for none."""
    mounts = container.get("volumeMounts")
    for mount in mounts if isinstance(mounts, list) else ():
        if isinstance(mount, dict) and isinstance(path := mount.get("mountPath"), str):
            if posixpath.normpath(path) == SHM_PATH:
                name = mount.get("name")
                # A subPath of a volume is not the volume: nobody else may share it.
                whole = isinstance(name, str) and not mount.get("subPath")
                return name if whole else ""
    devices = container.get("volumeDevices")
    for device in devices if isinstance(devices, list) else ():
        if isinstance(device, dict) and isinstance(path := device.get("devicePath"), str):
            if posixpath.normpath(path) == SHM_PATH:
                return ""  # a block device there: the API server refuses a mount beside it
    return None


def _memory_backed(volume: object) -> bool:
    empty_dir = volume.get("emptyDir") if isinstance(volume, dict) else None
    return isinstance(empty_dir, dict) and empty_dir.get("medium") == "Memory"


def _mount_shared_memory(planned: patch.Planned, view: PodView, policy: Policy) -> int:
    """Mount shared memory at /dev/shm in each container and init container that mounts
    nothing there; how many were given it."""
    spec = view.spec
    os_field = spec.get("os")
    if isinstance(os_field, dict) and os_field.get("name") == "windows":
        return 0  # no memory-backed emptyDir on Windows
    raw_volumes = spec.get("volumes")
    volumes = {
        v["name"]: v
        for v in (raw_volumes if isinstance(raw_volumes, list) else ())
        if isinstance(v, dict) and isinstance(v.get("name"), str)
    }
    shared = None  # a memory-backed volume some container mounts at /dev/shm already
    lacking = []
    for container in view.containers:
        mounted = _mounts_shm(container.spec)
        if mounted is not None:
            if shared is None and _memory_backed(volumes.get(mounted)):
                shared = mounted
            continue
        listed = container.spec.get("volumeMounts")
        if container.list_name in POD_CONTAINER_LISTS and (
            listed is None or isinstance(listed, list)
        ):
            lacking.append(container)
    if not lacking or (raw_volumes is not None and not isinstance(raw_volumes, list)):
        return 0
    if shared is None:
        shared = _free_name(volumes)
        if shared not in volumes:
            empty_dir: dict[str, Any] = {"medium": "Memory"}
            size = policy.gpu_defaults.shared_memory_size
            if size is not None:
                empty_dir["sizeLimit"] = size
            volume = {"name": shared, "emptyDir": empty_dir}
            planned.add(patch.append(planned.working, ("spec", "volumes"), [volume]))
    for container in lacking:
        at = ("spec", container.list_name, container.index, "volumeMounts")
        planned.add(patch.append(planned.working, at, [{"name": shared, "mountPath": SHM_PATH}]))
    return len(lacking)


def _free_name(volumes: Mapping[str, Any]) -> str:
    """The first of gpu-admission-shm, gpu-admission-shm-1, ... that no volume has, or that a
    memory-backed emptyDir has (this webhook's own, planned before: it is shared, not added)."""
    name, suffix = SHM_VOLUME, 0
    while name in volumes and not _memory_backed(volumes[name]):
        suffix += 1
        name = f"{SHM_VOLUME}-{suffix}"
    return name
