"""host-devices: no hostPath volumes that expose GPU device nodes."""

from __future__ import annotations

import pytest

from .conftest import (
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
    ],
)
def test_gpu_device_paths_are_denied(raw, normalised):
    decision = validate(gpu_pod_with(raw))
    assert not decision.allowed
    assert denied(decision) == [("host-devices", PATH)]
    message = status_message(decision)
    assert message.startswith(f'{PATH}: Invalid value: "{raw}": hostPath volume "v0" mounts ')
    if normalised:
        assert f'(that is "{normalised}")' in message
    assert "bypasses the device plugin" in message


@pytest.mark.parametrize(
    "raw",
    [
        "/dev/null",
        "/dev/sda",
        "/dev/shm",
        "/devices",
        "/device",
        "/var/lib/kubelet/device-plugins",
        "/run/nvidia/driver",
        "/tmp",
    ],
)
def test_other_host_paths_are_allowed(raw):
    assert_allowed_clean(validate(gpu_pod_with(raw)))


def test_non_host_path_volumes_are_ignored():
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "odd", "hostPath": {"type": "Directory"}},
    ]
    assert_allowed_clean(validate(pod(container(gpu=1), volumes=volumes)))


def test_every_bad_volume_is_reported_at_its_index():
    decision = validate(gpu_pod_with("/tmp", "/dev", "/dev/null", "/dev/nvidia0"))
    assert denied(decision) == [
        ("host-devices", "spec.volumes[1].hostPath.path"),
        ("host-devices", "spec.volumes[3].hostPath.path"),
    ]


DRI = policy(BASE_SPEC + "hostDevices: {paths: [/dev/dri]}")


@pytest.mark.parametrize("raw", ["/dev/dri", "/dev/dri/card0", "/dev/dri/", "//dev/dri/renderD128"])
def test_policy_paths_and_everything_below_them_are_denied(raw):
    decision = validate(gpu_pod_with(raw), DRI)
    assert denied(decision) == [("host-devices", PATH)]


@pytest.mark.parametrize("raw", ["/dev/drivers", "/dev/dr"])
def test_policy_paths_do_not_match_mere_prefixes(raw):
    assert_allowed_clean(validate(gpu_pod_with(raw), DRI))


def test_policy_paths_only_apply_under_that_policy():
    assert_allowed_clean(validate(gpu_pod_with("/dev/dri/card0")))


def test_non_gpu_pod_is_audited_by_default_and_denied_when_enforced():
    obj = pod(container(), volumes=[host_path("/dev")])
    audited = validate(obj)
    assert audited.allowed
    assert by_mode(audited, "Audit") == [("host-devices", PATH)]

    strict = policy(BASE_SPEC + "rules: {host-devices: {otherPods: Enforce}}")
    assert denied(validate(obj, strict)) == [("host-devices", PATH)]


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_every_kind(kind):
    good = validate(kind.wrap(template(container(gpu=1), volumes=[host_path("/dev/null")])))
    assert good.allowed
    assert "host-devices" not in {f.rule for f in good.findings}

    bad = kind.wrap(template(container(gpu=1), volumes=[host_path("/dev/./nvidia0")]))
    decision = validate(bad)
    assert not decision.allowed
    assert denied(decision) == [("host-devices", f"{kind.prefix}spec.volumes[0].hostPath.path")]
