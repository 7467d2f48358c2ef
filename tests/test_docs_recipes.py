"""The recipes of the user documentation, run as written: the kustomize overlay of
``docs/installing.md`` that ships one's own policy ("Your own policy with kustomize"), laid
out beside the repository as the guide says and rendered by the real ``kubectl kustomize``
(its install block is played against the install model in ``tests/test_install_order.py``);
and the README's denial, which is the webhook's word for word."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import yaml

import webhook
from tests.support.docs import fenced_blocks, lay_out_overlay, overlay_kustomization
from tests.support.kube import kustomize
from tests.support.paths import REPO
from webhook.cli.main import main as cli_main

POLICY_NAME = "gpu-admission-policy"
# A policy that is not the default one: pools, a reserved pool, GPU defaults.
CUSTOM_POLICY = REPO / "policies" / "examples" / "labelled-pools.yaml"


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def rendered(tmp_path: Path) -> tuple[list[dict[str, Any]], str]:
    policy_text = CUSTOM_POLICY.read_text("utf-8")
    return kustomize(lay_out_overlay(tmp_path, policy_text)), policy_text


def test_the_overlay_replaces_the_policy_configmap_with_yours(tmp_path: Path) -> None:
    objects, policy_text = rendered(tmp_path)
    (configmap,) = by_kind(objects, "ConfigMap")
    assert configmap["metadata"]["name"] == POLICY_NAME
    assert configmap["metadata"]["namespace"] == "gpu-admission"
    assert configmap["data"] == {"policy.yaml": policy_text}
    # Everything else is the manifests' own: the overlay adds and drops nothing.
    base = kustomize("manifests")
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in base
    )


def test_the_deployment_mounts_the_generated_configmap_and_reads_its_file(
    tmp_path: Path,
) -> None:
    objects, _ = rendered(tmp_path)
    (configmap,) = by_kind(objects, "ConfigMap")
    (deployment,) = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    volumes = [v for v in pod["volumes"] if "configMap" in v]
    assert [v["configMap"]["name"] for v in volumes] == [configmap["metadata"]["name"]]
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == volumes[0]["name"])
    assert "subPath" not in mount  # a subPath mount never sees the policy change
    args = container["args"]
    served = args[args.index("--policy") + 1]
    assert served == f"{mount['mountPath']}/policy.yaml"
    assert container["image"] == "registry.example.com/gpu-admission:0.1.0"


def test_the_recipe_names_the_bases_generator() -> None:
    """The overlay replaces the generator the base declares, by its name: a renamed base
    generator would make ``behavior: replace`` fail rather than ship the default policy."""
    base = yaml.safe_load((REPO / "manifests/base/kustomization.yaml").read_text("utf-8"))
    recipe = yaml.safe_load(overlay_kustomization())
    (generator,) = recipe["configMapGenerator"]
    assert generator["behavior"] == "replace"
    assert generator["name"] in [g["name"] for g in base["configMapGenerator"]]
    assert generator["files"] == ["policy.yaml"]
    assert recipe["images"][0]["name"] in [i["name"] for i in base["images"]]


def test_policy_validate_accepts_the_overlays_policy_against_the_webhooks(tmp_path: Path) -> None:
    overlay = lay_out_overlay(tmp_path, CUSTOM_POLICY.read_text("utf-8"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli_main(
            [
                "policy",
                "validate",
                str(overlay / "policy.yaml"),
                "--manifests",
                str(REPO / "manifests" / "webhooks"),
            ]
        )
    assert status == 0, out.getvalue()
    assert "valid (the webhook rules in" in out.getvalue()


def test_the_readmes_denial_is_what_the_webhook_answers() -> None:
    """The README's first example: a Pod with a misspelt MIG resource and a privileged
    container, created in a tenant namespace under the default policy."""
    shown = fenced_blocks((REPO / "README.md").read_text("utf-8"), "")[0]
    message = re.sub(r"\s+", " ", shown.split("denied the request: ", 1)[1]).strip()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "securityContext": {"privileged": True},
                    "resources": {"limits": {"nvidia.com/mig-1g10gb": "1"}},
                }
            ]
        },
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0e1f6d4c-2b1a-4c3e-9d8f-7a6b5c4d3e2f",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": pod,
        },
    }
    policy = webhook.load_policy(REPO / "policies" / "default.yaml")
    response = webhook.review(review, policy, mutate=False)["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == message
