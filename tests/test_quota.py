"""``gpu-admission quota``: the ResourceQuotas a policy's entitlements imply, valid for the
API server: requests at the tenant's maxGPUs, 0 for declared GPU resources it may not use."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.patching import K8S_VERSION
from webhook.cli.main import main

POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata: {name: quotas}
spec:
  gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
  resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
  pools:
    - name: inference
      nodeSelector: {example.com/pool: inference}
      taints: [{key: example.com/pool, value: inference, effect: NoSchedule}]
      resources: [{name: nvidia.com/mig-1g.10gb, sharing: MIG}]
  tenants:
    - namespaces: [inference-chat, inference-*]
      entitlements:
        resources: [nvidia.com/mig-1g.10gb]
        maxGPUs: {nvidia.com/mig-1g.10gb: 14}
    - namespaces: [training]
      entitlements:
        maxGPUs: {nvidia.com/gpu: 64}
    - namespaces: [research]
      entitlements:
        maxGPUsPerPod: 8
"""


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def quotas(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    assert main(["quota", *args]) == 0
    return [doc for doc in yaml.safe_load_all(capsys.readouterr().out) if doc]


def test_each_named_namespace_gets_the_quota_its_entitlements_imply(
    policy_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = quotas(capsys, "--policy", str(policy_path))
    # inference-* names no namespace, and research's entitlements imply no quota.
    assert [(q["metadata"]["namespace"], q["spec"]["hard"]) for q in found] == [
        (
            "inference-chat",
            {"requests.nvidia.com/gpu": "0", "requests.nvidia.com/mig-1g.10gb": "14"},
        ),
        ("training", {"requests.nvidia.com/gpu": "64"}),
    ]
    for quota in found:
        kubernetes_validate.validate(quota, K8S_VERSION, strict=True)
        assert quota["metadata"]["name"] == "gpu-admission-gpus"
        assert quota["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpu-admission"}
    assert found[0]["metadata"]["annotations"]["gpu-admission.io/tenant"] == (
        "quotas: tenants[0] (inference-chat, inference-*)"
    )


def test_namespaces_given_by_name_match_the_globs(
    policy_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = quotas(capsys, "--policy", str(policy_path), "-n", "inference-eval", "-n", "web")
    assert [q["metadata"]["namespace"] for q in found] == ["inference-eval"]


def test_json_is_a_list(policy_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quota", "--policy", str(policy_path), "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["kind"] == "List" and len(document["items"]) == 2


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["quota", "--help"])
    assert exit_info.value.code == 0
    assert "examples:\n  gpu-admission quota" in capsys.readouterr().out


def test_a_tenant_selected_by_label_is_found_as_the_webhook_finds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The quota is the tenant's the webhook judges the namespace by: with its labels, an
    entry that selects it by label comes before a broader named one; without them, the
    namespace is judged by name, and a note says so."""
    path = tmp_path / "policy.yaml"
    path.write_text(
        POLICY.replace(
            "  tenants:\n",
            "  tenants:\n"
            "    - namespaceSelector: {matchLabels: {team: vision}}\n"
            "      entitlements: {maxGPUs: {nvidia.com/gpu: 4}}\n"
            "    - namespaces: [vision]\n"
            "      entitlements: {maxGPUs: {nvidia.com/gpu: 16}}\n",
        )
    )
    args = ("--policy", str(path), "-n", "vision")
    [labelled] = quotas(capsys, *args, "-l", "team=vision")
    assert labelled["spec"]["hard"] == {"requests.nvidia.com/gpu": "4"}
    assert "tenants[0]" in labelled["metadata"]["annotations"]["gpu-admission.io/tenant"]
    assert main(["quota", *args]) == 0
    out, err = capsys.readouterr()
    [by_name] = [doc for doc in yaml.safe_load_all(out) if doc]
    assert by_name["spec"]["hard"] == {"requests.nvidia.com/gpu": "16"}
    assert "select namespaces by label" in err
    assert main(["quota", *args, "-l", "team"]) == 2
