"""Allowed host paths that can never be allowed: refused by ``policy validate``, dropped at load
with an error line and a metric (a replica must not crash-loop on a policy valid yesterday),
and the paths they would have covered refused. Allowed paths holding other tenants' data are
warned."""

from __future__ import annotations

import json
import posixpath
import textwrap

import pytest

import webhook
from tests.serving import Server, make_certificates, metric_value, post_json
from tests.support.admission import admission, container, host_path, pod
from tests.support.paths import REPO
from webhook.cli.main import main
from webhook.policy.hostpaths import NODE_CONTROL, TENANT_DATA

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def allowing(*paths: str) -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: gpu-admission.io/v1alpha1
        kind: GPUAdmissionPolicy
        metadata: {{name: allow}}
        spec:
          gpuNodeTaints: [{{key: nvidia.com/gpu, value: present, effect: NoSchedule}}]
          hostDevices:
            allowedPaths: [{", ".join(paths)}]
        """
    )


def lint(path: str) -> list[webhook.PolicyWarning]:
    return [w for w in webhook.parse_policy(allowing(path)).warnings if w.level != "info"]


NEVER = sorted(
    {"/", "/mnt", "/var", "/opt", "/home", "/var/lib"}
    | {entry.path for entry in NODE_CONTROL}
    | {posixpath.dirname(entry.path) for entry in NODE_CONTROL}
    | {entry.path + "/below" for entry in NODE_CONTROL}
)


@pytest.mark.parametrize("path", NEVER)
def test_a_node_control_path_or_a_parent_of_one_is_never_allowed(path):
    found = lint(path)
    assert [w.level for w in found] == ["error"], found
    assert "can never be allowed" in found[0].message
    assert webhook.parse_policy(allowing(path)).host_path_allow_list == ()


def test_the_reason_names_what_the_path_holds():
    (found,) = lint("/mnt")
    assert "/mnt contains /mnt/k8s-disks" in found.message
    assert found.path == "spec.hostDevices.allowedPaths[0]"


@pytest.mark.parametrize("path", ["/raid/datasets", "/data", "/mnt/datasets", "/scratch"])
def test_data_directories_may_be_allowed(path):
    assert lint(path) == []
    assert webhook.parse_policy(allowing(path)).host_path_allow_list == (path,)


@pytest.mark.parametrize("path", sorted({e.path for e in TENANT_DATA} | {"/mnt/disks/ssd0"}))
def test_a_directory_of_other_tenants_volumes_is_warned(path):
    found = lint(path)
    assert [w.level for w in found] == ["warning"], found
    assert "other tenants' data" in found[0].message


def test_the_shipped_strict_policy_passes_the_lint():
    strict = webhook.load_policy(REPO / "policies" / "examples" / "strict.yaml")
    assert [w for w in strict.warnings if w.level != "info"] == []


def test_policy_validate_refuses_a_never_allowed_path(tmp_path, capsys):
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(allowing("/data", "/mnt"))
    assert main(["policy", "validate", str(policy_file)]) == 1
    out = capsys.readouterr().out
    assert f"{policy_file}:7: spec.hostDevices.allowedPaths[1]: '/mnt' can never be allowed" in out
    assert "invalid, 1 error" in out


# strict.yaml as version 0.1.0 shipped it, its allow-list holding /mnt.
YESTERDAYS_STRICT = (REPO / "tests" / "fixtures" / "strict-0.1.0.yaml").read_text("utf-8")


def test_a_server_with_yesterdays_strict_policy_serves_and_drops_the_entry(tmp_path):
    assert "allowedPaths: [/data, /scratch, /mnt]" in YESTERDAYS_STRICT
    policy_file = tmp_path / "strict.yaml"
    policy_file.write_text(YESTERDAYS_STRICT)
    certificates = make_certificates(tmp_path / "pki")
    server = Server(
        policy=policy_file,
        cert=certificates.tls_cert,
        key=certificates.tls_key,
        ca=certificates.ca_cert,
        log_path=tmp_path / "server.log",
    )
    with server.start():
        conn = server.connection()
        for path in ("/mnt/k8s-disks/0", "/mnt/models", "/data/sets"):
            obj = pod(container(gpu=1), volumes=[host_path(path)], tolerations=[GPU_TOLERATION])
            reply = post_json(conn, "/validate", json.dumps(admission(obj)).encode()).json()
            assert reply["response"]["allowed"] is (path == "/data/sets"), path
        assert metric_value(server.metrics(), "gpu_admission_policy_dropped_entries") == 1
        dropped = [r for r in server.log_records() if r.get("message") == "policy entry dropped"]
        assert len(dropped) == 1 and dropped[0]["level"] == "error"
        assert "/mnt contains /mnt/k8s-disks" in dropped[0]["warning"]
