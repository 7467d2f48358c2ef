"""queue: where the policy requires a tenant's queue, its GPU workloads and bare GPU Pods carry
the queue label where Kueue reads it (an allowed queue where they are listed) or are scheduled
by an allowed batch scheduler; what a controller creates (request.userInfo) is not asked again,
whatever ownerReferences say; warned while newChecks is Warn. Where a queued workload's
nodeSelector contradicts its pools, the pool findings say it likely comes from the Kueue
ResourceFlavor's nodeLabels."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import pytest

import webhook
from tests.support.admission import (
    BASE_SPEC,
    KINDS,
    admission,
    assert_allowed_clean,
    container,
    denied,
    pod,
    policy,
    status_message,
    template,
    warnings,
    with_spec,
)
from webhook.admission.objects import decide_object
from webhook.core.inventory import NodeFields, NodeSnapshot

KUEUE = "kueue.x-k8s.io/queue-name"
SPEC = """
newChecks: {new_checks}
tenants:
  - namespaces: [kube-*]
    grants: {{capabilities: [IPC_LOCK]}}
  - namespaces: [ml-*, research]
    contact: "#ml-platform on Slack"
    requirements:
      queue:
        queues: [team-a, team-a-burst]
        schedulerNames: [kai-scheduler, volcano]
  - namespaces: [open]
    requirements:
      queue: {{}}
  - namespaces: ["*"]
    grants: {{capabilities: [IPC_LOCK]}}
{controllers}
"""


@cache
def queued(new_checks: str = "Enforce", controllers: str = "") -> webhook.Policy:
    text = BASE_SPEC + SPEC.format(new_checks=new_checks, controllers=controllers)
    return policy(text, name=f"queued-{new_checks}-{len(controllers)}")


def judge(obj: dict, pol: webhook.Policy | None = None, **user: Any) -> webhook.Decision:
    """The validating webhook's decision on ``obj`` in namespace ml-train, sent by ``user``
    (username, groups; alice by default)."""
    review = admission(obj, namespace=user.pop("namespace", "ml-train"))
    if user:
        review["request"]["userInfo"] = user
    return webhook.decide(review, pol or queued(), mutate=False)


def job(tmpl: dict | None = None, labels: dict | None = None) -> dict:
    obj: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"template": tmpl or template(container(gpu=1))},
    }
    if labels is not None:
        obj["metadata"]["labels"] = labels
        if KUEUE in labels:
            obj["spec"]["suspend"] = True  # as Kueue's webhook leaves a Job it queues
    return obj


def labelled(obj: dict, **labels: str) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"].setdefault("labels", {}).update(labels)
    return obj


def scheduled(obj: dict, name: str) -> dict:
    obj = copy.deepcopy(obj)
    spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
    spec["schedulerName"] = name
    return obj


# --- the requirement --------------------------------------------------------------------


def test_a_job_without_the_queue_label_is_refused_saying_what_to_write_and_whom_to_ask() -> None:
    decision = judge(job())
    assert denied(decision) == [("queue", f"metadata.labels[{KUEUE}]")]
    message = status_message(decision)
    assert "Required value: the GPU workload goes through no queue" in message
    assert (
        'tenants[1].requirements (ml-*, research) requires namespace "ml-train"\'s GPU workloads '
        f"to go through the queue label {KUEUE} or the scheduler kai-scheduler or the scheduler "
        "volcano" in message
    )
    assert (
        f"write metadata.labels: {{{KUEUE}: one of team-a, team-a-burst}}, or "
        "spec.template.spec.schedulerName: kai-scheduler with the label kai.scheduler/queue: "
        "one of team-a, team-a-burst, or spec.template.spec.schedulerName: volcano" in message
    )
    assert "ask #ml-platform on Slack which queue to use" in message


def test_a_job_with_an_allowed_queue_is_admitted() -> None:
    assert_allowed_clean(judge(job(labels={KUEUE: "team-a"})))


def test_a_queue_not_allowed_is_refused_naming_the_allowed_ones() -> None:
    decision = judge(job(labels={KUEUE: "team-b"}))
    assert denied(decision) == [("queue", f"metadata.labels[{KUEUE}]")]
    message = status_message(decision)
    assert f'metadata.labels[{KUEUE}]: Unsupported value: "team-b"' in message
    assert 'namespace "ml-train" may not use queue "team-b"' in message
    assert "allows team-a, team-a-burst" in message


def test_any_queue_does_where_the_tenant_lists_none() -> None:
    assert_allowed_clean(judge(job(labels={KUEUE: "whatever"}), namespace="open"))
    decision = judge(job(labels={KUEUE: ""}), namespace="open")
    assert denied(decision) == [("queue", f"metadata.labels[{KUEUE}]")]
    assert "schedulerName" not in status_message(decision)  # no scheduler to offer


def test_the_label_on_the_job_template_is_not_where_kueue_reads_it() -> None:
    tmpl = template(container(gpu=1))
    tmpl["metadata"]["labels"][KUEUE] = "team-a"
    assert denied(judge(job(tmpl))) == [("queue", f"metadata.labels[{KUEUE}]")]


def test_a_batch_scheduler_the_tenant_may_use_queues_the_pods_itself() -> None:
    # KAI puts a Pod that names no queue of its own in default-queue, which the tenant may not
    # use: the KAI queue label is asked for.
    bare = scheduled(pod(container(gpu=1)), "kai-scheduler")
    decision = judge(bare)
    assert denied(decision) == [("queue", "metadata.labels[kai.scheduler/queue]")]
    assert 'may not use queue "default-queue" (KAI\'s queue for Pods that name none)' in (
        status_message(decision)
    )
    assert_allowed_clean(judge(labelled(bare, **{"kai.scheduler/queue": "team-a"})))
    assert_allowed_clean(judge(scheduled(pod(container(gpu=1)), "volcano")))
    # A scheduler not listed is no queue.
    assert denied(judge(scheduled(pod(container(gpu=1)), "my-scheduler")))


def test_kai_reads_the_workloads_own_queue_label_first() -> None:
    obj = scheduled(job(labels={"kai.scheduler/queue": "team-a"}), "kai-scheduler")
    assert_allowed_clean(judge(obj))


def test_a_volcano_job_is_scheduled_by_volcano_unless_it_says_otherwise() -> None:
    [volcano] = [k for k in KINDS if k.name == "VolcanoJob"]
    obj = volcano.wrap(template(container(gpu=1)))
    assert_allowed_clean(judge(obj))
    obj["spec"]["schedulerName"] = "default-scheduler"
    assert denied(judge(obj)) == [
        ("queue", "spec.tasks[0].template.metadata.labels[" + KUEUE + "]")
    ]


@pytest.mark.parametrize(
    "kind, path",
    [
        ("Deployment", "metadata.labels"),
        ("StatefulSet", "metadata.labels"),
        ("PyTorchJob", "metadata.labels"),
        ("JobSet", "metadata.labels"),
        ("RayCluster", "metadata.labels"),
        ("CronJob", "spec.jobTemplate.metadata.labels"),
        ("ReplicaSet", "spec.template.metadata.labels"),
        ("Pod", "metadata.labels"),
    ],
)
def test_the_label_is_asked_for_where_kueue_reads_it(kind: str, path: str) -> None:
    [found] = [k for k in KINDS if k.name == kind]
    obj = found.wrap(template(container(gpu=1)))
    assert denied(judge(obj)) == [("queue", f"{path}[{KUEUE}]")]


def test_a_cronjobs_label_goes_in_its_job_template() -> None:
    [cronjob] = [k for k in KINDS if k.name == "CronJob"]
    obj = cronjob.wrap(template(container(gpu=1)))
    obj["spec"]["jobTemplate"]["metadata"] = {"labels": {KUEUE: "team-a"}}
    assert_allowed_clean(judge(obj))


def test_kais_queue_of_a_cronjob_is_its_job_templates() -> None:
    """KAI's grouper reads the queue of a CronJob's Pods on their top owner, the Job: its
    labels are the job template's, not the CronJob's own."""
    [cronjob] = [k for k in KINDS if k.name == "CronJob"]
    tmpl = template(container(gpu=1))
    tmpl["spec"]["schedulerName"] = "kai-scheduler"
    obj = cronjob.wrap(tmpl)
    obj["spec"]["jobTemplate"]["metadata"] = {"labels": {"kai.scheduler/queue": "team-a"}}
    obj["metadata"]["labels"] = {"kai.scheduler/queue": "other-team"}
    assert "queue" not in {rule for rule, _ in denied(judge(obj))}
    obj["spec"]["jobTemplate"]["metadata"]["labels"]["kai.scheduler/queue"] = "other-team"
    obj["metadata"]["labels"]["kai.scheduler/queue"] = "team-a"
    assert denied(judge(obj)) == [
        ("queue", "spec.jobTemplate.metadata.labels[kai.scheduler/queue]")
    ]


def test_a_workload_with_several_gpu_templates_is_asked_once() -> None:
    tmpl = template(container(gpu=1))
    obj = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "train"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": tmpl},
                "Worker": {"replicas": 4, "template": tmpl},
            }
        },
    }
    assert denied(judge(obj)) == [("queue", f"metadata.labels[{KUEUE}]")]
    # One replica on an allowed scheduler, the other not: the other is asked.
    obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"] = scheduled(
        {"kind": "Job", "spec": {"template": tmpl}}, "volcano"
    )["spec"]["template"]
    assert denied(judge(obj)) == [("queue", f"metadata.labels[{KUEUE}]")]


@pytest.mark.parametrize(
    "obj",
    [
        job(template(container())),  # no GPU
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {"selector": {}, "template": template(container())},
        },
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainingRuntime",
            "metadata": {"name": "torch"},
            "spec": {
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {"spec": {"template": template(container(gpu=1))}},
                            }
                        ]
                    }
                }
            },
        },
    ],
    ids=["CPU-only Job", "CPU DaemonSet", "TrainingRuntime"],
)
def test_what_is_not_a_queued_gpu_workload_is_not_asked(obj: dict) -> None:
    assert "queue" not in {rule for rule, _ in denied(judge(obj))}


def test_namespaces_no_entry_requires_a_queue_of_are_not_asked() -> None:
    assert_allowed_clean(judge(job(), namespace="training"))
    assert_allowed_clean(judge(job(), namespace="kube-system"))


def test_it_is_a_warning_while_new_checks_is_warn() -> None:
    decision = judge(job(), queued("Warn"))
    assert decision.allowed
    [warning] = warnings(decision)
    assert warning.startswith(f"metadata.labels[{KUEUE}]: the GPU workload goes through no queue")


def test_an_entry_with_only_requirements_is_valid_and_other_entries_keep_their_grants() -> None:
    pol = queued()
    assert pol.queue_tenant("ml-train") is pol.tenants[1]
    assert pol.grants("ml-train").allows_capability("IPC_LOCK", "app")


# --- who sent it ------------------------------------------------------------------------


GPU_POD = pod(container(gpu=1))
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"


def test_a_bare_pod_from_a_user_is_asked_and_the_job_controllers_is_not() -> None:
    assert denied(judge(GPU_POD, username="alice", groups=["system:authenticated"]))
    decision = judge(GPU_POD, username=JOB_CONTROLLER, groups=["system:serviceaccounts"])
    assert_allowed_clean(decision)


def test_a_tenant_that_writes_owner_references_is_still_asked() -> None:
    spoofed = copy.deepcopy(GPU_POD)
    spoofed["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "train",
            "uid": "6c1f0b6e-6f35-4c1e-9c39-0b1d0c7a9d10",
            "controller": True,
        }
    ]
    assert denied(judge(spoofed, username="alice")) == [("queue", f"metadata.labels[{KUEUE}]")]


def test_operators_and_kueue_are_controllers_by_default() -> None:
    for username in (
        "system:kube-controller-manager",
        "system:serviceaccount:kueue-system:kueue-controller-manager",
        "system:serviceaccount:kubeflow:training-operator",
        "system:serviceaccount:jobset-system:jobset-controller-manager",
    ):
        assert_allowed_clean(judge(GPU_POD, username=username))


def test_the_policy_adds_controllers_by_name_or_group_and_can_drop_the_defaults() -> None:
    spec = (
        "controllers:\n  usernames: [system:serviceaccount:ops:my-operator]\n  groups: [ops:bots]"
    )
    added = queued(controllers=spec)
    assert_allowed_clean(judge(GPU_POD, added, username="system:serviceaccount:ops:my-operator"))
    assert_allowed_clean(judge(GPU_POD, added, username="bot-7", groups=["ops:bots"]))
    assert_allowed_clean(judge(GPU_POD, added, username=JOB_CONTROLLER))
    dropped = queued(controllers="controllers: {includeDefaults: false}")
    assert denied(judge(GPU_POD, dropped, username=JOB_CONTROLLER))


def test_a_file_is_judged_as_its_author_wrote_it_and_a_known_controllers_object_is_not() -> None:
    assert not decide_object(GPU_POD, queued(), "ml-train").allowed
    assert decide_object(GPU_POD, queued(), "ml-train", made_by_controller=True).allowed


# --- Kueue's flavors and the pools ------------------------------------------------------


POOLS = """
newChecks: Enforce
resources:
  - {name: nvidia.com/gpu, sharing: Exclusive}
pools:
  - name: h100
    nodeSelector: {gpu.example.com/pool: h100}
    resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
  - name: a100-reserved
    nodeSelector: {gpu.example.com/pool: a100}
    resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
    namespaces: [research]
"""
FLAVOR_HINT = (
    "likely comes from the nodeLabels of the Kueue ResourceFlavor the workload was admitted to "
    "(Kueue writes them into the Pod template): make the flavor's nodeLabels match the "
    'nodeSelector of pool "h100" (gpu.example.com/pool: h100)'
)


@cache
def pools() -> webhook.Policy:
    return policy(POOLS, name="kueue-pools")


def admitted(value: str) -> dict:
    """A queued Job as Kueue admits it: the flavor's nodeLabels in its template's nodeSelector,
    and the podset label."""
    tmpl = template(container(gpu=1), node_selector={"gpu.example.com/pool": value})
    tmpl["metadata"]["labels"]["kueue.x-k8s.io/podset"] = "main"
    return job(tmpl, labels={KUEUE: "team-a"})


KUEUE_SA = "system:serviceaccount:kueue-system:kueue-controller-manager"


def test_a_flavor_that_selects_a_closed_pool_is_named_with_what_to_change() -> None:
    decision = judge(admitted("a100"), pools(), username=KUEUE_SA)
    assert denied(decision) == [
        ("pool-access", "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]")
    ]
    assert "{gpu.example.com/pool: a100} " + FLAVOR_HINT in status_message(decision)


def test_a_flavor_that_selects_no_pool_is_named_with_what_to_change() -> None:
    decision = judge(admitted("l4"), pools(), username=KUEUE_SA)
    assert denied(decision) == [("sharing-mode", "spec.template.spec.nodeSelector")]
    message = status_message(decision)
    assert "it would pend forever" in message
    assert "{gpu.example.com/pool: l4} " + FLAVOR_HINT in message


def test_the_pods_of_an_admitted_job_carry_the_hint_too() -> None:
    [tmpl] = [admitted("a100")["spec"]["template"]]
    created = {"apiVersion": "v1", "kind": "Pod", **tmpl}
    decision = judge(created, pools(), username=JOB_CONTROLLER)
    assert FLAVOR_HINT in status_message(decision)


def test_topology_aware_templates_are_queued_ones() -> None:
    tmpl = template(
        container(gpu=1),
        node_selector={"gpu.example.com/pool": "a100"},
        annotations={"kueue.x-k8s.io/podset-required-topology": "cloud.provider.com/topology-rack"},
    )
    decision = judge(job(tmpl), pools(), namespace="ml-train")
    assert FLAVOR_HINT in status_message(decision)


def test_a_workload_no_queue_admitted_gets_no_kueue_hint() -> None:
    tmpl = template(container(gpu=1), node_selector={"gpu.example.com/pool": "a100"})
    message = status_message(judge(job(tmpl), pools()))
    assert "may not use the pool(s)" in message
    assert "Kueue" not in message


# --- policy validate --------------------------------------------------------------------


def test_validate_warns_where_the_job_controllers_pods_would_be_asked_again() -> None:
    dropped = queued(controllers="controllers: {includeDefaults: false}")
    [warning] = [w for w in dropped.warnings if w.path == "spec.controllers"]
    assert "the Pods it creates from a queued Job or Deployment are asked for a queue" in (
        warning.message
    )
    assert not [w for w in queued().warnings if w.path == "spec.controllers"]


def test_validate_warns_that_default_scheduler_queues_nothing() -> None:
    text = BASE_SPEC + SPEC.format(new_checks="Warn", controllers="").replace(
        "schedulerNames: [kai-scheduler, volcano]", "schedulerNames: [default-scheduler]"
    )
    warned = [w.message for w in policy(text, name="default-scheduler").warnings]
    assert any(m.startswith("default-scheduler schedules every Pod") for m in warned)


def test_a_tenant_selected_by_namespace_labels_is_asked_where_the_inventory_knows_them() -> None:
    selected = policy(
        BASE_SPEC
        + """
newChecks: Enforce
tenants:
  - namespaceSelector: {matchLabels: {example.com/queued: "true"}}
    contact: "#ml-platform"
    requirements: {queue: {}}
""",
        name="selected-queue",
    )
    nodes = NodeSnapshot({}, NodeFields.of(selected), {"vision": {"example.com/queued": "true"}})
    decision = webhook.decide(
        admission(job(), namespace="vision"), selected, mutate=False, nodes=nodes
    )
    assert denied(decision) == [("queue", f"metadata.labels[{KUEUE}]")]
    assert "tenants[0].requirements (namespaces selected by example.com/queued=true)" in (
        status_message(decision)
    )
    # Without the inventory the namespace's labels are not known: judged by names only.
    assert_allowed_clean(
        webhook.decide(admission(job(), namespace="vision"), selected, mutate=False)
    )


# --- What a review of the rule found (a tenant looking for a way around the queue) ----------


def daemonset(*containers: dict) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent"},
        "spec": {"selector": {}, "template": template(*containers)},
    }


def test_a_gpu_daemonset_is_refused_where_a_queue_is_required() -> None:
    """A DaemonSet puts a GPU Pod on every node it selects, and no queue holds them."""
    decision = judge(daemonset(container(gpu=8)))
    assert [rule for rule, _ in denied(decision)] == ["queue"]
    assert "no queue holds them" in status_message(decision)


def test_a_job_kueue_did_not_suspend_is_refused() -> None:
    """Kueue's webhook suspends a Job it queues before any validating webhook sees it: a
    labelled Job that is not suspended runs outside the queue (Kueue's integration off, or
    an owner reference that made Kueue leave it to a parent)."""
    obj = job(labels={KUEUE: "team-a"})
    obj["spec"]["suspend"] = False
    decision = judge(obj)
    assert denied(decision) == [("queue", "spec.suspend")]
    assert "Kueue did not take it" in status_message(decision)
    # A file, or what an audit reads, is judged as written: Kueue has not seen it.
    assert "queue" not in {
        f.violation.rule for f in decide_object(obj, queued(), "ml-train").findings
    }


def test_a_bare_pod_kueue_did_not_gate_is_refused() -> None:
    obj = labelled(pod(container(gpu=1)), **{KUEUE: "team-a"})
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "decoy", "uid": "1", "controller": True}
    ]
    assert denied(judge(obj)) == [("queue", "spec.schedulingGates")]
    obj["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    assert "queue" not in {rule for rule, _ in denied(judge(obj))}


def test_a_gpu_pod_that_names_its_node_skips_the_queue() -> None:
    obj = with_spec(pod(container(gpu=1)), schedulerName="volcano", nodeName="gpu-1")
    decision = judge(obj)
    assert denied(decision) == [("queue", "spec.nodeName")]


def test_kueues_label_names_an_allowed_queue_whatever_the_scheduler() -> None:
    obj = labelled(job(), **{KUEUE: "priority-queue"})
    obj["spec"]["template"]["spec"]["schedulerName"] = "volcano"
    decision = judge(obj)
    assert denied(decision) == [("queue", f"metadata.labels[{KUEUE}]")]
    assert 'may not use queue "priority-queue"' in status_message(decision)


@pytest.mark.parametrize("value", [["team-a"], {"a": "b"}, 1])
def test_a_queue_label_that_is_not_a_string_names_no_queue(value: Any) -> None:
    obj = labelled(pod(container(gpu=1)), x="y")
    obj["metadata"]["labels"][KUEUE] = value
    assert denied(judge(obj)) == [("queue", f"metadata.labels[{KUEUE}]")]


@pytest.mark.parametrize("group", ["system:authenticated", "system:serviceaccounts"])
def test_a_controller_group_everyone_is_in_is_warned(group: str) -> None:
    text = BASE_SPEC + SPEC.format(
        new_checks="Warn", controllers=f"controllers: {{groups: [{group}]}}\n"
    )
    found = [w.message for w in policy(text, name=f"everyone-{group}").warnings]
    assert any(m.startswith(f"every user in {group} would be a controller") for m in found)


def test_kuberay_in_the_shared_default_namespace_is_no_default_controller() -> None:
    decision = judge(
        pod(container(gpu=1)), username="system:serviceaccount:default:kuberay-operator"
    )
    assert "queue" in {rule for rule, _ in denied(decision)}
