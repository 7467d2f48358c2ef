"""resource-name: GPU resource names are exact."""

from __future__ import annotations

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
    place,
    pod,
    policy,
    status_message,
    validate,
    warnings,
)


def limit_path(name: str, index: int = 0) -> str:
    return f"spec.containers[{index}].resources.limits[{name}]"


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("nvidia.com/GPU", "nvidia.com/gpu"),
        ("nvidia.com/gpus", "nvidia.com/gpu"),
        ("nvidia.com/Gpus", "nvidia.com/gpu"),
        ("nvidia.com/mig-1g10gb", "nvidia.com/mig-1g.10gb"),
        ("nvidia.com/MIG-1g.10gb", "nvidia.com/mig-1g.10gb"),
        ("nvidia.com/mig-1g.10GB", "nvidia.com/mig-1g.10gb"),
        ("nvidia.com/sharedgpu", "nvidia.com/gpu.shared"),
        ("nvidia.com/gpu-shared", "nvidia.com/gpu.shared"),
        ("nvidia.com/gpu_shared", "nvidia.com/gpu.shared"),
        ("nvidia.com/gpuu", "nvidia.com/gpu"),
        ("nvidia.com/gou", "nvidia.com/gpu"),
        ("nvidia.com/gp", "nvidia.com/gpu"),
        ("nvidia.com/gpu1", "nvidia.com/gpu"),
        ("nvidia.com/mig-1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
    ],
)
def test_near_misses_are_denied_with_a_suggestion(name, suggestion):
    decision = validate(pod(container(gpu=1, resource=name)))
    assert not decision.allowed
    assert denied(decision) == [("resource-name", limit_path(name))]
    message = status_message(decision)
    assert message.startswith(f'{limit_path(name)}: Unsupported value: "{name}": ')
    assert "the Pod would pend forever" in message
    assert message.endswith(f"did you mean {suggestion}?")


def test_near_miss_in_requests_points_at_requests():
    decision = validate(
        pod(container(limits={"nvidia.com/gpus": 1}, requests={"nvidia.com/gpus": 1}))
    )
    # limits win: the name is reported once, where the scheduler reads it.
    assert denied(decision) == [("resource-name", limit_path("nvidia.com/gpus"))]


@pytest.mark.parametrize(
    "name",
    [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.10gb.shared",
        "nvidia.com/mig-3g.40gb",
        "nvidia.com/mig-1g.12gb.me",
    ],
)
def test_declared_and_catalogued_names_are_allowed(name):
    assert_allowed_clean(validate(pod(container(gpu=1, resource=name))))


def test_malformed_mig_name_is_denied():
    decision = validate(pod(container(gpu=1, resource="nvidia.com/mig-big")))
    assert denied(decision) == [("resource-name", limit_path("nvidia.com/mig-big"))]
    assert 'malformed MIG resource name "nvidia.com/mig-big"' in status_message(decision)
    assert "write nvidia.com/mig-<g>g.<mem>gb exactly" in status_message(decision)


# --- Uncatalogued MIG profiles ------------------------------------------------------------

UNCATALOGUED = "nvidia.com/mig-5g.55gb"


def test_uncatalogued_profile_is_warned_under_the_default_policy():
    decision = validate(pod(container(gpu=1, resource=UNCATALOGUED)))
    assert decision.allowed
    assert by_mode(decision, "Warn") == [("resource-name", limit_path(UNCATALOGUED))]
    (warning,) = warnings(decision)
    assert warning.startswith(f'{limit_path(UNCATALOGUED)}: MIG profile "5g.55gb" is not offered')
    assert "migCatalogue" in warning


def test_uncatalogued_profile_is_denied_when_the_policy_says_deny():
    strict = policy(BASE_SPEC + "migCatalogue: {uncataloguedProfiles: Deny}")
    decision = validate(pod(container(gpu=1, resource=UNCATALOGUED)), strict)
    assert denied(decision) == [("resource-name", limit_path(UNCATALOGUED))]
    assert status_message(decision).startswith(
        f'{limit_path(UNCATALOGUED)}: Unsupported value: "{UNCATALOGUED}": MIG profile'
    )


def test_limiting_products_makes_other_profiles_uncatalogued():
    a30 = policy(BASE_SPEC + "migCatalogue: {products: [A30]}")
    name = "nvidia.com/mig-1g.10gb"
    decision = validate(pod(container(gpu=1, resource=name)), a30)
    assert decision.allowed
    assert by_mode(decision, "Warn") == [("resource-name", limit_path(name))]
    (warning,) = warnings(decision)
    assert "not offered by the GPU products this cluster declares (A30)" in warning
    assert "did you mean nvidia.com/mig-1g.6gb?" in warning
    # The A30's own profiles stay allowed.
    assert_allowed_clean(validate(pod(container(gpu=1, resource="nvidia.com/mig-1g.6gb")), a30))


def test_limiting_products_and_deny_denies_other_profiles():
    a30 = policy(BASE_SPEC + "migCatalogue: {products: [A30], uncataloguedProfiles: Deny}")
    decision = validate(pod(container(gpu=1, resource="nvidia.com/mig-1g.10gb")), a30)
    assert denied(decision) == [("resource-name", limit_path("nvidia.com/mig-1g.10gb"))]


def test_custom_product_catalogues_its_profiles():
    custom = policy(
        BASE_SPEC
        + """
migCatalogue:
  products: [A30, X1]
  customProducts: [{name: X1, profiles: [5g.55gb]}]
  uncataloguedProfiles: Deny
"""
    )
    assert_allowed_clean(validate(pod(container(gpu=1, resource=UNCATALOGUED)), custom))


# --- Undeclared vendor names and other domains -------------------------------------------


def test_undeclared_vendor_name_is_warned_by_default():
    decision = validate(pod(container(gpu=1, resource="nvidia.com/hostdev")))
    assert decision.allowed
    assert by_mode(decision, "Warn") == [("resource-name", limit_path("nvidia.com/hostdev"))]
    assert (
        '"nvidia.com/hostdev" is not a GPU resource this policy declares' in warnings(decision)[0]
    )


def test_undeclared_vendor_name_is_denied_when_unknown_resources_deny():
    strict = policy(BASE_SPEC + "unknownResources: Deny")
    decision = validate(pod(container(gpu=1, resource="nvidia.com/hostdev")), strict)
    assert denied(decision) == [("resource-name", limit_path("nvidia.com/hostdev"))]
    assert status_message(decision).startswith(
        f'{limit_path("nvidia.com/hostdev")}: Unsupported value: "nvidia.com/hostdev": '
    )


def test_undeclared_vendor_name_is_silent_when_unknown_resources_allow():
    lax = policy(BASE_SPEC + "unknownResources: Allow")
    assert_allowed_clean(validate(pod(container(gpu=1, resource="nvidia.com/hostdev")), lax))


def test_near_misses_are_denied_even_when_unknown_resources_allow():
    lax = policy(BASE_SPEC + "unknownResources: Allow")
    decision = validate(pod(container(gpu=1, resource="nvidia.com/gpus")), lax)
    assert denied(decision) == [("resource-name", limit_path("nvidia.com/gpus"))]


@pytest.mark.parametrize(
    "name", ["example.com/foo", "rdma/rdma_shared_device_a", "amd.com/gpu", "cpu", "memory"]
)
def test_names_outside_the_vendor_domains_are_untouched(name):
    assert_allowed_clean(validate(pod(container(limits={name: "1"}))))


def test_extra_vendor_domain_is_judged():
    amd = policy(BASE_SPEC + "vendorDomains: [nvidia.com, amd.com]\nunknownResources: Deny")
    decision = validate(pod(container(limits={"amd.com/gpu": 1})), amd)
    assert denied(decision) == [("resource-name", limit_path("amd.com/gpu"))]


def test_each_bad_name_is_reported_once_per_container():
    decision = validate(
        pod(
            container("a", limits={"nvidia.com/gpus": 1, "nvidia.com/GPU": 1}),
            container("b", limits={"nvidia.com/gpus": 1}),
        )
    )
    assert denied(decision) == [
        ("resource-name", limit_path("nvidia.com/gpus", 0)),
        ("resource-name", limit_path("nvidia.com/GPU", 0)),
        ("resource-name", limit_path("nvidia.com/gpus", 1)),
    ]


@pytest.mark.parametrize("where", CONTAINER_LISTS)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_every_kind_and_container_list(kind, where):
    good = validate(kind.wrap(place(container("gpu", gpu=1), where)))
    assert "resource-name" not in {f.rule for f in good.findings}
    assert good.allowed

    bad = kind.wrap(place(container("gpu", gpu=1, resource="nvidia.com/gpus"), where))
    decision = validate(bad)
    path = f"{kind.prefix}spec.{where}[0].resources.limits[nvidia.com/gpus]"
    assert denied(decision) == [("resource-name", path)]
    assert status_message(decision).endswith("did you mean nvidia.com/gpu?")


def _rails(count: int, start: int = 0) -> dict:
    return {f"nvidia.com/rail{i}": 1 for i in range(start, start + count)}


def test_a_hundred_undeclared_names_are_each_judged():
    """A node with many RDMA rails advertises a name for each: each is warned, none denied."""
    from webhook.checks.resource_name import MAX_UNDECLARED_NAMES

    half = MAX_UNDECLARED_NAMES // 2
    decision = validate(
        pod(
            container("a", limits=_rails(half)),
            container("b", limits=_rails(MAX_UNDECLARED_NAMES - half, start=half)),
        )
    )
    assert decision.allowed
    assert len(by_mode(decision, "Warn")) == MAX_UNDECLARED_NAMES


def test_past_a_hundred_undeclared_names_judging_stops_with_a_denial():
    """Diagnosing a name takes microseconds while the event loop waits; what is past the
    limit is not judged, and could be a near miss, so the template is denied."""
    from webhook.checks.resource_name import MAX_UNDECLARED_NAMES

    names = _rails(MAX_UNDECLARED_NAMES + 40)
    decision = validate(pod(container(limits={**names, "nvidia.com/gpu": 1})))
    assert not decision.allowed
    first_unjudged = f"nvidia.com/rail{MAX_UNDECLARED_NAMES}"
    assert denied(decision) == [("resource-name", limit_path(first_unjudged))]
    assert len(by_mode(decision, "Warn")) == MAX_UNDECLARED_NAMES
    message = status_message(decision)
    assert f"names {MAX_UNDECLARED_NAMES + 40} resources under GPU vendor domains" in message
    assert f"the first {MAX_UNDECLARED_NAMES} are judged" in message
    assert "companionResources" in message


def test_past_the_limit_a_warn_mode_rule_only_warns():
    from webhook.checks.resource_name import MAX_UNDECLARED_NAMES

    lenient = policy(BASE_SPEC + "rules: {resource-name: {gpuPods: Warn, otherPods: Warn}}")
    decision = validate(pod(container(limits=_rails(MAX_UNDECLARED_NAMES + 1))), lenient)
    assert decision.allowed
    assert len(by_mode(decision, "Warn")) == MAX_UNDECLARED_NAMES + 1


def test_declared_and_companion_names_do_not_count_towards_the_limit():
    from webhook.checks.resource_name import MAX_UNDECLARED_NAMES

    companions = policy(BASE_SPEC + "companionResources: [nvidia.com/gpumem]")
    names = {**_rails(MAX_UNDECLARED_NAMES), "nvidia.com/gpu": 1, "nvidia.com/gpumem": 1}
    decision = validate(pod(container(limits=names)), companions)
    assert decision.allowed
