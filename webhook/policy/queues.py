"""What the policy says of queues: a tenant's queue requirement (``tenants[].requirements.queue``)
and the controllers that are not asked again (``spec.controllers``). Compiled once by
``webhook.policy.compile``; the queue rule (``webhook.checks.queue``) reads them.

Sources of the defaults (each project's own install manifests; an operator installed elsewhere,
or under another name, is listed in ``spec.controllers``):

- kube-controller-manager: one service account per controller in kube-system where it runs
  with ``--use-service-account-credentials`` (kubeadm's default), else its own user
  ``system:kube-controller-manager``;
- Kueue (``config/default``: namespace kueue-system, prefix kueue-), KAI Scheduler (its chart's
  ``pod-grouper`` and ``binder`` in kai-scheduler, the namespace its install guide uses),
  Kubeflow training-operator v1 (``training-operator`` in kubeflow), Kubeflow Trainer v2
  (``kubeflow-trainer-controller-manager`` in kubeflow-system), KubeRay (``kuberay-operator``,
  installed in default by its kustomization and its chart's usual install), JobSet
  (jobset-system, prefix jobset-), LeaderWorkerSet and DisaggregatedSet (lws-system, prefix
  lws-), Volcano (``volcano-controllers`` in volcano-system), Argo Workflows (``argo`` in
  argo), KServe (``kserve-controller-manager`` in kserve).
"""

from __future__ import annotations

from dataclasses import dataclass

# The label Kueue reads the LocalQueue from (Kueue's constants.QueueLabel); it cannot be changed.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

_KUBE_CONTROLLERS = (
    "cronjob-controller",
    "daemon-set-controller",
    "deployment-controller",
    "job-controller",
    "replicaset-controller",
    "replication-controller",
    "statefulset-controller",
)
_OPERATORS = (
    "kueue-system:kueue-controller-manager",
    "kai-scheduler:pod-grouper",
    "kai-scheduler:binder",
    "kubeflow:training-operator",
    "kubeflow-system:kubeflow-trainer-controller-manager",
    "default:kuberay-operator",
    "jobset-system:jobset-controller-manager",
    "lws-system:lws-controller-manager",
    "volcano-system:volcano-controllers",
    "argo:argo",
    "kserve:kserve-controller-manager",
)
DEFAULT_CONTROLLER_USERNAMES: tuple[str, ...] = (
    "system:kube-controller-manager",
    *(f"system:serviceaccount:kube-system:{name}" for name in _KUBE_CONTROLLERS),
    *(f"system:serviceaccount:{account}" for account in _OPERATORS),
)


@dataclass(frozen=True, slots=True)
class Controllers:
    """The users whose requests create objects from workloads already judged (a Job's Pods, a
    JobSet's Jobs): by username, or by a group they are in. Read from ``request.userInfo``,
    which the API server sets from the credentials, never from the object (a tenant writes
    ``ownerReferences`` as it likes)."""

    usernames: frozenset[str]
    groups: frozenset[str] = frozenset()

    def include(self, username: object, groups: object) -> bool:
        if isinstance(username, str) and username in self.usernames:
            return True
        return isinstance(groups, list) and any(
            isinstance(group, str) and group in self.groups for group in groups
        )


DEFAULT_CONTROLLERS = Controllers(frozenset(DEFAULT_CONTROLLER_USERNAMES))


@dataclass(frozen=True, slots=True)
class QueueRequirement:
    """A tenant's GPU workloads go through a queue: ``label`` set where the queueing system reads
    it (to one of ``queues`` where they are listed), or their Pods scheduled by one of
    ``scheduler_names`` (a batch scheduler that queues them itself; where it reads a queue
    label of its own, that label names one of ``queues`` too)."""

    label: str = KUEUE_QUEUE_LABEL
    queues: frozenset[str] | None = None
    scheduler_names: frozenset[str] = frozenset()
