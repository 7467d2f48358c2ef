"""Loading policies: the shipped ones load, broken ones are refused naming the line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import webhook
from tests.support.paths import REPO
from webhook.policy.load import default_policy_path

EXAMPLES = sorted((REPO / "policies" / "examples").glob("*.yaml"))

MINIMAL = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata:
  name: test
spec:
{spec}
"""


def policy_text(spec: str) -> str:
    return MINIMAL.format(spec=textwrap.indent(textwrap.dedent(spec).strip("\n"), "  "))


def refused(spec: str) -> webhook.PolicyError:
    with pytest.raises(webhook.PolicyError) as info:
        webhook.parse_policy(policy_text(spec), source="test.yaml")
    return info.value


def test_default_policy_loads_and_is_packaged() -> None:
    policy = webhook.load_policy(REPO / "policies" / "default.yaml")
    assert policy.name == "default"
    assert default_policy_path().read_text() == (REPO / "policies" / "default.yaml").read_text()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_loads(path: Path) -> None:
    policy = webhook.load_policy(path)
    assert policy.source == str(path)
    assert len(policy.sha256) == 64


def test_examples_cover_what_the_issue_asks_for() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"labelled-pools", "mig-mixed", "time-slicing", "strict", "audit-rollout"} <= names


def test_compiled_policy_is_immutable() -> None:
    policy = webhook.load_policy(REPO / "policies" / "default.yaml")
    with pytest.raises(AttributeError):
        policy.name = "changed"  # type: ignore[misc]
    with pytest.raises(TypeError):
        policy.rules["privileged"] = None  # type: ignore[index]


def test_schema_error_names_source_line_and_field() -> None:
    error = refused(
        """
        rules:
          privileged: {gpuPods: Deny}
        """
    )
    assert "test.yaml:7: spec.rules.privileged.gpuPods: 'Deny' is not one of" in str(error)


def test_unknown_field_suggests_the_right_one() -> None:
    error = refused("vendorDomain: [nvidia.com]")
    assert "test.yaml:6: spec.vendorDomain: unknown field 'vendorDomain'" in str(error)
    assert "(did you mean 'vendorDomains'?)" in str(error)


def test_malformed_mig_profile_is_refused() -> None:
    error = refused(
        """
        migCatalogue:
          customProducts:
            - name: X100
              profiles: [1g10gb]
        """
    )
    assert (
        "test.yaml:9: spec.migCatalogue.customProducts[0].profiles[0]: malformed MIG profile"
        in (str(error))
    )


def test_a_custom_product_left_out_of_the_products_is_refused() -> None:
    error = refused(
        """
        migCatalogue:
          products: [A100-80GB]
          customProducts:
            - name: X100
              profiles: [1g.12gb]
        """
    )
    assert (
        "test.yaml:9: spec.migCatalogue.customProducts[0].name: custom product 'X100' is not in "
        "migCatalogue.products" in str(error)
    )


def test_a_custom_product_is_in_force_when_listed_or_with_every_product() -> None:
    for products in ("[A100-80GB, X100]", '["*"]'):
        policy = webhook.parse_policy(
            "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
            "metadata: {name: custom}\nspec:\n"
            f"  migCatalogue:\n    products: {products}\n"
            "    customProducts: [{name: X100, profiles: [1g.12gb]}]\n",
            source="<custom>",
        )
        assert "1g.12gb" in policy.mig_profiles


def test_malformed_mig_resource_in_a_pool_is_refused() -> None:
    error = refused(
        """
        pools:
          - name: mig
            nodeSelector: {pool: mig}
            resources:
              - {name: nvidia.com/mig-1g10gb, sharing: MIG}
        """
    )
    assert "test.yaml:10: spec.pools[0].resources[0].name: malformed MIG resource name" in str(
        error
    )


def test_unknown_product_is_refused_with_a_suggestion() -> None:
    error = refused("migCatalogue: {products: [A100-80G]}")
    assert "did you mean 'A100-80GB'?" in str(error)


def test_pool_mixing_software_sharing_with_exclusive_cards_is_refused() -> None:
    error = refused(
        """
        pools:
          - name: mixed
            nodeSelector: {pool: mixed}
            resources:
              - {name: nvidia.com/gpu, sharing: Exclusive}
              - {name: nvidia.com/gpu.shared, sharing: TimeSlicing}
        """
    )
    assert "test.yaml:10: spec.pools[0].resources: pool 'mixed' mixes software sharing" in str(
        error
    )


def test_pool_mixing_time_slicing_with_mps_is_refused() -> None:
    error = refused(
        """
        pools:
          - name: soft
            nodeSelector: {pool: soft}
            resources:
              - {name: nvidia.com/gpu.shared, sharing: TimeSlicing}
              - {name: example.com/mps, sharing: MPS}
        """
    )
    assert "mixes time-slicing with MPS" in str(error)


def test_full_cards_beside_mig_instances_are_allowed() -> None:
    policy = webhook.parse_policy(
        policy_text(
            """
            pools:
              - name: mixed-strategy
                nodeSelector: {nvidia.com/mig.strategy: mixed}
                resources:
                  - {name: nvidia.com/gpu, sharing: Exclusive}
                  - {name: nvidia.com/mig-1g.10gb, sharing: MIG}
            """
        )
    )
    assert [p.name for p in policy.pools] == ["mixed-strategy"]


def test_label_based_exemption_is_refused() -> None:
    error = refused(
        """
        exemptions:
          - namespaces: [ml]
            labels: {team: infra}
        """
    )
    assert "test.yaml:8: spec.exemptions[0].labels: exemptions cannot select by object label" in (
        str(error)
    )


def test_duplicate_pool_name_is_refused() -> None:
    error = refused(
        """
        pools:
          - name: a
            nodeSelector: {pool: a}
            resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
          - name: a
            nodeSelector: {pool: b}
            resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
        """
    )
    assert "test.yaml:10: spec.pools[1].name: duplicate pool name 'a'" in str(error)


def test_duplicate_yaml_key_is_refused() -> None:
    error = refused(
        """
        unknownResources: Warn
        unknownResources: Deny
        """
    )
    assert "test.yaml:7: spec.unknownResources: duplicate key" in str(error)


def test_invalid_template_path_is_refused() -> None:
    error = refused(
        """
        workloads:
          - group: example.com
            kind: Trainer
            templates: ["spec.workers[].template"]
        """
    )
    assert "invalid path 'spec.workers[].template'" in str(error)


def test_every_error_is_reported_at_once() -> None:
    error = refused(
        """
        pools:
          - name: a
            nodeSelector: {pool: a}
            resources: [{name: nvidia.com/mig-1g10gb, sharing: MIG}]
          - name: a
            nodeSelector: {pool: a}
            resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
        """
    )
    assert len(error.errors) == 2


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "expected one YAML document, found 0"),
        ("a: [", "not valid YAML"),
        ("- 1\n- 2\n", "(document): [1, 2] is not of type 'object'"),
        ("a: 1\n---\nb: 2\n", "expected one YAML document, found 2"),
    ],
)
def test_not_a_policy_at_all(text: str, fragment: str) -> None:
    with pytest.raises(webhook.PolicyError) as info:
        webhook.parse_policy(text, source="x.yaml")
    assert fragment in str(info.value)


def test_unreadable_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(webhook.PolicyError, match="missing.yaml: no such file or directory"):
        webhook.load_policy(tmp_path / "missing.yaml")


def test_a_pool_open_to_no_namespace_is_refused() -> None:
    error = refused(
        """
        pools:
          - name: none
            nodeSelector: {pool: none}
            resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
            namespaces: []
        """
    )
    assert "spec.pools[0].namespaces: [] should be non-empty" in str(error)


def test_a_namespace_override_default_does_not_re_enable_a_disabled_rule() -> None:
    policy = webhook.parse_policy(
        policy_text(
            """
            rules:
              host-devices: {enabled: false}
              privileged: {otherPods: "Off"}
            namespaceOverrides:
              - namespaces: ["dev-*"]
                rules:
                  default: {gpuPods: Warn, otherPods: Warn}
                  topology: {otherPods: "Off"}
              - namespaces: [lab]
                rules:
                  host-devices: {gpuPods: Audit}
            """
        )
    )
    dev = policy.rule_modes("dev-1")
    assert (dev["host-devices"].gpu_pods, dev["host-devices"].other_pods) == ("Off", "Off")
    assert (dev["privileged"].gpu_pods, dev["privileged"].other_pods) == ("Warn", "Off")
    assert (dev["topology"].gpu_pods, dev["topology"].other_pods) == ("Warn", "Off")
    lab = policy.rule_modes("lab")
    assert (lab["host-devices"].gpu_pods, lab["host-devices"].other_pods) == ("Audit", "Off")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a: !!python/object:os.system x\n", "not valid YAML"),
        ("x: &a [*a]\n", "a YAML alias refers to itself"),
    ],
)
def test_hostile_yaml_is_a_policy_error(text: str, fragment: str) -> None:
    with pytest.raises(webhook.PolicyError) as info:
        webhook.parse_policy(text, source="x.yaml")
    assert fragment in str(info.value)


def test_a_reserved_pool_without_a_label_of_its_own_is_refused() -> None:
    error = refused(
        """
        pools:
          - name: shared-a100
            nodeSelector: {gpu: a100, zone: west}
            resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
          - name: reserved
            nodeSelector: {gpu: a100}
            namespaces: [team-a]
            resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
        """
    )
    assert "spec.pools[1].nodeSelector: pool 'reserved' is reserved for some namespaces" in str(
        error
    )
    assert "give it a label of its own" in str(error)


def test_a_resource_outside_the_vendor_domains_is_refused() -> None:
    error = refused(
        """
        pools:
          - name: amd
            nodeSelector: {pool: amd}
            resources: [{name: amd.com/gpu, sharing: Exclusive}]
        """
    )
    assert "spec.pools[0].resources[0].name: amd.com/gpu is not under spec.vendorDomains" in str(
        error
    )
    assert "add amd.com to vendorDomains" in str(error)


RULE_SET_POLICY = """
rules:
  host-devices: {enabled: false}
  privileged: {otherPods: "Off", reachablePods: Audit}
  topology: {gpuPods: Warn}
namespaceOverrides:
  - namespaces: ["dev-*", lab]
    rules:
      default: {gpuPods: Warn, otherPods: Warn}
      topology: {otherPods: "Off"}
  - namespaces: [quiet]
    rules:
      default: {enabled: false}
"""


@pytest.mark.parametrize("namespace", ["default", "dev-1", "lab", "quiet", "labs"])
def test_the_compiled_rule_steps_are_the_modes_of_each_rule_in_order(namespace: str) -> None:
    # The judging loop reads RuleSet.steps instead of each rule's modes: for every pair of
    # scopes they must say exactly what the modes say, rule by rule, in RULE_IDS order.
    from webhook.policy.model import RULE_IDS, SCOPES, SECURITY_RULES

    policy = webhook.parse_policy(policy_text(RULE_SET_POLICY), source="policy.yaml")
    ruleset = policy.rule_modes(namespace)
    on_somewhere = {
        rule
        for rule in SECURITY_RULES
        if any(ruleset[rule].for_scope(scope) != "Off" for scope in SCOPES)
    }
    assert ruleset.needs_reach == bool(on_somewhere)
    for relevance in ("gpuPods", "otherPods"):
        for reach in (*SCOPES, None):
            expected = []
            for rule in RULE_IDS:
                security = rule in SECURITY_RULES
                if security and reach is None:
                    continue
                mode = ruleset[rule].for_scope(reach if security else relevance)
                if mode != "Off":
                    expected.append((rule, mode, reach if security else None))
            assert list(ruleset.steps[relevance, reach]) == expected, (relevance, reach)
    if namespace == "quiet":
        assert ruleset.steps["gpuPods", "gpuPods"] == ()
        assert not ruleset.needs_reach


@pytest.mark.parametrize(
    "namespace, matched",
    [
        ("lab", True),
        ("dev-1", True),
        ("dev-", True),
        ("labs", False),
        ("la", False),
        ("xdev-1", False),
        ("default", False),
    ],
)
def test_namespace_names_match_exactly_and_globs_as_globs(namespace: str, matched: bool) -> None:
    policy = webhook.parse_policy(policy_text(RULE_SET_POLICY), source="policy.yaml")
    override = policy.namespace_overrides[0]
    assert override.namespaces.names == frozenset({"lab"})
    assert override.namespaces.matches(namespace) is matched


def test_a_device_plugin_daemonset_needs_a_namespace_and_a_name() -> None:
    error = refused("devicePluginDaemonSets: [{name: nvidia-device-plugin-daemonset}]")
    assert "devicePluginDaemonSets[0]" in str(error) and "namespace" in str(error)
