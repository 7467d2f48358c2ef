"""device-visibility: no device-visibility tricks (env variables, envFrom, CDI annotations)."""

from __future__ import annotations

import jsonpatch
import pytest

from tests.support.admission import (
    BASE_SPEC,
    CONTAINER_LISTS,
    KIND_IDS,
    KINDS,
    assert_allowed_clean,
    by_mode,
    container,
    denied,
    host_path,
    mutate,
    place,
    pod,
    policy,
    status_message,
    template,
    validate,
    warnings,
)

ENV0 = "spec.containers[0].env[0]"
ENV_FROM = [{"configMapRef": {"name": "settings"}}]


@pytest.mark.parametrize("value", ["all", "0", "GPU-6f1c2b3a", "0,1", ""])
def test_non_gpu_container_setting_visible_devices_is_denied(value):
    decision = validate(pod(container("side", env={"NVIDIA_VISIBLE_DEVICES": value})))
    assert not decision.allowed
    assert denied(decision) == [("device-visibility", f"{ENV0}.value")]
    assert status_message(decision).startswith(
        f'{ENV0}.value: Invalid value: "{value}": container "side" must not set '
        "NVIDIA_VISIBLE_DEVICES: NVIDIA_VISIBLE_DEVICES can expose GPUs the scheduler never "
        "allocated, and the Pod can reach GPU nodes (it sets NVIDIA_VISIBLE_DEVICES)"
    )


@pytest.mark.parametrize("value", ["void", "none"])
def test_void_and_none_are_allowed(value):
    obj = pod(container("side", env={"NVIDIA_VISIBLE_DEVICES": value}))
    assert_allowed_clean(validate(obj))


@pytest.mark.parametrize("value", ["VOID", " void ", "None", "void,0"])
def test_only_the_exact_words_void_and_none_hide_every_gpu(value):
    # The toolkit compares the value as written: anything else is a device list.
    obj = pod(container("side", env={"NVIDIA_VISIBLE_DEVICES": value}))
    assert denied(validate(obj)) == [("device-visibility", f"{ENV0}.value")]


def test_driver_capabilities_are_denied_whatever_the_value():
    obj = pod(container("side", env={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}))
    decision = validate(obj)
    assert denied(decision) == [("device-visibility", f"{ENV0}.value")]
    assert "must not set NVIDIA_DRIVER_CAPABILITIES" in status_message(decision)


def test_value_from_is_denied_because_it_cannot_be_checked():
    env = [
        {"name": "PATH", "value": "/bin"},
        {
            "name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {"configMapKeyRef": {"name": "gpu", "key": "devices"}},
        },
    ]
    decision = validate(pod(container("side", env=env)))
    path = "spec.containers[0].env[1].valueFrom"
    assert denied(decision) == [("device-visibility", path)]
    assert status_message(decision).startswith(
        f'{path}: Forbidden: container "side" sets NVIDIA_VISIBLE_DEVICES from valueFrom, '
        "which cannot be checked"
    )


def test_gpu_container_may_tune_its_gpu():
    env = {
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "NVIDIA_REQUIRE_CUDA": "cuda>=12.0",
        "NVIDIA_DISABLE_REQUIRE": "true",
        "NVIDIA_GDRCOPY": "enabled",
        "NVIDIA_GDS": "enabled",
        "NVIDIA_MOFED": "enabled",
        "NVIDIA_NVSWITCH": "enabled",
        "NVIDIA_VISIBLE_DEVICES": "void",
    }
    granted = policy(
        BASE_SPEC
        + """
tenants:
  - namespaces: [ml]
    grants:
      toolkitVariables: [NVIDIA_GDRCOPY, NVIDIA_GDS, NVIDIA_MOFED, NVIDIA_NVSWITCH]
"""
    )
    assert_allowed_clean(validate(pod(container("train", gpu=1, env=env)), granted))
    # Without the grant, the node-shared variables are new findings: warned for this release.
    decision = validate(pod(container("train", gpu=1, env=env)))
    assert decision.allowed
    assert [f.violation.field for f in decision.findings if f.mode == "Warn"] == [
        f"containers.env[{name}]"
        for name in ("NVIDIA_GDRCOPY", "NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH")
    ]
    assert decision.findings[0].violation.hint.endswith("(spec.tenants[].grants.toolkitVariables)")


@pytest.mark.parametrize("value", ["all", "0,1,2,3", "GPU-6f1c2b3a", "nvidia.com/gpu=all"])
def test_gpu_container_may_not_widen_its_own_view(value):
    decision = validate(pod(container("train", gpu=1, env={"NVIDIA_VISIBLE_DEVICES": value})))
    assert denied(decision) == [("device-visibility", f"{ENV0}.value")]
    message = status_message(decision)
    assert "the kubelet puts the container's variables after the plugin's" in message
    assert "exempt its namespace" not in message


@pytest.mark.parametrize(
    "name", ["NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_IMEX_CHANNELS"]
)
@pytest.mark.parametrize("gpu", [None, 1])
def test_widening_variables_are_denied_in_every_container(name, gpu):
    decision = validate(pod(container("x", gpu=gpu, env={name: "all"})))
    assert denied(decision) == [("device-visibility", f"{ENV0}.value")]


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA_REQUIRE_CUDA",
        "NVIDIA_DISABLE_REQUIRE",
        "NVIDIA_GDRCOPY",
        "NVIDIA_GDS",
        "NVIDIA_MOFED",
        "NVIDIA_NVSWITCH",
    ],
)
def test_tuning_variables_are_denied_where_no_gpu_is_requested(name):
    decision = validate(pod(container("train", gpu=1), container("side", env={name: "x"})))
    assert denied(decision) == [("device-visibility", "spec.containers[1].env[0].value")]


def test_names_the_toolkit_does_not_read_are_not_judged():
    env = {"NVIDIA_DRIVER_VERSION": "550", "NVIDIA_VISIBLE": "all", "nvidia_visible_devices": "all"}
    assert_allowed_clean(validate(pod(container("installer", env=env))))


@pytest.mark.parametrize(
    "mount_path",
    [
        "/var/run/nvidia-container-devices",
        "/var/run/nvidia-container-devices/all",
        "/run/nvidia-container-devices/GPU-0",
        "//var/run/./nvidia-container-devices/0/",
    ],
)
def test_device_list_mounts_are_denied(mount_path):
    mounts = [{"name": "forged", "mountPath": mount_path}]
    obj = pod(
        container("train", gpu=1),
        container("side", volumeMounts=mounts),
        volumes=[host_path("/data", name="forged")],
    )
    decision = validate(obj)
    assert denied(decision) == [
        ("device-visibility", "spec.containers[1].volumeMounts[0].mountPath")
    ]
    assert "reads as a list of devices" in status_message(decision)


def test_every_device_list_dir_ends_in_the_name_mounts_are_screened_for():
    # in_device_list_dir skips normalising a mount path without this name: a directory added
    # to DEVICE_LIST_DIRS under another name would go unseen.
    from webhook.core.hostpaths import DEVICE_LIST_DIR_NAME, DEVICE_LIST_DIRS, in_device_list_dir

    for directory in DEVICE_LIST_DIRS:
        assert directory.rsplit("/", 1)[1] == DEVICE_LIST_DIR_NAME
        assert in_device_list_dir(directory)
    assert not in_device_list_dir("/var/run/nvidia-container-device")


def test_a_toolkit_variable_after_hundreds_of_others_is_denied():
    env = {f"SETTING_{i}": str(i) for i in range(300)} | {"NVIDIA_VISIBLE_DEVICES": "all"}
    decision = validate(pod(container("train", gpu=1), container("side", env=env)))
    assert denied(decision) == [("device-visibility", "spec.containers[1].env[300].value")]


@pytest.mark.parametrize(
    "odd_entry",
    [None, "NVIDIA_VISIBLE_DEVICES=all", {"name": 7, "value": "x"}, {"value": "nameless"}],
)
def test_a_toolkit_variable_beside_malformed_entries_is_denied(odd_entry):
    # Entries that are not objects with a string name take the one-by-one scan.
    env = [
        {"name": "A", "value": "1"},
        odd_entry,
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    ]
    decision = validate(pod(container("train", gpu=1), container("side", env=env)))
    assert ("device-visibility", "spec.containers[1].env[2].value") in denied(decision)


def test_a_device_list_mount_alone_makes_the_pod_reach_gpu_nodes():
    mounts = [{"name": "forged", "mountPath": "/var/run/nvidia-container-devices/all"}]
    obj = pod(container("side", volumeMounts=mounts), volumes=[{"name": "forged", "emptyDir": {}}])
    decision = validate(obj)
    assert denied(decision) == [
        ("device-visibility", "spec.containers[0].volumeMounts[0].mountPath")
    ]


def test_non_gpu_sidecar_of_a_gpu_pod_is_still_denied():
    decision = validate(
        pod(container("train", gpu=1), container("side", env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    )
    assert denied(decision) == [("device-visibility", "spec.containers[1].env[0].value")]


def test_a_zero_gpu_request_is_no_gpu():
    obj = pod(container("side", gpu=0, env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    assert denied(validate(obj)) == [("device-visibility", f"{ENV0}.value")]


def test_other_variables_are_ignored():
    obj = pod(container("side", env={"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE": "all"}))
    assert_allowed_clean(validate(obj))


# --- envFrom ----------------------------------------------------------------------------


def test_env_from_in_a_gpu_pod_is_warned():
    decision = validate(pod(container("train", gpu=1), container("side", envFrom=ENV_FROM)))
    assert decision.allowed
    assert by_mode(decision, "Warn") == [("device-visibility", "spec.containers[1].envFrom")]
    (warning,) = warnings(decision)
    assert warning.startswith(
        'spec.containers[1].envFrom: container "side" takes variables from envFrom'
    )
    assert "set NVIDIA_VISIBLE_DEVICES=void in env" in warning


def test_env_from_in_a_gpu_container_is_warned_too():
    decision = validate(pod(container("train", gpu=1, envFrom=ENV_FROM)))
    assert decision.allowed
    assert by_mode(decision, "Warn") == [("device-visibility", "spec.containers[0].envFrom")]
    (warning,) = warnings(decision)
    assert "set the variables it needs in env" in warning


def test_env_from_in_a_non_gpu_pod_is_only_audited_by_default():
    decision = validate(pod(container("web", envFrom=ENV_FROM)))
    assert decision.allowed
    assert [(f.rule, f.mode) for f in decision.findings] == [("device-visibility", "Audit")]
    assert "warnings" not in decision.response["response"]


def test_env_from_with_void_in_env_is_fine():
    side = container("side", env={"NVIDIA_VISIBLE_DEVICES": "void"}, envFrom=ENV_FROM)
    assert_allowed_clean(validate(pod(container("train", gpu=1), side)))


INJECT = policy(BASE_SPEC + "deviceVisibility: {injectVoid: true}")
VOID = {"NVIDIA_VISIBLE_DEVICES": "void"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
WILDCARD = {"operator": "Exists"}


def test_inject_void_is_required_in_pods_that_request_a_gpu():
    decision = validate(pod(container("train", gpu=1), container("side")), INJECT)
    path = "spec.containers[1].env"
    assert denied(decision) == [("device-visibility", path)]
    assert status_message(decision).startswith(
        f'{path}: Required value: container "side" requests no GPU and lacks '
        "NVIDIA_VISIBLE_DEVICES=void"
    )


def test_inject_void_is_required_in_pods_that_tolerate_a_gpu_taint_by_key():
    obj = pod(container("side"), tolerations=[GPU_TOLERATION])
    assert denied(validate(obj, INJECT)) == [("device-visibility", "spec.containers[0].env")]
    assert_allowed_clean(
        validate(pod(container("side", env=VOID), tolerations=[GPU_TOLERATION]), INJECT)
    )


def test_inject_void_is_only_warned_for_wildcard_tolerations():
    decision = validate(pod(container("agent"), tolerations=[WILDCARD]), INJECT)
    assert decision.allowed
    assert by_mode(decision, "Warn") == [("device-visibility", "spec.containers[0].env")]


def test_inject_void_is_never_required_in_templates_or_exempt_namespaces():
    deployment = KINDS[KIND_IDS.index("Deployment")]
    assert_allowed_clean(
        validate(deployment.wrap(template(container("train", gpu=1), container("side"))), INJECT)
    )
    exempt = policy(
        BASE_SPEC
        + "deviceVisibility: {injectVoid: true}\n"
        + "exemptions: [{namespaces: [ml], rules: [device-visibility]}]"
    )
    assert_allowed_clean(validate(pod(container("train", gpu=1), container("side")), exempt))


def test_the_mutated_pod_meets_the_void_requirement():
    for obj in (
        pod(container("train", gpu=1), container("side"), init=[container("init")]),
        pod(container("side"), tolerations=[GPU_TOLERATION]),
    ):
        patched = jsonpatch.apply_patch(obj, list(mutate(obj, INJECT).patch))
        assert_allowed_clean(validate(patched, INJECT))


def test_inject_void_reaches_every_reachable_pod():
    for obj in (
        {**pod(container("side")), "spec": {**pod(container("side"))["spec"], "nodeName": "n1"}},
        pod(container("agent"), tolerations=[WILDCARD]),
    ):
        patched = jsonpatch.apply_patch(obj, list(mutate(obj, INJECT).patch))
        assert patched["spec"]["containers"][0]["env"] == [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
        ]
    unreachable = pod(container("web"))
    assert not mutate(unreachable, INJECT).patch


def test_inject_void_adds_env_to_the_existing_container():
    inject = policy(BASE_SPEC + "deviceVisibility: {injectVoid: true}")
    obj = pod(container("train", gpu=1), container("side", envFrom=ENV_FROM))
    patched = jsonpatch.apply_patch(obj, list(mutate(obj, inject).patch))
    assert [c["name"] for c in patched["spec"]["containers"]] == ["train", "side"]
    assert patched["spec"]["containers"][1]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    ]


def test_inject_void_appends_to_an_existing_env():
    inject = policy(BASE_SPEC + "deviceVisibility: {injectVoid: true}")
    side = container("side", env={"LANG": "C"}, envFrom=ENV_FROM)
    obj = pod(container("train", gpu=1), side)
    patched = jsonpatch.apply_patch(obj, list(mutate(obj, inject).patch))
    assert [c["name"] for c in patched["spec"]["containers"]] == ["train", "side"]
    assert patched["spec"]["containers"][1]["env"] == [
        {"name": "LANG", "value": "C"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
    ]


# --- CDI annotations ----------------------------------------------------------------------


def test_cdi_annotation_is_denied():
    obj = pod(container(), annotations={"cdi.k8s.io/foo": "nvidia.com/gpu=all"})
    decision = validate(obj)
    path = "metadata.annotations[cdi.k8s.io/foo]"
    assert denied(decision) == [("device-visibility", path)]
    assert status_message(decision).startswith(
        f'{path}: Invalid value: "nvidia.com/gpu=all": CDI annotations request devices'
    )


def test_cdi_annotation_is_denied_in_a_gpu_pod_too():
    obj = pod(container(gpu=1), annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0"})
    assert denied(validate(obj)) == [("device-visibility", "metadata.annotations[cdi.k8s.io/x]")]


def test_other_annotations_are_fine():
    obj = pod(container(gpu=1), annotations={"example.com/cdi": "x", "cdi.k8s.io": "y"})
    assert_allowed_clean(validate(obj))


# --- Every container list, every kind -----------------------------------------------------


@pytest.mark.parametrize("where", CONTAINER_LISTS)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_every_kind_and_container_list(kind, where):
    good = validate(kind.wrap(place(container("x", env={"NVIDIA_VISIBLE_DEVICES": "void"}), where)))
    assert good.allowed
    assert "device-visibility" not in {f.rule for f in good.findings}

    bad = kind.wrap(place(container("x", env={"NVIDIA_VISIBLE_DEVICES": "all"}), where))
    decision = validate(bad)
    assert denied(decision) == [("device-visibility", f"{kind.prefix}spec.{where}[0].env[0].value")]


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_cdi_annotation_in_every_kind(kind):
    obj = kind.wrap(template(container(), annotations={"cdi.k8s.io/foo": "nvidia.com/gpu=all"}))
    assert denied(validate(obj)) == [
        ("device-visibility", f"{kind.prefix}metadata.annotations[cdi.k8s.io/foo]")
    ]
