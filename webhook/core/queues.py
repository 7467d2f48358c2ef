"""Where a workload names its queue and its scheduler, as the queueing systems read them, and who
sent it: what the queue rule and the Kueue hints of the pool rules read.

Kueue reads ``kueue.x-k8s.io/queue-name`` on the object it manages as a whole (its
integrations: batch Jobs, Deployments, StatefulSets, LeaderWorkerSets, JobSets, the Kubeflow
jobs, TrainJobs, RayJobs, RayClusters, RayServices), in a CronJob's ``spec.jobTemplate.metadata``
(the Jobs it creates carry it), and on each Pod for everything else (its ``pod`` integration:
Argo Workflows through ``spec.podMetadata`` or a template's ``metadata``). KAI reads
``kai.scheduler/queue`` on the Pod's top owner, then on the Pod, and puts a Pod that names none
in ``default-queue`` (its pod grouper). Volcano's Jobs set their Pods' ``schedulerName`` to the
Job's ``spec.schedulerName``, ``volcano`` unless it says otherwise (its admission webhook).

When Kueue admits a workload it writes its ResourceFlavor's ``nodeLabels`` into the Pod
templates' ``nodeSelector`` and labels them ``kueue.x-k8s.io/podset``; with topology-aware
scheduling the templates carry ``kueue.x-k8s.io/podset-required-topology`` (or
``-preferred-topology``) and Kueue adds the topology domain's labels when it ungates the Pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.findings import quote
from webhook.core.pods import PodView
from webhook.policy.model import Pool
from webhook.policy.queues import KUEUE_QUEUE_LABEL

KAI_SCHEDULER = "kai-scheduler"
KAI_QUEUE_LABEL = "kai.scheduler/queue"
KAI_DEFAULT_QUEUE = "default-queue"
DEFAULT_SCHEDULER = "default-scheduler"
KUEUE_PODSET_LABEL = "kueue.x-k8s.io/podset"
KUEUE_TOPOLOGY_ANNOTATIONS = (
    "kueue.x-k8s.io/podset-required-topology",
    "kueue.x-k8s.io/podset-preferred-topology",
)

# The kinds Kueue manages as a whole: it reads the queue label on the object itself.
WHOLE_WORKLOADS = frozenset(
    {
        ("batch", "Job"),
        ("apps", "Deployment"),
        ("apps", "StatefulSet"),
        ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"),
        ("jobset.x-k8s.io", "JobSet"),
        ("kubeflow.org", "PyTorchJob"),
        ("kubeflow.org", "TFJob"),
        ("kubeflow.org", "MPIJob"),
        ("kubeflow.org", "XGBoostJob"),
        ("kubeflow.org", "PaddleJob"),
        ("kubeflow.org", "JAXJob"),
        ("trainer.kubeflow.org", "TrainJob"),
        ("ray.io", "RayJob"),
        ("ray.io", "RayCluster"),
        ("ray.io", "RayService"),
    }
)
CRONJOB = ("batch", "CronJob")
# Where other kinds keep the metadata of what they create, beside their Pod templates'.
_METADATA_ELSEWHERE: dict[tuple[str, str], tuple[str, ...]] = {
    CRONJOB: ("spec", "jobTemplate", "metadata"),
    ("argoproj.io", "Workflow"): ("spec", "podMetadata"),
    ("argoproj.io", "WorkflowTemplate"): ("spec", "podMetadata"),
    ("argoproj.io", "ClusterWorkflowTemplate"): ("spec", "podMetadata"),
    ("argoproj.io", "CronWorkflow"): ("spec", "workflowSpec", "podMetadata"),
}
# Kinds that are templates a workload refers to (a TrainJob its runtime, an InferenceService
# its serving runtime): the workload that uses them is asked. (A DaemonSet's Pods are never
# queued: the queue rule refuses GPU DaemonSets where a queue is required.)
NOT_QUEUED = frozenset(
    {
        ("trainer.kubeflow.org", "TrainingRuntime"),
        ("trainer.kubeflow.org", "ClusterTrainingRuntime"),
        ("serving.kserve.io", "ServingRuntime"),
        ("serving.kserve.io", "ClusterServingRuntime"),
        ("serving.kserve.io", "LLMInferenceServiceConfig"),
        ("flow.volcano.sh", "JobTemplate"),
    }
)
# Where a kind sets its Pods' scheduler when their template does not (Volcano's Jobs).
_SCHEDULER_ELSEWHERE: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("batch.volcano.sh", "Job"): (("spec", "schedulerName"), "volcano"),
    ("batch.volcano.sh", "CronJob"): (("spec", "jobTemplate", "spec", "schedulerName"), "volcano"),
}


# Where Kueue's webhook, taking a workload it manages whole, suspends it until it is admitted
# (``true``); a bare Pod it takes gets its scheduling gate instead.
_SUSPEND_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("batch", "Job"): ("spec", "suspend"),
    ("jobset.x-k8s.io", "JobSet"): ("spec", "suspend"),
    ("trainer.kubeflow.org", "TrainJob"): ("spec", "suspend"),
    ("ray.io", "RayJob"): ("spec", "suspend"),
    ("ray.io", "RayCluster"): ("spec", "suspend"),
    **{
        ("kubeflow.org", kind): ("spec", "runPolicy", "suspend")
        for kind in ("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob")
    },
}
KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"


@dataclass(frozen=True, slots=True)
class Submission:
    """What the views of one object under review share: its API group and kind, the object,
    whether a controller sent it (``request.userInfo`` among the policy's ``controllers``;
    never for a file, judged as its author wrote it), and its templates that request a GPU,
    in order (a label on the object itself is asked for once, not per template)."""

    group: str
    kind: str
    obj: Mapping[str, Any]
    by_controller: bool = False
    gpu_templates: tuple[PodView, ...] = ()
    # The API server sent it (``request.userInfo`` is set), after every mutating webhook:
    # what Kueue's writes into an object it queues can be looked for (not in a file, nor in
    # an object a live audit reads, which Kueue may have admitted since).
    live: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.kind)

    @property
    def whole(self) -> bool:
        """Kueue manages the object as a whole (the label goes on the object itself)."""
        return self.key in WHOLE_WORKLOADS


@dataclass(frozen=True, slots=True)
class LabelPlace:
    """Where a workload's label is read: its value (None: not set), the labels' path, and
    whether they are the object's own rather than the template's (``shared``)."""

    value: object
    path: str
    shared: bool = False


def kueue_label_place(view: PodView, submission: Submission, label: str) -> LabelPlace:
    """Where Kueue reads ``label`` for the view's Pods, and what it says there."""
    if submission.whole:
        labels = _labels(submission.obj, ("metadata",))
        return LabelPlace(labels.get(label), "metadata.labels", shared=True)
    elsewhere = _METADATA_ELSEWHERE.get(submission.key)
    own = _label_of(view.metadata, label)
    if elsewhere is not None and own is None:
        found = _labels(submission.obj, elsewhere).get(label)
        if submission.key == CRONJOB or found is not None:
            return LabelPlace(found, ".".join((*elsewhere, "labels")), shared=True)
    return LabelPlace(own, f"{view.metadata_path}.labels" if view.metadata_path else "labels")


def kai_queue(view: PodView, submission: Submission) -> LabelPlace:
    """Where KAI reads the queue of the view's Pods: the top owner's label (a CronJob's Jobs
    are the top owners of their Pods: KAI's grouper reads the job template's labels), else
    the Pod's (value None where neither names one: KAI's default queue)."""
    owner = ("spec", "jobTemplate", "metadata") if submission.key == CRONJOB else ("metadata",)
    value = _labels(submission.obj, owner).get(KAI_QUEUE_LABEL)
    if value is not None:
        return LabelPlace(value, ".".join((*owner, "labels")), shared=True)
    value = _label_of(view.metadata, KAI_QUEUE_LABEL)
    return LabelPlace(value, f"{view.metadata_path}.labels" if view.metadata_path else "labels")


def scheduler_name(view: PodView, submission: Submission) -> tuple[str, str]:
    """The scheduler of the view's Pods and the field that says so."""
    own = view.spec.get("schedulerName")
    path = view.field_path("schedulerName")
    if isinstance(own, str) and own:
        return own, path
    elsewhere = _SCHEDULER_ELSEWHERE.get(submission.key)
    if elsewhere is not None:
        fields, default = elsewhere
        value: Any = submission.obj
        for name in fields:
            value = value.get(name) if isinstance(value, dict) else None
        return (value if isinstance(value, str) and value else default), ".".join(fields)
    return DEFAULT_SCHEDULER, path


def kueue_managed(view: PodView, submission: Submission | None) -> bool:
    """Whether Kueue queues (or admitted) the view's Pods: the queue label where Kueue reads
    it, or what Kueue writes into a template it admits."""
    labels = view.metadata.get("labels")
    if isinstance(labels, dict) and (KUEUE_PODSET_LABEL in labels or KUEUE_QUEUE_LABEL in labels):
        return True
    if any(key in view.annotations for key in KUEUE_TOPOLOGY_ANNOTATIONS):
        return True
    return (
        submission is not None
        and kueue_label_place(view, submission, KUEUE_QUEUE_LABEL).value is not None
    )


def flavor_hint(view: PodView, pools: tuple[Pool, ...]) -> str:
    """What to change where a queued template's nodeSelector contradicts its pools: Kueue wrote
    its ResourceFlavor's nodeLabels there when it admitted the workload. "" for a template
    Kueue does not queue, or whose nodeSelector names no pool's label."""
    selector = view.node_selector()
    keys = {key for pool in pools for key in pool.node_selector}
    written = {k: v for k, v in selector.items() if k in keys}
    if not written or not kueue_managed(view, view.submission):
        return ""
    shown = ", ".join(f"{k}: {v}" for k, v in sorted(written.items(), key=str))
    target = " or ".join(f"pool {quote(pool.name)} ({_selector(pool)})" for pool in pools)
    return (
        f"; the nodeSelector {{{shown}}} likely comes from the nodeLabels of the Kueue "
        "ResourceFlavor the workload was admitted to (Kueue writes them into the Pod template): "
        f"make the flavor's nodeLabels match the nodeSelector of {target}"
    )


def _selector(pool: Pool) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(pool.node_selector.items()))


def _labels(obj: Mapping[str, Any], where: tuple[str, ...]) -> Mapping[str, Any]:
    value: Any = obj
    for name in where:
        value = value.get(name) if isinstance(value, dict) else None
    labels = value.get("labels") if isinstance(value, dict) else None
    return labels if isinstance(labels, dict) else {}


def _label_of(metadata: Mapping[str, Any], label: str) -> object:
    labels = metadata.get("labels")
    return labels.get(label) if isinstance(labels, dict) else None


def kueue_took(view: PodView, submission: Submission) -> tuple[bool, str] | None:
    """Whether Kueue took the object it was sent with its queue label: suspended (a kind it
    manages whole) or gated (a bare Pod) by its webhook, which runs before any validating
    one; with the field that says so. None where that cannot be told: a kind Kueue takes
    otherwise (a Deployment's Pods are gated as they are made), or not a live request."""
    if not submission.live:
        return None
    fields = _SUSPEND_FIELDS.get(submission.key)
    if fields is not None:
        value: Any = submission.obj
        for name in fields:
            value = value.get(name) if isinstance(value, dict) else None
        return value is True, ".".join(fields)
    if submission.key == ("", "Pod") and view.spec_path == "spec":
        gates = view.spec.get("schedulingGates")
        gated = isinstance(gates, list) and any(
            isinstance(g, dict) and g.get("name") == KUEUE_ADMISSION_GATE for g in gates
        )
        return gated, "spec.schedulingGates"
    return None
