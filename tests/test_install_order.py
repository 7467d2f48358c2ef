"""The install guide's install, upgrade and uninstall commands, played against a model of a
cluster: no documented order may leave a fail-closed webhook registered without a Ready server
that its caBundle trusts, and an upgrade never re-keys the CA.

The commands are read from ``docs/installing.md`` (its ``sh`` blocks, every one of them played),
so what is tested is what users copy; the README's short install is the guide's, command for
command. Each command is carried out on the model the way its tool does it:
``kubectl apply -k`` renders with the real ``kubectl kustomize`` and applies the objects one by
one in that order (kubectl does not wait between objects); ``kubectl rollout status`` is the
only thing that makes a Deployment Ready, and only when what its Pods mount exists; cert-manager
issues certificates and its cainjector fills caBundles only while something waits (they are
asynchronous: nothing may count on them having acted right after an apply). After every object
applied or deleted the invariant is checked.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.docs import INSTALLING, OVERLAY_REF, fenced_blocks, lay_out_overlay, section
from tests.support.kube import kustomize
from tests.support.paths import REPO
from webhook.certs.activation import validating_failure_policies
from webhook.cli.main import main as cli_main
from webhook.policy.workloads import CLAIMS_WEBHOOK, WORKLOADS_WEBHOOK

WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
INJECT_ANNOTATION = "cert-manager.io/inject-ca-from"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", *WEBHOOK_KINDS}


class StepFailed(AssertionError):
    """A command that would fail or hang on a real cluster."""


class Unsafe(AssertionError):
    """The invariant broke: a fail-closed webhook without a Ready server that it trusts."""


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    namespace = "" if obj["kind"] in CLUSTER_SCOPED else meta.get("namespace", "default")
    return obj["kind"], namespace, meta["name"]


@dataclass
class Cluster:
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    ready: set[tuple[str, str]] = field(default_factory=set)  # Deployments (namespace, name)
    # What the local machine holds: a certificate directory or a CA file -> the CA's identity.
    local: dict[str, str] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)  # for failure messages
    _ids: itertools.count = field(default_factory=itertools.count)

    def new_ca(self, owner: str) -> str:
        return f"CA#{next(self._ids)} ({owner})"

    # -------------------------------------------------------------- objects, one at a time

    def apply(self, obj: dict[str, Any]) -> None:
        kind, namespace, name = key(obj)
        if namespace and ("Namespace", "", namespace) not in self.objects:
            raise StepFailed(f"{kind} {namespace}/{name}: namespace {namespace} not found")
        live = self.objects.get(key(obj))
        obj = yaml.safe_load(yaml.safe_dump(obj))
        if live is not None and kind in WEBHOOK_KINDS:
            # A field the applied object leaves out and nothing else set stays as it is live;
            # client-side apply drops only what the last applied object had set.
            for hook, old in zip(obj.get("webhooks", []), live.get("webhooks", []), strict=False):
                bundle = (old.get("clientConfig") or {}).get("caBundle")
                if bundle and "caBundle" not in hook.get("clientConfig", {}):
                    hook.setdefault("clientConfig", {})["caBundle"] = bundle
        if kind == "Deployment" and live is not None and live["spec"] != obj["spec"]:
            # A rollout. With maxUnavailable 0 the old Pods serve until new ones are Ready,
            # with the certificate they have: still served if the Secret is unchanged.
            rolling = (obj["spec"].get("strategy") or {}).get("rollingUpdate") or {}
            if rolling.get("maxUnavailable") != 0:
                self.ready.discard((namespace, name))
        self.objects[key(obj)] = obj
        self.steps.append(f"apply {kind} {namespace}/{name}")
        self.check()

    def delete(self, obj: dict[str, Any]) -> None:
        kind, namespace, name = key(obj)
        if key(obj) not in self.objects:
            return  # gone with its namespace already
        del self.objects[key(obj)]
        if kind == "Deployment":
            self.ready.discard((namespace, name))
        if kind == "Namespace":
            for other in [k for k in self.objects if k[1] == name]:
                del self.objects[other]
            self.ready = {r for r in self.ready if r[0] != name}
        self.steps.append(f"delete {kind} {namespace}/{name}")
        self.check()

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, "" if kind in CLUSTER_SCOPED else namespace, name))

    # -------------------------------------------------------------- the invariant

    def check(self) -> None:
        for (kind, _, name), config in self.objects.items():
            if kind != "ValidatingWebhookConfiguration":
                continue
            for hook in config.get("webhooks", []):
                if hook.get("failurePolicy", "Fail") != "Fail":
                    continue
                problem = self._unserved(hook)
                if problem:
                    raise Unsafe(
                        f"after {self.steps[-1]}: fail-closed webhook {name}/{hook['name']} "
                        f"{problem}\nsteps so far:\n  " + "\n  ".join(self.steps)
                    )

    def _unserved(self, hook: dict[str, Any]) -> str | None:
        service_ref = hook["clientConfig"]["service"]
        namespace = service_ref["namespace"]
        service = self.get("Service", namespace, service_ref["name"])
        if service is None:
            return f"calls Service {namespace}/{service_ref['name']}, which does not exist"
        selector = service["spec"]["selector"]
        backing = [
            obj
            for (kind, ns, _), obj in self.objects.items()
            if kind == "Deployment"
            and ns == namespace
            and selector.items() <= obj["spec"]["template"]["metadata"]["labels"].items()
        ]
        ready = [d for d in backing if (namespace, d["metadata"]["name"]) in self.ready]
        if not ready:
            return "has no Ready server behind its Service"
        bundle = hook["clientConfig"].get("caBundle")
        if not bundle:
            return "has no caBundle: the API server cannot verify the server"
        for deployment in ready:
            secret = self.get("Secret", namespace, tls_secret_of(deployment))
            if secret is None or secret["ca"] != bundle:
                served = secret["ca"] if secret else "nothing"
                return f"trusts {bundle}, but the server's certificate is signed by {served}"
        return None

    # -------------------------------------------------------------- what waits

    def settle_controllers(self) -> None:
        """What cert-manager does while something waits: issue every Certificate it can,
        then let the cainjector fill the annotated webhooks' caBundle."""
        issued = True
        while issued:
            issued = False
            for (kind, namespace, name), cert in list(self.objects.items()):
                if kind != "Certificate":
                    continue
                secret_name = cert["spec"]["secretName"]
                if self.get("Secret", namespace, secret_name) is not None:
                    continue
                issuer = self.get("Issuer", namespace, cert["spec"]["issuerRef"]["name"])
                if issuer is None:
                    continue
                signer = None  # a self-signed certificate signs itself
                if "selfSigned" not in issuer["spec"]:
                    ca_secret = self.get("Secret", namespace, issuer["spec"]["ca"]["secretName"])
                    if ca_secret is None:
                        continue
                    signer = ca_secret["self"]
                own = self.new_ca(f"cert-manager {name}")
                secret = {
                    "kind": "Secret",
                    "metadata": {"name": secret_name, "namespace": namespace},
                    "ca": signer or own,
                    "self": own,
                }
                self.apply(secret)
                issued = True
        for (kind, _, _), config in list(self.objects.items()):
            source = (config["metadata"].get("annotations") or {}).get(INJECT_ANNOTATION)
            if kind not in WEBHOOK_KINDS or not source:
                continue
            namespace, cert_name = source.split("/")
            cert = self.get("Certificate", namespace, cert_name)
            secret = cert and self.get("Secret", namespace, cert["spec"]["secretName"])
            if secret:
                for hook in config["webhooks"]:
                    hook.setdefault("clientConfig", {})["caBundle"] = secret["ca"]

    def rollout_status(self, namespace: str, name: str) -> None:
        self.settle_controllers()
        deployment = self.get("Deployment", namespace, name)
        if deployment is None:
            raise StepFailed(f"rollout status: Deployment {namespace}/{name} not found")
        spec = deployment["spec"]["template"]["spec"]
        missing = []
        account = spec.get("serviceAccountName")
        if account and self.get("ServiceAccount", namespace, account) is None:
            missing.append(f"ServiceAccount {account}")
        for volume in spec.get("volumes", []):
            if "secret" in volume and not volume["secret"].get("optional"):
                if self.get("Secret", namespace, volume["secret"]["secretName"]) is None:
                    missing.append(f"Secret {volume['secret']['secretName']}")
            if "configMap" in volume and not volume["configMap"].get("optional"):
                if self.get("ConfigMap", namespace, volume["configMap"]["name"]) is None:
                    missing.append(f"ConfigMap {volume['configMap']['name']}")
        if missing:
            raise StepFailed(f"rollout status would wait forever: missing {', '.join(missing)}")
        self.ready.add((namespace, name))
        self.steps.append(f"Deployment {namespace}/{name} Ready")
        self.check()


def tls_secret_of(deployment: dict[str, Any]) -> str:
    [name] = [
        v["secret"]["secretName"]
        for v in deployment["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    ]
    return name


# ------------------------------------------------------------------ the commands


def certs_install(cluster: Cluster, args: list[str], piped: list[dict] | None) -> list[dict]:
    options = {
        "--cert-dir": "certs",
        "--validating": "gpu-admission",
        "--mutating": "gpu-admission",
    }
    options.update(dict(zip(args[::2], args[1::2], strict=True)))
    source = options.get("--ca-bundle", options["--cert-dir"])
    if source not in cluster.local:
        raise StepFailed(f"certs install: {source}: no such file or directory")
    ca = cluster.local[source]
    if options.get("--manifests") == "-":
        assert piped, "certs install --manifests - reads manifests on standard input"
        out = yaml.safe_load(yaml.safe_dump(piped))
        for obj in out:
            if obj["kind"] in WEBHOOK_KINDS:
                for hook in obj["webhooks"]:
                    hook.setdefault("clientConfig", {})["caBundle"] = ca
        return out
    assert "--manifests" not in options, "GitOps mode writes files, not played here"
    secret = {
        "kind": "Secret",
        "metadata": {"name": "gpu-admission-tls", "namespace": "gpu-admission"},
        "ca": ca,
        "self": ca,
    }
    cluster.apply(secret)
    for kind, option in (
        ("ValidatingWebhookConfiguration", "--validating"),
        ("MutatingWebhookConfiguration", "--mutating"),
    ):
        if not options[option]:
            continue
        config = cluster.get(kind, "", options[option])
        if config is None:
            raise StepFailed(f"certs install: {kind} {options[option]} not found")
        for hook in config["webhooks"]:
            hook.setdefault("clientConfig", {})["caBundle"] = ca
        cluster.steps.append(f"patch caBundle of {kind}")
        cluster.check()
    return []


def run_command(cluster: Cluster, line: str) -> None:
    """One line of a block of the guide: a command or a pipeline of them."""
    redirect = None
    if " > " in line:
        line, redirect = (part.strip() for part in line.rsplit(" > ", 1))
    piped: list[dict] | None = None
    for part in (p.strip() for p in line.split(" | ")):
        words = shlex.split(part)
        piped = run_one(cluster, words, piped, redirect)


def run_one(
    cluster: Cluster, words: list[str], piped: list[dict] | None, redirect: str | None
) -> list[dict] | None:
    match words:
        case ["kubectl", "apply", "-k", directory]:
            for obj in kustomize(directory):
                cluster.apply(obj)
        case ["kubectl", "delete", "-k", directory]:
            for obj in kustomize(directory):
                cluster.delete(obj)
        case ["kubectl", "kustomize", directory]:
            return kustomize(directory)
        case ["kubectl", "apply", "-f", "-"]:
            assert piped is not None
            for obj in piped:
                cluster.apply(obj)
        case ["kubectl", "-n", namespace, "rollout", "status", target, *_]:
            kind, name = target.split("/")
            assert kind == "deployment"
            cluster.rollout_status(namespace, name)
        case ["kubectl", "-n", namespace, "get", "secret", name, "-o", output]:
            assert output == "jsonpath={.data.ca\\.crt}", output
            cluster.settle_controllers()
            secret = cluster.get("Secret", namespace, name)
            if secret is None:
                raise StepFailed(f"Secret {namespace}/{name} not found")
            return [{"ca": secret["ca"]}]
        case ["base64", "-d"]:
            assert piped is not None and redirect is not None
            cluster.local[redirect] = piped[0]["ca"]
        case ["gpu-admission", "certs", "generate", "--out", directory, *rest]:
            if directory not in cluster.local or "--force" in rest:
                cluster.local[directory] = cluster.new_ca(f"certs generate {directory}")
        case ["gpu-admission", "certs", "install", *args]:
            return certs_install(cluster, args, piped)
        case ["gpu-admission", "policy", "validate", policy, "--manifests", directory]:
            policy_validate(cluster, policy, directory)
        case _:
            raise AssertionError(f"the model does not know this command: {shlex.join(words)}")
    return None


def play(cluster: Cluster, commands: list[str]) -> Cluster:
    for line in commands:
        cluster.steps.append(f"$ {line}")
        run_command(cluster, line)
    return cluster


def policy_validate(cluster: Cluster, policy: str, directory: str) -> None:
    """``gpu-admission policy validate POLICY --manifests DIR``: changes nothing, and stops
    the install when the policy is refused (exit status not 0)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli_main(
            ["policy", "validate", str(REPO / policy), "--manifests", str(REPO / directory)]
        )
    if status != 0:
        raise StepFailed(
            f"policy validate {policy} exited {status}:\n{out.getvalue()}{err.getvalue()}"
        )
    cluster.steps.append(f"validated {policy}")


# ------------------------------------------------------------------ the guide's blocks


def deploying_blocks() -> dict[str, list[str]]:
    """The install guide's ``sh`` blocks, by the bold label before each."""
    text = INSTALLING.read_text("utf-8")
    blocks = {}
    for match in re.finditer(r"\*\*([^*]+)\*\*[^`]*?```sh\n(.*?)```", text, re.S):
        label = match.group(1).split(" (")[0].rstrip(":").strip()
        blocks[label] = [line for line in match.group(2).splitlines() if line.strip()]
    return blocks


BLOCKS = deploying_blocks()
INSTALL = BLOCKS["Install"]
AUDIT_INSTALL = [
    line.replace("manifests/webhooks", "manifests/overlays/audit/webhooks").replace(
        "kubectl apply -k manifests/", "kubectl apply -k manifests/overlays/audit"
    )
    for line in INSTALL
]


def test_the_guide_has_the_blocks_this_test_plays() -> None:
    kustomize_blocks = {label for label in BLOCKS if not label.startswith("Helm")}
    assert kustomize_blocks == {
        "Install",
        "Uninstall",
        "With cert-manager",
        "Install with your own policy",
    }, BLOCKS
    assert any("rollout status" in line for line in INSTALL)


def test_every_sh_block_of_the_guide_is_labelled_and_played() -> None:
    """A block without a bold label before it would be read by no test: every ``sh`` block
    of the guide is one of the labelled blocks above (Helm's included)."""
    text = INSTALLING.read_text("utf-8")
    bodies = [
        [line for line in body.splitlines() if line.strip()] for body in fenced_blocks(text, "sh")
    ]
    assert sorted(map(tuple, bodies)) == sorted(map(tuple, BLOCKS.values()))


def test_the_readmes_short_install_is_the_guides() -> None:
    """The README's install commands, kustomize's and Helm's, are lines of the guide's played
    blocks, in the same order: the short version cannot drift from the tested one."""
    readme = section((REPO / "README.md").read_text("utf-8"), "Installing")
    kustomize_lines, helm_lines = (
        [line for line in body.splitlines() if line.strip()] for body in fenced_blocks(readme, "")
    )
    assert kustomize_lines == INSTALL
    assert helm_lines == BLOCKS["Helm install"]


def own_policy_install(root: Path, policy_text: str) -> list[str]:
    """The guide's "Install with your own policy" block, with the overlay laid out under
    ``root`` (the model resolves paths from the repository, so the overlay's is absolute)."""
    overlay = lay_out_overlay(root, policy_text)
    return [
        line.replace(OVERLAY_REF, str(overlay)) for line in BLOCKS["Install with your own policy"]
    ]


def test_an_install_with_your_own_policy_serves_it(tmp_path: Path) -> None:
    policy_text = (REPO / "policies/examples/labelled-pools.yaml").read_text("utf-8")
    cluster = play(Cluster(), own_policy_install(tmp_path, policy_text))
    assert cluster.get("ConfigMap", "gpu-admission", "gpu-admission-policy")["data"] == {
        "policy.yaml": policy_text
    }
    assert ("gpu-admission", "gpu-admission") in cluster.ready
    assert len([k for k in cluster.objects if k[0] in WEBHOOK_KINDS]) == 2


def test_an_install_with_a_policy_the_webhooks_do_not_cover_stops_before_the_cluster(
    tmp_path: Path,
) -> None:
    """The block's first line is no decoration: a policy judging a kind the webhook
    configurations are not sent stops the install before anything is applied."""
    policy = yaml.safe_load((REPO / "policies/default.yaml").read_text("utf-8"))
    policy["spec"]["workloads"] = [
        {"group": "example.com", "kind": "TrainingRun", "templates": ["spec.template"]}
    ]
    cluster = Cluster()
    with pytest.raises(StepFailed, match="is not sent to the validating webhook"):
        play(cluster, own_policy_install(tmp_path, yaml.safe_dump(policy)))
    assert cluster.objects == {}


@pytest.mark.parametrize(
    "commands",
    [INSTALL, AUDIT_INSTALL, BLOCKS["With cert-manager"]],
    ids=["kustomize", "audit overlay", "cert-manager"],
)
def test_an_install_never_leaves_a_fail_closed_webhook_unserved(commands: list[str]) -> None:
    cluster = play(Cluster(), commands)
    configs = [k for k in cluster.objects if k[0] in WEBHOOK_KINDS]
    assert len(configs) == 2  # it did install them
    assert all(
        hook["clientConfig"].get("caBundle")
        for k in configs
        for hook in cluster.objects[k]["webhooks"]
    )


def test_an_upgrade_keeps_the_ca_and_the_invariant() -> None:
    cluster = play(Cluster(), INSTALL)
    secret_ca = cluster.get("Secret", "gpu-admission", "gpu-admission-tls")["ca"]
    play(cluster, INSTALL)  # the same commands again, as the guide says
    assert cluster.get("Secret", "gpu-admission", "gpu-admission-tls")["ca"] == secret_ca


def test_an_uninstall_removes_the_webhooks_before_the_server() -> None:
    cluster = play(Cluster(), INSTALL)
    play(cluster, BLOCKS["Uninstall"])
    assert not [k for k in cluster.objects if k[0] in WEBHOOK_KINDS]
    assert cluster.get("Deployment", "gpu-admission", "gpu-admission") is None


# The model is no rubber stamp: the orders it must refuse.


def test_the_model_refuses_webhooks_applied_before_the_server_is_ready() -> None:
    with pytest.raises(Unsafe, match="no Ready server"):
        play(
            Cluster(),
            [
                "kubectl apply -k manifests/",
                "gpu-admission certs generate --out certs/prod",
                "kubectl kustomize manifests/webhooks | gpu-admission certs install "
                "--cert-dir certs/prod --manifests - | kubectl apply -f -",
            ],
        )


def test_the_model_refuses_webhooks_without_a_ca_bundle() -> None:
    commands = INSTALL[:-1] + ["kubectl apply -k manifests/webhooks"]
    with pytest.raises(Unsafe, match="no caBundle"):
        play(Cluster(), commands)


def test_the_model_refuses_a_rekeyed_ca() -> None:
    cluster = play(Cluster(), INSTALL)
    with pytest.raises(Unsafe, match="signed by"):
        play(
            cluster,
            [
                "gpu-admission certs generate --out certs/prod --force",
                "gpu-admission certs install --cert-dir certs/prod --validating '' --mutating ''",
            ],
        )


def test_the_model_refuses_waiting_for_a_server_without_its_secret() -> None:
    with pytest.raises(StepFailed, match="Secret gpu-admission-tls"):
        play(
            Cluster(),
            [
                "kubectl apply -k manifests/",
                "kubectl -n gpu-admission rollout status deployment/gpu-admission --timeout=5m",
            ],
        )


def test_the_model_refuses_counting_on_the_injector_for_the_first_calls() -> None:
    commands = BLOCKS["With cert-manager"][:2] + [
        "kubectl apply -k manifests/overlays/cert-manager/webhooks"
    ]
    with pytest.raises(Unsafe, match="no caBundle"):
        play(Cluster(), commands)


# ------------------------------------------------------------------ Helm
#
# Helm's behaviour, from its source (helm/helm v3.21.4 and main, v4): pkg/releaseutil
# kind_sorter.go (InstallOrder, UninstallOrder; kinds it does not list go after the ones it
# does, by kind name; v3 lists no webhook configuration kinds), pkg/action install.go,
# upgrade.go, uninstall.go and hooks.go:
# - install: pre-install hooks; every release object in InstallOrder, created one kind after
#   another without waiting for readiness; (no --wait: no wait); post-install hooks;
# - upgrade: pre-upgrade hooks; every object updated in InstallOrder (fields the chart leaves
#   out are kept; fields it sets are set); post-upgrade hooks;
# - uninstall: pre-delete hooks; every release object deleted in UninstallOrder; post-delete;
# - hooks run one at a time, by weight, then name, then kind order; a Job hook must complete
#   (else the release fails); "before-hook-creation" deletes the previous object of that name
#   first, "hook-succeeded" deletes it once every hook of the event succeeded.

INSTALL_ORDER_V3 = [
    "PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
    "PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
    "ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
    "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
    "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
    "DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
    "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
    "APIService",
]  # fmt: skip
INSTALL_ORDER_V4 = [
    *INSTALL_ORDER_V3,
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
]
UNINSTALL_ORDER_V3 = [
    "APIService", "Ingress", "IngressClass", "Service", "CronJob", "Job", "StatefulSet",
    "HorizontalPodAutoscaler", "Deployment", "ReplicaSet", "ReplicationController", "Pod",
    "DaemonSet", "RoleBindingList", "RoleBinding", "RoleList", "Role", "ClusterRoleBindingList",
    "ClusterRoleBinding", "ClusterRoleList", "ClusterRole", "CustomResourceDefinition",
    "PersistentVolumeClaim", "PersistentVolume", "StorageClass", "ConfigMap", "SecretList",
    "Secret", "ServiceAccount", "PodDisruptionBudget", "PodSecurityPolicy", "LimitRange",
    "ResourceQuota", "NetworkPolicy", "Namespace", "PriorityClass",
]  # fmt: skip
UNINSTALL_ORDER_V4 = [
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    *UNINSTALL_ORDER_V3,
]
HELM_ORDERS = {
    "helm3": (INSTALL_ORDER_V3, UNINSTALL_ORDER_V3),
    "helm4": (INSTALL_ORDER_V4, UNINSTALL_ORDER_V4),
}


def kind_sorted(objs: list[dict[str, Any]], order: list[str]) -> list[dict[str, Any]]:
    """Helm's sort: listed kinds in their order, then the others by kind name (stable)."""

    def rank(obj: dict[str, Any]) -> tuple[int, str]:
        kind = obj["kind"]
        return (order.index(kind), "") if kind in order else (len(order), kind)

    return sorted(objs, key=rank)


def hook_events(obj: dict[str, Any]) -> list[str]:
    annotation = (obj["metadata"].get("annotations") or {}).get("helm.sh/hook", "")
    return [event.strip() for event in annotation.split(",") if event.strip()]


def helm_render(chart: str, release: str, namespace: str, values: dict[str, Any]) -> list[dict]:
    import helm_python as helm

    helm.disable_logging()
    with helm.Chart.load(str(REPO / chart)) as loaded:
        out = loaded.render(values=values, name=release, namespace=namespace)
    return [
        doc
        for path, text in sorted(out.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@dataclass
class HelmRelease:
    name: str
    namespace: str
    manifest: list[dict[str, Any]]  # the release's own objects (hooks are not among them)
    hooks: list[dict[str, Any]]


class Helm:
    """``helm install|upgrade|uninstall`` on the model, with one Helm version's kind orders."""

    def __init__(self, cluster: Cluster, version: str) -> None:
        self.cluster = cluster
        self.install_order, self.uninstall_order = HELM_ORDERS[version]
        self.releases: dict[str, HelmRelease] = {}
        self.history: dict[str, list[HelmRelease]] = {}

    def run_hooks(self, release: HelmRelease, event: str) -> None:
        hooks = [h for h in release.hooks if event in hook_events(h)]
        weight = lambda h: int(h["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))  # noqa: E731
        hooks = kind_sorted(hooks, self.install_order)
        hooks.sort(key=lambda h: (weight(h), h["metadata"]["name"]))
        for hook in hooks:
            if "before-hook-creation" in self._policies(hook) or "" == self._policies(hook):
                self.cluster.delete(hook)
            self.cluster.apply(hook)
            if hook["kind"] == "Job":
                self.run_job(hook)
        for hook in reversed(hooks):
            if "hook-succeeded" in self._policies(hook):
                self.cluster.delete(hook)

    @staticmethod
    def _policies(hook: dict[str, Any]) -> str:
        return hook["metadata"]["annotations"].get("helm.sh/hook-delete-policy", "")

    def run_job(self, job: dict[str, Any]) -> None:
        spec = job["spec"]["template"]["spec"]
        namespace = job["metadata"]["namespace"]
        if self.cluster.get("ServiceAccount", namespace, spec["serviceAccountName"]) is None:
            raise StepFailed(f"Job {job['metadata']['name']}: no ServiceAccount to run as")
        [container] = spec["containers"]
        if container["args"][0] == "policy":
            check_policy(self.cluster, job)
        else:
            run_webhooks_command(self.cluster, container["args"])

    @staticmethod
    def render(name: str, chart: str, namespace: str, values: dict[str, Any]) -> HelmRelease:
        objs = helm_render(chart, name, namespace, values)
        for obj in objs:
            obj["metadata"].setdefault("namespace", namespace)
        return HelmRelease(
            name,
            namespace,
            [o for o in objs if not hook_events(o)],
            [o for o in objs if hook_events(o)],
        )

    def replace(self, current: HelmRelease, target: HelmRelease) -> None:
        """Apply ``target``'s objects, then delete those only ``current`` has (upgrade.go)."""
        for obj in kind_sorted(target.manifest, self.install_order):
            self.cluster.apply(obj)
        gone = {key(o) for o in current.manifest} - {key(o) for o in target.manifest}
        for obj in kind_sorted([o for o in current.manifest if key(o) in gone], self.install_order):
            self.cluster.delete(obj)

    def install(self, name: str, chart: str, namespace: str, values: dict[str, Any]) -> None:
        release = self.render(name, chart, namespace, values)
        self.run_hooks(release, "pre-install")
        for obj in kind_sorted(release.manifest, self.install_order):
            self.cluster.apply(obj)
        self.run_hooks(release, "post-install")
        self.releases[name] = release
        self.history[name] = [release]

    def upgrade(self, name: str, chart: str, namespace: str, values: dict[str, Any]) -> None:
        release = self.render(name, chart, namespace, values)
        self.run_hooks(release, "pre-upgrade")
        self.replace(self.releases[name], release)
        self.run_hooks(release, "post-upgrade")
        self.releases[name] = release
        self.history[name].append(release)

    def rollback(self, name: str, revision: int | None) -> None:
        """``helm rollback``: the stored revision's objects and hooks, not rendered again."""
        history = self.history[name]
        target = history[-2] if revision is None else history[revision - 1]
        self.run_hooks(target, "pre-rollback")
        self.replace(self.releases[name], target)
        self.run_hooks(target, "post-rollback")
        self.releases[name] = target
        history.append(target)

    def uninstall(self, name: str) -> None:
        release = self.releases.pop(name)
        self.run_hooks(release, "pre-delete")
        for obj in kind_sorted(release.manifest, self.uninstall_order):
            self.cluster.delete(obj)
        self.run_hooks(release, "post-delete")


def check_policy(cluster: Cluster, job: dict[str, Any]) -> None:
    """The check-policy hook: the real ``gpu-admission policy validate`` on the ConfigMap the
    Job mounts, as it is in the cluster when the Job runs."""
    spec = job["spec"]["template"]["spec"]
    namespace = job["metadata"]["namespace"]
    [volume] = [v for v in spec["volumes"] if "configMap" in v]
    config_map = cluster.get("ConfigMap", namespace, volume["configMap"]["name"])
    if config_map is None:
        raise StepFailed(f"check-policy: ConfigMap {volume['configMap']['name']} not found")
    with tempfile.TemporaryDirectory() as directory:
        policy = Path(directory) / "policy.yaml"
        policy.write_text(config_map["data"]["policy.yaml"])
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            status = cli_main(["policy", "validate", str(policy)])
    if status != 0:
        raise StepFailed(f"check-policy: the policy is refused:\n{output.getvalue()}")
    cluster.steps.append("check-policy: the policy is valid")


def run_webhooks_command(cluster: Cluster, args: list[str]) -> None:
    """What ``gpu-admission webhooks ...`` does (webhook/certs/activation.py), on the model."""
    command, options = args[1], dict(zip(args[2::2], args[3::2], strict=True))
    namespace = options.get("--namespace", "gpu-admission")
    secret_name = options.get("--secret", "gpu-admission-tls")
    if command == "bootstrap":
        existing = cluster.get("Secret", namespace, secret_name)
        if existing is not None and cluster.get("Secret", namespace, f"{secret_name}-ca") is None:
            raise StepFailed(f"bootstrap: Secret {secret_name} was not made by it")
        if existing is None:
            ca = cluster.new_ca("bootstrap")
            for name in (f"{secret_name}-ca", secret_name):
                cluster.apply(
                    {
                        "kind": "Secret",
                        "metadata": {"name": name, "namespace": namespace},
                        "ca": ca,
                        "self": ca,
                    }
                )
        return
    if command == "deactivate":
        config = cluster.get("ValidatingWebhookConfiguration", "", options["--validating"])
        for hook in config["webhooks"] if config else ():
            hook["failurePolicy"] = "Ignore"
        cluster.steps.append("deactivate: the validating webhook fails open")
        cluster.check()
        return
    assert command == "activate", args
    cluster.settle_controllers()
    secret = cluster.get("Secret", namespace, secret_name)
    if secret is None:
        raise StepFailed(f"activate: Secret {namespace}/{secret_name} not found")
    service = options["--service"]
    # It waits until /readyz answers with a certificate of the Secret's CA: the Deployment
    # behind the Service is Ready, with that Secret mounted.
    backing = [
        k[2]
        for k, obj in cluster.objects.items()
        if k[0] == "Deployment" and k[1] == namespace and tls_secret_of(obj) == secret_name
    ]
    if not backing:
        raise StepFailed(f"activate: no server behind Service {service} would ever answer")
    cluster.rollout_status(namespace, backing[0])
    policies = validating_failure_policies(
        options["--failure-policy"], options.get("--custom-resources-failure-policy", "Ignore")
    )
    for kind, option in (
        ("ValidatingWebhookConfiguration", "--validating"),
        ("MutatingWebhookConfiguration", "--mutating"),
    ):
        config = cluster.get(kind, "", options[option])
        for hook in config["webhooks"]:
            hook.setdefault("clientConfig", {})["caBundle"] = secret["ca"]
            if kind == "ValidatingWebhookConfiguration":
                hook["failurePolicy"] = policies.get(hook["name"], policies[""])
        cluster.steps.append(f"activate {kind}")
        cluster.check()


def helm_command(helm: Helm, words: list[str]) -> None:
    match words:
        case ["helm", "install" | "upgrade" as action, name, chart, *rest]:
            namespace, values = "default", {}
            pairs = iter(rest)
            for flag in pairs:
                if flag == "--namespace":
                    namespace = next(pairs)
                elif flag == "--timeout":
                    next(pairs)  # how long Helm waits for hooks: the model does not wait
                elif flag == "--set":
                    path, value = next(pairs).split("=", 1)
                    target = values
                    *parents, leaf = path.split(".")
                    for parent in parents:
                        target = target.setdefault(parent, {})
                    target[leaf] = {"true": True, "false": False}.get(value, value)
                else:
                    raise AssertionError(f"the model does not know {flag}")
            getattr(helm, action)(name, chart, namespace, values)
        case ["helm", "uninstall", name, "--namespace", _, *_]:
            helm.uninstall(name)
        case ["helm", "rollback", name, *rest]:
            revision = next((int(word) for word in rest if word.isdigit()), None)
            helm.rollback(name, revision)
        case ["kubectl", "create", "namespace", namespace]:
            helm.cluster.apply({"kind": "Namespace", "metadata": {"name": namespace}})
        case ["kubectl", "label", "namespace", _, *_]:
            pass  # labels the namespace: nothing the invariant reads
        case _:
            run_one(helm.cluster, words, None, None)


def play_helm(helm: Helm, commands: list[str]) -> Helm:
    for line in commands:
        helm.cluster.steps.append(f"$ {line}")
        helm_command(helm, shlex.split(line))
    return helm


HELM_BLOCKS = {label: lines for label, lines in BLOCKS.items() if label.startswith("Helm")}


def test_the_guide_has_the_helm_blocks_this_test_plays() -> None:
    assert set(HELM_BLOCKS) == {
        "Helm install",
        "Helm upgrade",
        "Helm rollback",
        "Helm uninstall",
        "Helm with cert-manager",
    }, BLOCKS


@pytest.mark.parametrize("version", list(HELM_ORDERS))
def test_a_helm_install_upgrade_and_uninstall_never_leave_the_webhook_unserved(
    version: str,
) -> None:
    helm = play_helm(Helm(Cluster(), version), HELM_BLOCKS["Helm install"])
    validating = helm.cluster.get("ValidatingWebhookConfiguration", "", "gpu-admission")
    # Activated: the first entry fails closed; the custom kinds' and the claims' fail open.
    assert [(h["name"], h["failurePolicy"]) for h in validating["webhooks"]] == [
        ("validate.gpu-admission.io", "Fail"),
        (WORKLOADS_WEBHOOK, "Ignore"),
        (CLAIMS_WEBHOOK, "Ignore"),
    ]
    ca = helm.cluster.get("Secret", "gpu-admission", "gpu-admission-tls")["ca"]
    play_helm(helm, HELM_BLOCKS["Helm upgrade"])
    # The upgrade re-ran the bootstrap hook: the CA is the one the install made.
    assert helm.cluster.get("Secret", "gpu-admission", "gpu-admission-tls")["ca"] == ca
    play_helm(helm, HELM_BLOCKS["Helm rollback"])
    validating = helm.cluster.get("ValidatingWebhookConfiguration", "", "gpu-admission")
    assert validating["webhooks"][0]["failurePolicy"] == "Fail"  # activated again
    assert validating["webhooks"][0]["clientConfig"]["caBundle"] == ca
    play_helm(helm, HELM_BLOCKS["Helm uninstall"])
    assert not [k for k in helm.cluster.objects if k[0] in WEBHOOK_KINDS]


@pytest.mark.parametrize("version", list(HELM_ORDERS))
def test_a_helm_install_with_cert_manager_never_leaves_the_webhook_unserved(version: str) -> None:
    helm = play_helm(Helm(Cluster(), version), HELM_BLOCKS["Helm with cert-manager"])
    validating = helm.cluster.get("ValidatingWebhookConfiguration", "", "gpu-admission")
    assert validating["webhooks"][0]["failurePolicy"] == "Fail"


def test_the_model_refuses_a_chart_whose_webhooks_fail_closed_from_the_start() -> None:
    # Without the activation hook's ordering (a chart installing the webhook with Fail), the
    # webhook would be registered right after the Deployment, before any Pod is Ready.
    helm = Helm(Cluster(), "helm4")
    play_helm(helm, HELM_BLOCKS["Helm install"][:-1])
    original = helm_render

    def failing_closed(*args: Any) -> list[dict]:
        objs = original(*args)
        for obj in objs:
            if obj["kind"] == "ValidatingWebhookConfiguration":
                obj["webhooks"][0]["failurePolicy"] = "Fail"
                obj["webhooks"][0]["clientConfig"]["caBundle"] = "CA#0 (bootstrap)"
        return objs

    globals()["helm_render"] = failing_closed
    try:
        with pytest.raises(Unsafe, match="no Ready server"):
            play_helm(helm, HELM_BLOCKS["Helm install"][-1:])
    finally:
        globals()["helm_render"] = original


def test_the_model_refuses_an_uninstall_without_the_deactivation_hook() -> None:
    # Helm 3 deletes webhook configurations after the Deployment: without the pre-delete hook
    # the fail-closed webhook would outlive its server.
    helm = play_helm(Helm(Cluster(), "helm3"), HELM_BLOCKS["Helm install"])
    release = helm.releases["gpu-admission"]
    release.hooks = [h for h in release.hooks if "pre-delete" not in hook_events(h)]
    with pytest.raises(Unsafe, match="no Ready server|calls Service"):
        helm.uninstall("gpu-admission")


def _policy_allowing(path: str) -> str:
    text = (Path(__file__).resolve().parents[1] / "policies" / "default.yaml").read_text()
    return text.replace(
        "  newChecks: Warn\n", f"  newChecks: Warn\n  hostDevices: {{allowedPaths: [{path}]}}\n"
    )


def test_a_policy_the_server_would_drop_an_entry_of_fails_the_install_before_anything_changes():
    helm = Helm(Cluster(), "helm4")
    helm.cluster.apply({"kind": "Namespace", "metadata": {"name": "gpu-admission"}})
    with pytest.raises(StepFailed, match="/mnt' can never be allowed"):
        helm.install(
            "gpu-admission",
            "manifests/chart",
            "gpu-admission",
            {"policy": {"inline": _policy_allowing("/mnt")}},
        )
    assert not [k for k in helm.cluster.objects if k[0] in (*WEBHOOK_KINDS, "Deployment")]


def test_an_upgrade_to_such_a_policy_fails_before_the_release_changes():
    helm = play_helm(Helm(Cluster(), "helm4"), HELM_BLOCKS["Helm install"])
    before = helm.cluster.get("ConfigMap", "gpu-admission", "gpu-admission-policy")["data"]
    with pytest.raises(StepFailed, match="/mnt' can never be allowed"):
        helm.upgrade(
            "gpu-admission",
            "manifests/chart",
            "gpu-admission",
            {"policy": {"inline": _policy_allowing("/mnt")}},
        )
    assert helm.cluster.get("ConfigMap", "gpu-admission", "gpu-admission-policy")["data"] == before
    # A data directory passes the check.
    helm.upgrade(
        "gpu-admission",
        "manifests/chart",
        "gpu-admission",
        {"policy": {"inline": _policy_allowing("/mnt/datasets")}},
    )
    data = helm.cluster.get("ConfigMap", "gpu-admission", "gpu-admission-policy")["data"]
    assert "allowedPaths: [/mnt/datasets]" in data["policy.yaml"]
