"""DRA claims judged as objects of their own (issue 35): ResourceClaimTemplates and
ResourceClaims, through ``decide()`` and the real server. Device classes, MIG profiles named
in selectors and admin access here; NVIDIA's opaque parameters in ``test_dra_parameters``
(the module) and ``test_dra_configs`` (the rule), sharing modes in ``test_dra_sharing``."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

import webhook
from tests.serving import answers, policy_text, tls_server
from tests.support.admission import (
    admission,
    assert_allowed_clean,
    container,
    default_policy,
    denied,
    policy,
    status_message,
    validate,
    warnings,
)

DRA_V1 = "resource.k8s.io/v1"
CONTROLLER = "system:serviceaccount:kube-system:resource-claim-controller"


@cache
def enforcing() -> webhook.Policy:
    """The default policy's checks with the ones new in this release enforced."""
    return policy(
        """
        newChecks: Enforce
        gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
        migCatalogue: {products: ["*"], uncataloguedProfiles: Deny}
        tenants:
          - namespaces: [monitoring]
            grants: {draAdminAccess: true}
        """,
        name="dra-enforcing",
    )


def request(name: str = "gpu", **exactly: Any) -> dict:
    return {"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com", **exactly}}


def template(*requests: dict, config: list | None = None, name: str = "tpl") -> dict:
    devices: dict[str, Any] = {"requests": list(requests)}
    if config is not None:
        devices["config"] = config
    return {
        "apiVersion": DRA_V1,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }


def claim(*requests: dict, annotations: dict | None = None) -> dict:
    metadata: dict[str, Any] = {"name": "shared"}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": DRA_V1,
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": {"requests": list(requests)}},
    }


def mig_selector(expression: str) -> dict:
    return {"cel": {"expression": expression}}


def messages(decision: webhook.Decision) -> list[str]:
    return [f.violation.render() for f in decision.findings]


# --- device classes -----------------------------------------------------------------------


def test_a_near_miss_of_a_device_class_is_refused_with_the_name_meant() -> None:
    decision = validate(template(request(deviceClassName="gpu.nvidia.con")), enforcing())
    assert denied(decision) == [
        ("dra-claims", "spec.spec.devices.requests[0].exactly.deviceClassName")
    ]
    assert 'device class "gpu.nvidia.con" is a near miss of "gpu.nvidia.com"' in (
        status_message(decision)
    )
    assert "did you mean gpu.nvidia.com?" in status_message(decision)


@pytest.mark.parametrize(
    "written, meant",
    [
        ("GPU.nvidia.com", "gpu.nvidia.com"),
        ("mig.nvidia.co", "mig.nvidia.com"),
        ("vfio-gpu.nvidia.com", "vfio.gpu.nvidia.com"),
        ("gpu.nvdiia.com", "gpu.nvidia.com"),
    ],
)
def test_case_separators_one_edit_and_a_swap_are_near_misses(written: str, meant: str) -> None:
    decision = validate(template(request(deviceClassName=written)), enforcing())
    assert f"did you mean {meant}?" in status_message(decision)


def test_under_the_default_policy_a_near_miss_is_a_warning_new_in_this_release() -> None:
    decision = validate(template(request(deviceClassName="gpu.nvidia.con")))
    assert decision.allowed
    assert any("did you mean gpu.nvidia.com?" in w for w in warnings(decision))


def test_a_near_miss_inside_a_first_available_list_is_found_where_it_is() -> None:
    prioritized = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.nvidia.com"},
            {"name": "small", "deviceClassName": "mig.nvidia.con"},
        ],
    }
    decision = validate(template(prioritized), enforcing())
    assert denied(decision) == [
        ("dra-claims", "spec.spec.devices.requests[0].firstAvailable[1].deviceClassName")
    ]


def test_the_v1beta1_shape_is_read_as_its_v1_form() -> None:
    old_shape = template({"name": "gpu", "deviceClassName": "gpu.nvidia.con"})
    old_shape["apiVersion"] = "resource.k8s.io/v1beta1"
    decision = validate(old_shape, enforcing())
    assert denied(decision) == [("dra-claims", "spec.spec.devices.requests[0].deviceClassName")]


def test_an_undeclared_class_under_the_vendor_domain_follows_unknown_resources() -> None:
    custom = template(request(deviceClassName="mig-1g-12gb.gpu.nvidia.com"))
    assert validate(custom, enforcing()).allowed  # unknownResources: Warn (the default)
    assert any(
        'device class "mig-1g-12gb.gpu.nvidia.com" is not one this policy knows' in w
        for w in warnings(validate(custom, enforcing()))
    )
    strict_unknown = policy("newChecks: Enforce\nunknownResources: Deny", name="deny-unknown")
    assert denied(validate(custom, strict_unknown))
    allow_unknown = policy("newChecks: Enforce\nunknownResources: Allow", name="allow-unknown")
    assert_allowed_clean(validate(custom, allow_unknown))


def test_a_declared_class_is_known_and_other_drivers_classes_are_theirs() -> None:
    declared = policy(
        """
        newChecks: Enforce
        unknownResources: Deny
        dra:
          deviceClasses:
            - {name: mig-1g-12gb.gpu.nvidia.com, sharing: MIG}
        """,
        name="declared-class",
    )
    assert_allowed_clean(
        validate(template(request(deviceClassName="mig-1g-12gb.gpu.nvidia.com")), declared)
    )
    for other in ("gpu.intel.com", "gpu.example.com", "sriovnetwork.k8snetworkplumbingwg.io"):
        assert_allowed_clean(validate(template(request(deviceClassName=other)), declared))


# --- MIG profiles in selectors ------------------------------------------------------------


def mig_request(expression: str, name: str = "mig") -> dict:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": "mig.nvidia.com",
            "selectors": [mig_selector(expression)],
        },
    }


def test_a_profile_no_catalogued_product_has_is_refused_with_the_closest() -> None:
    decision = validate(
        template(mig_request("device.attributes['gpu.nvidia.com'].profile == '1g.11gb'")),
        enforcing(),
    )
    assert denied(decision) == [
        ("dra-claims", "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression")
    ]
    message = status_message(decision)
    assert 'MIG profile "1g.11gb" is not offered by the GPU products this cluster declares' in (
        message
    )
    assert "did you mean 1g.12gb?" in message


def test_a_catalogued_profile_in_either_form_is_admitted() -> None:
    for expression in (
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
        'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"',
    ):
        assert_allowed_clean(validate(template(mig_request(expression)), enforcing()))


def test_a_bad_profile_inside_a_first_available_list_is_found() -> None:
    prioritized = {
        "name": "mig",
        "firstAvailable": [
            {
                "name": "large",
                "deviceClassName": "mig.nvidia.com",
                "selectors": [
                    mig_selector("device.attributes['gpu.nvidia.com'].profile == '3g.40gb'")
                ],
            },
            {
                "name": "small",
                "deviceClassName": "mig.nvidia.com",
                "selectors": [
                    mig_selector("device.attributes['gpu.nvidia.com'].profile == '1g.11gb'")
                ],
            },
        ],
    }
    decision = validate(template(prioritized), enforcing())
    assert denied(decision) == [
        (
            "dra-claims",
            "spec.spec.devices.requests[0].firstAvailable[1].selectors[0].cel.expression",
        )
    ]


def test_an_uncatalogued_profile_warns_under_the_default_catalogue_setting() -> None:
    warn_only = policy("newChecks: Enforce", name="uncatalogued-warn")
    decision = validate(
        template(mig_request("device.attributes['gpu.nvidia.com'].profile == '1g.11gb'")),
        warn_only,
    )
    assert decision.allowed
    assert any('MIG profile "1g.11gb"' in w for w in warnings(decision))


def test_a_selector_too_complex_to_read_exactly_is_left_alone() -> None:
    for expression in (
        "device.attributes['gpu.nvidia.com'].profile == '1g.11gb' || true",
        "device.attributes['gpu.nvidia.com'].profile != '1g.11gb'",
        "device.capacity['gpu.nvidia.com'].multiprocessors.isGreaterThan(quantity('10'))",
    ):
        assert_allowed_clean(validate(template(mig_request(expression)), enforcing()))


# --- admin access -------------------------------------------------------------------------


def test_admin_access_is_refused_where_no_tenant_grant_allows_it() -> None:
    admin = template(request(allocationMode="All", adminAccess=True))
    decision = validate(admin, enforcing(), namespace="team-a")
    assert denied(decision) == [
        ("dra-admin-access", "spec.spec.devices.requests[0].exactly.adminAccess")
    ]
    assert "tenants[].grants.draAdminAccess" in status_message(decision)
    assert_allowed_clean(validate(admin, enforcing(), namespace="monitoring"))


def test_admin_access_warns_under_the_default_policy_and_the_operator_is_exempt() -> None:
    admin = template(request(allocationMode="All", adminAccess=True))
    decision = validate(admin, namespace="team-a")
    assert decision.allowed
    assert any("admin access" in w for w in warnings(decision))
    assert_allowed_clean(validate(admin, namespace="gpu-operator"))


# --- whose claims are judged --------------------------------------------------------------


def forged() -> dict:
    """A claim a tenant writes with the annotation the control plane's claims carry."""
    return claim(
        request(deviceClassName="gpu.nvidia.con"),
        annotations={"resource.kubernetes.io/pod-claim-name": "gpu"},
    )


def by(username: str, obj: dict, **kwargs: Any) -> webhook.Decision:
    review = admission(obj, **kwargs)
    review["request"]["userInfo"] = {"username": username, "groups": ["system:authenticated"]}
    return webhook.decide(review, enforcing(), mutate=False)


@pytest.mark.parametrize(
    "username", [CONTROLLER, "system:kube-controller-manager", "system:kube-scheduler"]
)
def test_a_claim_the_control_plane_creates_is_never_judged(username: str) -> None:
    assert_allowed_clean(by(username, forged()))


def test_the_same_claim_created_by_a_tenant_with_the_annotation_is_judged() -> None:
    decision = by("alice", forged())
    assert denied(decision) == [("dra-claims", "spec.devices.requests[0].exactly.deviceClassName")]


def test_a_claims_status_update_is_never_judged() -> None:
    decision = by("alice", forged(), operation="UPDATE", old=forged(), sub_resource="status")
    assert_allowed_clean(decision)


def test_a_template_the_controller_account_writes_is_still_judged() -> None:
    # Only claims are made for Pods by the control plane; templates are the tenant's.
    bad = template(request(deviceClassName="gpu.nvidia.con"))
    assert denied(by(CONTROLLER, bad))


# --- containers that claim a GPU ----------------------------------------------------------


def claiming_pod(*containers: dict, template_name: str = "single-gpu") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
            "containers": list(containers),
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    }


def claims(spec: dict, *names: str) -> dict:
    spec = dict(spec)
    spec["resources"] = {"claims": [{"name": n} for n in names]}
    return spec


def test_a_container_whose_gpu_comes_from_a_claim_may_tune_it() -> None:
    tuned = claims(container(env={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}), "gpu")
    assert_allowed_clean(validate(claiming_pod(tuned), default_policy()))
    # Without the claim the same container requests no GPU: the tuning variable is refused.
    untuned = container(env={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"})
    assert denied(validate(claiming_pod(untuned), default_policy())) == [
        ("device-visibility", "spec.containers[0].env[0].value")
    ]


def test_with_inject_void_a_claim_that_cannot_be_read_is_still_voided() -> None:
    # Without the node inventory the claim may be a NIC's: the container is asked for void
    # (harmless where it is a GPU: NVIDIA's driver hands it over through CDI, and voids the
    # variable itself). With the inventory's template, see test_dra_sharing.
    voiding = policy(
        """
        gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
        deviceVisibility: {injectVoid: true}
        """,
        name="void",
    )
    pod_ = claiming_pod(claims(container(name="main"), "gpu"), container(name="sidecar"))
    decision = validate(pod_, voiding)
    assert [path for _, path in denied(decision)] == [
        "spec.containers[0].env",
        "spec.containers[1].env",
    ]
    assert 'container "main" uses a DRA claim the webhook cannot read as a GPU' in (
        status_message(decision)
    )


def test_a_claim_makes_the_pod_gpu_relevant_and_its_new_findings_only_warn() -> None:
    # A claim-only Pod is judged by the GPU rules for the first time: the queue rule here.
    queued = policy(
        """
        gpuNodeTaints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
        tenants:
          - namespaces: [ml]
            requirements: {queue: {queues: [team-a]}}
        """,
        name="queues-new-checks-warn",
    )
    decision = validate(claiming_pod(claims(container(), "gpu")), queued)
    assert decision.allowed
    assert {f.rule for f in decision.findings} == {"queue"}
    assert all(f.mode == "Warn" for f in decision.findings)


# --- the real server ----------------------------------------------------------------------


def test_the_server_judges_classes_and_profiles_and_admits_the_controllers_claim(
    tmp_path: Path,
) -> None:
    tenant = admission(template(request(deviceClassName="gpu.nvidia.con")))
    profile = admission(
        template(mig_request("device.attributes['gpu.nvidia.com'].profile == '1g.11gb'"))
    )
    controller = admission(forged())
    controller["request"]["userInfo"] = {"username": CONTROLLER}
    with tls_server(tmp_path, policy_text=policy_text("  newChecks: Enforce\n")) as server:
        refused, uncatalogued, admitted = answers(server, (tenant, profile, controller))
    # The policy's migCatalogue warns an uncatalogued profile (uncataloguedProfiles: Warn).
    assert uncatalogued["allowed"] is True
    assert any('MIG profile "1g.11gb"' in w for w in uncatalogued["warnings"])
    assert refused["allowed"] is False
    assert refused["status"]["code"] == 403
    assert "spec.spec.devices.requests[0].exactly.deviceClassName" in (refused["status"]["message"])
    assert "did you mean gpu.nvidia.com?" in refused["status"]["message"]
    assert admitted["allowed"] is True and "warnings" not in admitted


# --- ComputeDomains -----------------------------------------------------------------------


def compute_domain(nodes: int) -> dict:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "imex"},
        "spec": {
            "numNodes": nodes,
            "channel": {"resourceClaimTemplate": {"name": "imex-channel"}},
        },
    }


def test_a_compute_domain_larger_than_the_rack_is_refused() -> None:
    racks = policy("newChecks: Enforce\ndra: {computeDomains: {maxNodes: 18}}", name="racks")
    assert_allowed_clean(validate(compute_domain(18), racks))
    decision = validate(compute_domain(36), racks)
    assert denied(decision) == [("dra-claims", "spec.numNodes")]
    assert "dra.computeDomains.maxNodes" in status_message(decision)
    assert "set numNodes to at most 18" in status_message(decision)
    # Without a rack size nothing is said about it.
    assert_allowed_clean(validate(compute_domain(36), enforcing()))


# --- claims embedded in catalogued workloads ----------------------------------------------


def nim_service(device_class: str) -> dict:
    return {
        "apiVersion": "apps.nvidia.com/v1alpha1",
        "kind": "NIMService",
        "metadata": {"name": "llm"},
        "spec": {
            "image": {"repository": "nvcr.io/nim/meta/llama", "tag": "1.12.0"},
            "draResources": [
                {
                    "claimCreationSpec": {
                        "devices": [
                            {
                                "name": "gpu",
                                "count": 1,
                                "deviceClassName": device_class,
                                "driverName": "gpu.nvidia.com",
                            }
                        ]
                    }
                }
            ],
        },
    }


def test_a_nim_services_claim_creation_spec_is_judged_as_a_template_is() -> None:
    decision = validate(nim_service("gpu.nvidia.con"), enforcing())
    assert denied(decision) == [
        ("dra-claims", "spec.draResources[0].claimCreationSpec.devices[0].deviceClassName")
    ]
    assert "did you mean gpu.nvidia.com?" in status_message(decision)
    assert_allowed_clean(validate(nim_service("gpu.nvidia.com"), enforcing()))
