"""host-devices: no hostPath volumes that expose the node's devices or control paths."""

from __future__ import annotations

import pytest

from tests.support.admission import (
    BASE_SPEC,
    KIND_IDS,
    KINDS,
    assert_allowed_clean,
    by_mode,
    container,
    denied,
    host_path,
    pod,
    policy,
    status_message,
    template,
    validate,
    warnings,
)

PATH = "spec.volumes[0].hostPath.path"


def gpu_pod_with(*paths: str, **kwargs) -> dict:
    volumes = [host_path(p, name=f"v{i}") for i, p in enumerate(paths)]
    return pod(container(gpu=1), volumes=volumes, **kwargs)


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("/", None),
        ("/dev", None),
        ("/dev/", "/dev"),
        ("//dev", "/dev"),
        ("/dev/./nvidia0", "/dev/nvidia0"),
        ("//dev/./nvidia0/", "/dev/nvidia0"),
        ("/dev/../dev/nvidia0", "/dev/nvidia0"),
        ("/var/..", "/"),
        ("/dev/nvidia0", None),
        ("/dev/nvidiactl", None),
        ("/dev/nvidia-uvm", None),
        ("/dev/nvidia-caps/x", None),
        ("/dev/nvidia-caps", None),
        ("/dev/null", None),
        ("/dev/char", None),
        ("/dev/char/195:0", None),
        ("/dev/block", None),
        ("/dev/shm", None),
        ("/proc", None),
        ("/proc/1/root", None),
        ("/proc/self/root/dev", None),
        ("/sys", None),
        ("/sys/bus/pci/devices", None),
        ("/etc", None),
        ("/etc/kubernetes/pki", None),
        ("/boot", None),
        ("/root/.ssh", None),
        ("/run/containerd/containerd.sock", None),
        ("/var/run/containerd/containerd.sock", "/run/containerd/containerd.sock"),
        ("/var/lib/containerd", None),
        ("/run/crio/crio.sock", None),
        ("/var/run/crio", "/run/crio"),
        ("/var/run/docker.sock", "/run/docker.sock"),
        ("/var/lib/docker", None),
        ("/var/run/cri-dockerd.sock", "/run/cri-dockerd.sock"),
        ("/var/lib/kubelet", None),
        ("/var/lib/kubelet/device-plugins", None),
        ("/var/lib/kubelet/pod-resources/kubelet.sock", None),
        ("/run/nvidia/driver", None),
        ("/var/log", None),
        ("/var/log/pods", None),
        ("/var/run/nri/nri.sock", "/run/nri/nri.sock"),
        ("/opt/nri/plugins", None),
        ("/var/run/cdi", "/run/cdi"),
        ("/etc/cdi", None),
        ("/run/k0s/containerd.sock", None),
        ("/mnt/stateful_partition/var_overlay/lib/kubelet", None),
        ("/var/spool/cron", None),
        ("/run/udev/rules.d", None),
        ("/home/ubuntu/.ssh", None),
        ("/run/snapd.socket", None),
        ("/run/host-containerd", None),
        ("/opt/bin", None),
        ("/var/lib/cloud/scripts/per-boot", None),
        ("/run/user/0", None),
        ("/var/run", "/run"),
        ("/var", None),
        ("/var/lib", None),
        ("/run", None),
        ("dev/nvidia0", None),
        ("tmp", None),
    ],
)
def test_host_device_and_control_paths_are_denied(raw, normalised):
    decision = validate(gpu_pod_with(raw))
    assert not decision.allowed
    assert denied(decision) == [("host-devices", PATH)]
    message = status_message(decision)
    assert message.startswith(f'{PATH}: Invalid value: "{raw}": hostPath volume "v0" mounts ')
    if normalised:
        assert f'(that is "{normalised}")' in message
    # A GPU Pod is told how to ask for a GPU where it mounted a device tree, not elsewhere.
    device = (normalised or raw).startswith(("/dev", "/sys", "/proc", "/run/nvidia"))
    assert ("request GPUs in resources.limits" in message) is device


def test_a_parent_path_names_what_it_exposes():
    message = status_message(validate(gpu_pod_with("/var/run")))
    assert "/run/containerd: containerd's socket" in message


DATA_DIRECTORIES = [
    "/data",
    "/mnt/datasets",
    "/scratch",
    "/devices",
    "/device",
    "/tmp",
    "/var/logs",
]
LISTED = policy(BASE_SPEC + f"hostDevices: {{allowedPaths: [{', '.join(DATA_DIRECTORIES)}]}}")


@pytest.mark.parametrize("raw", DATA_DIRECTORIES + ["/opt/x"])
def test_data_directories_are_warned_while_the_policy_lists_none(raw):
    decision = validate(gpu_pod_with(raw))
    assert decision.allowed
    assert by_mode(decision, "Warn") == [("host-devices", PATH)]
    violation = decision.findings[0].violation
    assert "not on the policy's allowed host paths (none are listed)" in violation.message
    assert "spec.hostDevices.allowedPaths" in violation.hint


@pytest.mark.parametrize("raw", DATA_DIRECTORIES)
def test_data_directories_the_policy_lists_are_allowed(raw):
    assert_allowed_clean(validate(gpu_pod_with(raw), LISTED))


def test_unlisted_paths_are_denied_once_new_checks_are_enforced():
    enforced = policy(BASE_SPEC + "newChecks: Enforce")
    decision = validate(gpu_pod_with("/data"), enforced)
    assert denied(decision) == [("host-devices", PATH)]


def test_non_host_path_volumes_are_ignored():
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "odd", "hostPath": {"type": "Directory"}},
    ]
    assert_allowed_clean(validate(pod(container(gpu=1), volumes=volumes)))


def test_every_bad_volume_is_reported_at_its_index():
    decision = validate(gpu_pod_with("/tmp", "/dev", "/data", "/dev/nvidia0"))
    assert denied(decision) == [
        ("host-devices", "spec.volumes[1].hostPath.path"),
        ("host-devices", "spec.volumes[3].hostPath.path"),
    ]


OPT = policy(BASE_SPEC + "hostDevices: {paths: [/opt/nvidia]}")


@pytest.mark.parametrize("raw", ["/opt/nvidia", "/opt/nvidia/lib", "/opt/nvidia/", "/opt"])
def test_policy_paths_below_and_above_them_are_denied(raw):
    decision = validate(gpu_pod_with(raw), OPT)
    assert denied(decision) == [("host-devices", PATH)]


@pytest.mark.parametrize("raw", ["/opt/nvidiax", "/opt/nvid"])
def test_policy_paths_do_not_match_mere_prefixes(raw):
    decision = validate(gpu_pod_with(raw), OPT)
    assert decision.allowed and "policy lists" not in " ".join(warnings(decision))


def test_policy_paths_only_apply_under_that_policy():
    assert_allowed_clean(validate(gpu_pod_with("/opt/nvidia/lib"), LISTED_OPT))


LISTED_OPT = policy(BASE_SPEC + "hostDevices: {allowedPaths: [/opt/nvidia]}")


ALLOW_LIST = policy(BASE_SPEC + "hostDevices: {allowedPaths: [/data, /scratch]}")


@pytest.mark.parametrize("raw", ["/data", "/data/sets", "/scratch/", "//data/./x"])
def test_allow_list_mode_admits_only_the_listed_paths(raw):
    assert_allowed_clean(validate(gpu_pod_with(raw), ALLOW_LIST))


@pytest.mark.parametrize("raw", ["/tmp", "/var/log", "/datasets", "/mnt", "/dev/null"])
def test_allow_list_mode_refuses_the_rest(raw):
    decision = validate(gpu_pod_with(raw), ALLOW_LIST)
    assert denied(decision) == [("host-devices", PATH)]


def test_pod_that_reaches_no_gpu_node_is_audited_by_default_and_denied_when_enforced():
    obj = pod(container(), volumes=[host_path("/etc")])
    audited = validate(obj)
    assert audited.allowed
    assert by_mode(audited, "Audit") == [("host-devices", PATH)]

    strict = policy(BASE_SPEC + "rules: {host-devices: {otherPods: Enforce}}")
    assert denied(validate(obj, strict)) == [("host-devices", PATH)]


@pytest.mark.parametrize(
    "device", ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-caps", "/dev/char", "/dev/dri"]
)
def test_mounting_a_gpu_device_makes_the_pod_reach_gpu_nodes(device):
    decision = validate(pod(container(), volumes=[host_path(device)]))
    assert denied(decision) == [("host-devices", PATH)]
    message = status_message(decision)
    assert f"the Pod can reach GPU nodes (it mounts the host's {device})" in message
    assert "request GPUs" not in message
    assert "exempt its namespace" in message


@pytest.mark.parametrize("raw", ["/dev", "/proc", "/sys", "/"])
def test_mounting_the_host_alone_does_not_bring_a_pod_onto_gpu_nodes(raw):
    decision = validate(pod(container(), volumes=[host_path(raw)]))
    assert decision.allowed
    assert by_mode(decision, "Audit") == [("host-devices", PATH)]


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_every_kind(kind):
    good = validate(kind.wrap(template(container(gpu=1), volumes=[host_path("/data")])), LISTED)
    assert good.allowed
    assert "host-devices" not in {f.rule for f in good.findings}

    bad = kind.wrap(template(container(gpu=1), volumes=[host_path("/dev/./nvidia0")]))
    decision = validate(bad)
    assert not decision.allowed
    assert denied(decision) == [("host-devices", f"{kind.prefix}spec.volumes[0].hostPath.path")]
