"""``gpu-admission policy``: validate (errors with lines, whole-policy lints, webhook wiring),
test (the shipped suites pass; a wrong expectation, a typo or an empty suite never does) and
schema. The shipped suites under policies/tests run here, which is how ``make test`` runs them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.conformance.corpus import CORPUS, POLICIES, documents, load_table, requires_corpus
from tests.support.paths import REPO
from webhook.audit import suites as policy_tests
from webhook.cli.main import main
from webhook.cli.webhook_coverage import rule_covers
from webhook.policy import load as policy
from webhook.policy.namespace_lint import covers

SHIPPED = [REPO / "policies" / "default.yaml", *sorted((REPO / "policies/examples").glob("*.yaml"))]
TESTS = REPO / "policies" / "tests"
LABELLED = REPO / "policies" / "examples" / "labelled-pools.yaml"
GPU_POD = TESTS / "labelled-pools" / "gpu-pod.yaml"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), "utf-8")
    return path


def policy_file(tmp_path: Path, spec: str, name: str = "policy.yaml") -> Path:
    head = "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
    head += "metadata:\n  name: test\nspec:\n"
    return write(tmp_path / name, head + textwrap.indent(textwrap.dedent(spec).strip(), "  "))


# --- policy validate --------------------------------------------------------------------


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_policy_is_valid_without_warnings(capsys, path: Path) -> None:
    code, out, err = run(capsys, "policy", "validate", "--strict", str(path))
    assert (code, err) == (0, "")
    *notes, verdict = out.splitlines()
    assert verdict == f"{path}: valid"
    # Each exemption is stated as information: whom it trusts. Information never fails --strict.
    assert notes and all(": info: exempts namespaces " in line for line in notes)
    assert all("it trusts everyone who may create Pods there" in line for line in notes)
    assert "\033[" not in out  # no colours when stdout is not a terminal


def test_errors_name_file_line_and_field_and_exit_1(tmp_path: Path, capsys) -> None:
    path = policy_file(
        tmp_path,
        """
        pools:
          - name: a
            nodeSelector: {gpu: a100}
            resources:
              - {name: nvidia.com/gpu, sharing: Exclusive}
          - name: a
            nodeSelector: {gpu: l4}
            resources:
              - {name: nvidia.com/mig-1g10gb, sharing: MIG}
        """,
    )
    code, out, _ = run(capsys, "policy", "validate", str(path))
    assert code == 1
    assert f"{path}:11: spec.pools[1].name: duplicate pool name 'a'" in out
    assert f"{path}:14: spec.pools[1].resources[0].name: malformed MIG resource name" in out
    assert out.splitlines()[-1] == f"{path}: invalid, 2 errors"


def test_not_yaml_is_invalid_with_its_line(tmp_path: Path, capsys) -> None:
    path = write(tmp_path / "p.yaml", "spec:\n  pools: [\n")
    code, out, _ = run(capsys, "policy", "validate", str(path))
    assert code == 1
    assert f"{path}:3: not valid YAML" in out


def test_missing_policy_file_exits_2_with_one_line(tmp_path: Path, capsys) -> None:
    code, out, err = run(capsys, "policy", "validate", str(tmp_path / "nope.yaml"))
    assert (code, out) == (2, "")
    assert err == f"gpu-admission: error: {tmp_path / 'nope.yaml'}: no such file or directory\n"


# The lint of policies that declare no GPU node taint, which most policies here do not: the
# tests that use warnings_of are about other lints (test_untainted_* are about this one).
UNTAINTED = ("no GPU node taint is declared", "declares no NoSchedule or NoExecute taint")
# The fields these lints read before the tenants block took them are warned of each (tested in
# tests/test_policy_migrate.py); the lints below keep working on them for this release.
MOVED = "in this release; `gpu-admission policy migrate` rewrites it"


def warnings_of(tmp_path: Path, capsys, spec: str) -> list[str]:
    path = policy_file(tmp_path, spec)
    code, out, _ = run(capsys, "policy", "validate", str(path))
    assert code == 0, out  # warnings alone never fail without --strict
    return [
        line.removeprefix(f"{path}:")
        for line in out.splitlines()
        if ": warning: " in line and not any(u in line for u in (*UNTAINTED, MOVED))
    ]


POOL = """
  - name: {name}
    nodeSelector: {selector}
    resources: [{{name: nvidia.com/gpu, sharing: {sharing}}}]"""


def pools(*specs: tuple[str, str, str]) -> str:
    return "pools:" + "".join(POOL.format(name=n, selector=s, sharing=m) for n, s, m in specs)


@pytest.mark.parametrize(
    "first, second",
    [
        ("{gpu: a100}", "{gpu: a100}"),  # equal selectors
        ("{gpu: a100}", "{gpu: a100, zone: west}"),  # the second pool's nodes are the first's
        ("{gpu: a100, zone: west}", "{gpu: a100}"),
    ],
)
def test_overlapping_pools_with_different_modes_are_warned(
    tmp_path: Path, capsys, first: str, second: str
) -> None:
    found = warnings_of(
        tmp_path, capsys, pools(("full", first, "Exclusive"), ("sliced", second, "TimeSlicing"))
    )
    assert len(found) == 1
    assert found[0].startswith("12: spec.pools[1].resources[0].sharing: warning: pools 'full' and")
    assert "declare nvidia.com/gpu as Exclusive and TimeSlicing" in found[0]


def test_agreeing_pools_are_not_warned(tmp_path: Path, capsys) -> None:
    spec = pools(("one", "{gpu: a100}", "Exclusive"), ("two", "{gpu: a100}", "Exclusive"))
    assert warnings_of(tmp_path, capsys, spec) == []


UNRESOLVED = "nothing says which"


def test_disjoint_pools_offering_a_resource_in_two_modes_to_one_tenant_are_warned(
    tmp_path: Path, capsys
) -> None:
    """The device plugin's default: a time-sliced L4 pool offers nvidia.com/gpu (replicas not
    renamed) beside an exclusive H100 pool; every plain nvidia.com/gpu Pod would be denied as
    ambiguous. validate says so before any Pod is."""
    spec = pools(("h100", "{gpu: h100}", "Exclusive"), ("l4", "{gpu: l4}", "TimeSlicing"))
    [found] = warnings_of(tmp_path, capsys, spec)
    assert re.match(
        r"\d+: spec.pools\[1\].resources\[0\]: warning: pools h100 \(Exclusive\), ", found
    )
    assert "l4 (TimeSlicing) all offer nvidia.com/gpu to every namespace" in found
    assert "give the tenants a poolPreference" in found


@pytest.mark.parametrize(
    "tenants, warned_for",
    [
        ("tenants: [{namespaces: ['*'], poolPreference: [h100]}]", None),
        ("tenants: [{namespaces: [ml], poolPreference: [l4, h100]}]", "every namespace"),
        (
            "tenants: [{namespaces: ['*'], poolPreference: [h100]}]\n"
            "  # l4 is ml's only: no tenant prefers among pools it cannot use\n",
            None,
        ),
    ],
)
def test_a_tenant_preference_resolves_it(
    tmp_path: Path, capsys, tenants: str, warned_for: str | None
) -> None:
    spec = pools(("h100", "{gpu: h100}", "Exclusive"), ("l4", "{gpu: l4}", "TimeSlicing"))
    found = [w for w in warnings_of(tmp_path, capsys, spec + "\n" + tenants) if UNRESOLVED in w]
    if warned_for is None:
        assert found == []
    else:
        [line] = found
        assert f"to {warned_for}," in line and "ml" not in line.split("to ")[1].split(",")[0]


def test_a_preference_naming_no_pool_is_refused(tmp_path: Path, capsys) -> None:
    spec = pools(("h100", "{gpu: h100}", "Exclusive"), ("l4", "{gpu: l4}", "TimeSlicing"))
    path = policy_file(tmp_path, spec + "\ntenants: [{namespaces: [ml], poolPreference: [h10]}]")
    code, out, _ = run(capsys, "policy", "validate", str(path))
    assert code == 1
    assert "spec.tenants[0].poolPreference[0]: no pool is named 'h10' (did you mean 'h100'?)" in out


def test_override_after_a_broader_one_is_unreachable(tmp_path: Path, capsys) -> None:
    found = warnings_of(
        tmp_path,
        capsys,
        """
        namespaceOverrides:
          - namespaces: ["*"]
            rules: {default: {gpuPods: Warn}}
          - namespaces: [ml-train]
            rules: {default: {gpuPods: Audit}}
        """,
    )
    assert found == [
        "9: spec.namespaceOverrides[1]: warning: unreachable override, its rule modes never "
        "apply: namespaceOverrides[0] ('*') matches 'ml-train' first, and the first match wins"
    ]


def test_a_shadowed_pattern_of_an_otherwise_reachable_override_is_warned(
    tmp_path: Path, capsys
) -> None:
    found = warnings_of(
        tmp_path,
        capsys,
        """
        namespaceOverrides:
          - namespaces: ["ml-*"]
            rules: {default: {gpuPods: Warn}}
          - namespaces: [web, "ml-x-*"]
            rules: {default: {gpuPods: Audit}}
        """,
    )
    assert len(found) == 1
    assert found[0].startswith("9: spec.namespaceOverrides[1].namespaces[1]: warning: this pattern")


def test_override_of_exempt_namespaces_is_unreachable(tmp_path: Path, capsys) -> None:
    found = warnings_of(
        tmp_path,
        capsys,
        """
        namespaceOverrides:
          - namespaces: [kube-system]
            rules: {default: {gpuPods: Audit}}
        exemptions:
          - namespaces: [kube-system]
        """,
    )
    assert found == [
        "7: spec.namespaceOverrides[0]: warning: unreachable override, its rule modes never "
        "apply: exemptions[0] ('kube-system') exempts 'kube-system' from every rule"
    ]


def test_an_override_before_a_broader_one_is_fine(tmp_path: Path, capsys) -> None:
    spec = """
        namespaceOverrides:
          - namespaces: [ml-train]
            rules: {default: {gpuPods: Audit}}
          - namespaces: ["ml-*"]
            rules: {default: {gpuPods: Warn}}
        """
    assert warnings_of(tmp_path, capsys, spec) == []


def test_exemption_covered_by_an_exemption_from_every_rule_is_redundant(
    tmp_path: Path, capsys
) -> None:
    found = warnings_of(
        tmp_path,
        capsys,
        """
        exemptions:
          - namespaces: ["gpu-*", kube-system]
          - namespaces: [gpu-operator]
            rules: [privileged]
          - namespaces: [kube-system]
            serviceAccounts: [device-plugin]
        """,
    )
    assert [line.split(": warning: ")[0] for line in found] == [
        "8: spec.exemptions[1]",
        "10: spec.exemptions[2]",
    ]
    assert "exemptions[0] already exempts every namespace it names (gpu-operator)" in found[0]


def test_narrower_exemptions_do_not_make_others_redundant(tmp_path: Path, capsys) -> None:
    spec = """
        exemptions:
          - namespaces: [kube-system]
            rules: [privileged]
          - namespaces: [kube-system]
            serviceAccounts: [device-plugin]
          - namespaces: [kube-system]
            rules: [host-devices]
        """
    assert warnings_of(tmp_path, capsys, spec) == []


def test_pool_open_only_to_exempt_namespaces_is_warned(tmp_path: Path, capsys) -> None:
    found = warnings_of(
        tmp_path,
        capsys,
        """
        pools:
          - name: ops
            nodeSelector: {pool: ops}
            resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
            namespaces: [kube-system]
        exemptions:
          - namespaces: [kube-system]
            rules: [pool-access, privileged]
        """,
    )
    assert len(found) == 1
    assert found[0].startswith("10: spec.pools[0].namespaces: warning: pool 'ops' is reserved only")


def test_strict_turns_warnings_into_failure(tmp_path: Path, capsys) -> None:
    path = policy_file(
        tmp_path,
        "gpuNodeTaints: [{key: gpu, effect: NoSchedule}]\n"
        "tenants: [{namespaces: [a], exemptions: [{reason: x}, {reason: y}]}]\n",
    )
    code, out, _ = run(capsys, "policy", "validate", "--strict", str(path))
    assert code == 1
    assert out.splitlines()[-1] == f"{path}: invalid (--strict), 1 warning"


REACHABLE_WARNING = "reachablePods is unset, so it follows gpuPods"
TAINTED = "gpuNodeTaints: [{key: gpu, effect: NoSchedule}]\n"


@pytest.mark.parametrize(
    "rules, warned",
    [
        ("rules: {default: {gpuPods: Enforce, otherPods: Audit}}", "every security rule"),
        ("rules: {privileged: {gpuPods: Enforce}}", "denied by privileged unless"),
        ("rules: {default: {gpuPods: Enforce, reachablePods: Warn}}", None),
        ("rules: {default: {gpuPods: Enforce, reachablePods: Enforce}}", None),
        ("rules: {default: {gpuPods: Warn}}", None),
        ("", None),  # the built-in modes: nothing written that could have meant otherwise
    ],
)
def test_gpu_pods_enforced_with_reachable_pods_unset_is_warned(
    tmp_path: Path, capsys, rules: str, warned: str | None
) -> None:
    """A policy copied from an example that writes gpuPods: Enforce denies node agents on GPU
    nodes without saying so: lint says it, naming the rules and what to write."""
    path = policy_file(tmp_path, TAINTED + rules)
    code, out, _ = run(capsys, "policy", "validate", "--strict", str(path))
    found = [line for line in out.splitlines() if REACHABLE_WARNING in line]
    if warned is None:
        assert (code, found) == (0, [])
    else:
        [line] = found
        assert code == 1 and warned in line and "node agents" in line
        assert "set reachablePods: Warn" in line


def test_a_namespace_override_enforcing_gpu_pods_is_warned_once(tmp_path: Path, capsys) -> None:
    path = policy_file(
        tmp_path,
        TAINTED + "rules: {default: {gpuPods: Warn}}\n"
        "namespaceOverrides:\n"
        "  - namespaces: [a]\n    rules: {default: {gpuPods: Enforce}}\n"
        "  - namespaces: [b]\n    rules: {default: {gpuPods: Enforce}}\n",
    )
    _, out, _ = run(capsys, "policy", "validate", str(path))
    [line] = [line for line in out.splitlines() if REACHABLE_WARNING in line]
    assert "spec.namespaceOverrides[0].rules" in line


@pytest.mark.parametrize(
    "broad, narrow, expected",
    [
        ("*", "anything-*", True),
        ("ml-*", "ml-train", True),
        ("ml-*", "ml-x-*", True),
        ("ml-*", "ml-[ab]", True),
        ("ml-?", "ml-a", True),
        ("ml-?", "ml-*", False),
        ("ml-train", "ml-*", False),
        ("ml-*", "web", False),
        ("*-dev", "team-*-dev", False),  # true, but not among the certain cases: never claimed
    ],
)
def test_pattern_coverage_claims_only_certain_cases(
    broad: str, narrow: str, expected: bool
) -> None:
    assert covers(broad, narrow) is expected


# --- policy validate --manifests --------------------------------------------------------


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders the kustomization")
def test_shipped_webhooks_send_every_kind_of_every_shipped_policy(capsys) -> None:
    args = ["policy", "validate", "--manifests", str(REPO / "manifests/webhooks")]
    code, out, err = run(capsys, *args, *map(str, SHIPPED))
    assert (code, err) == (0, ""), out
    assert out.count("cover every kind it judges") == len(SHIPPED)


def vwc_copy(tmp_path: Path, old: str, new: str) -> Path:
    source = REPO / "manifests/webhooks/validatingwebhookconfiguration.yaml"
    text = source.read_text("utf-8")
    assert old in text
    return write(tmp_path / "manifests" / source.name, text.replace(old, new))


def test_a_webhook_config_missing_a_resource_fails_naming_it(tmp_path: Path, capsys) -> None:
    vwc_copy(tmp_path, "pytorchjobs, tfjobs, xgboostjobs]", "pytorchjobs, xgboostjobs]")
    default = REPO / "policies/default.yaml"
    code, out, _ = run(
        capsys, "policy", "validate", str(default), "--manifests", str(tmp_path / "manifests")
    )
    assert code == 1
    line = next(line for line in out.splitlines() if "tfjobs" in line)
    assert line.startswith(
        f"{default}: catalogued kind TFJob: tfjobs.kubeflow.org is not sent to the validating "
        "webhook on CREATE, UPDATE"
    )
    assert "no TFJob is ever reviewed" in line and "gpu-admission webhooks rules" in line
    assert out.splitlines()[-1] == f"{default}: invalid, 1 error"


def test_a_webhook_config_missing_update_or_ephemeral_containers_fails(
    tmp_path: Path, capsys
) -> None:
    manifests = vwc_copy(
        tmp_path,
        "operations: [CREATE, UPDATE]\n        resources: [pods, pods/ephemeralcontainers,",
        "operations: [CREATE]\n        resources: [pods,",
    ).parent
    args = ["policy", "validate", str(LABELLED), "--manifests", str(manifests)]
    code, out, _ = run(capsys, *args)
    assert code == 1
    assert "built-in kind Pod: pods is not sent to the validating webhook on UPDATE" in out
    assert "built-in kind Pod: pods/ephemeralcontainers is not sent" in out
    assert "replicationcontrollers is not sent to the validating webhook on UPDATE" in out


def test_claim_templates_must_be_sent_on_create_only(tmp_path: Path, capsys) -> None:
    vwc_copy(tmp_path, "resources: [resourceclaimtemplates]", "resources: [resourceslices]")
    default = REPO / "policies/default.yaml"
    code, out, _ = run(
        capsys, "policy", "validate", str(default), "--manifests", str(tmp_path / "manifests")
    )
    assert code == 1
    [line] = [line for line in out.splitlines() if "resourceclaimtemplates" in line]
    assert line.startswith(
        f"{default}: built-in kind ResourceClaimTemplate: resourceclaimtemplates.resource.k8s.io "
        "is not sent to the validating webhook on CREATE: no rule"
    )
    assert "operations [CREATE] (manifests/webhooks has them: resourceclaims in its " in line
    assert out.splitlines()[-1] == f"{default}: invalid, 1 error"


@pytest.mark.parametrize(
    "failure_policy", ["    failurePolicy: Fail\n", ""], ids=["Fail", "the default"]
)
def test_claims_sent_to_a_webhook_that_fails_closed_are_refused(
    tmp_path: Path, capsys, failure_policy: str
) -> None:
    entry = "  - name: claims.validate.gpu-admission.io\n    admissionReviewVersions: [v1]\n"
    entry += "    sideEffects: None\n"
    vwc_copy(tmp_path, entry + "    failurePolicy: Ignore\n", entry + failure_policy)
    default = REPO / "policies/default.yaml"
    code, out, _ = run(
        capsys, "policy", "validate", str(default), "--manifests", str(tmp_path / "manifests")
    )
    assert code == 1
    [line] = [line for line in out.splitlines() if "fails closed" in line]
    assert line.startswith(
        f"{default}: resourceclaims.resource.k8s.io is sent to the validating webhook "
        f"claims.validate.gpu-admission.io in {tmp_path / 'manifests'}, which fails closed: "
    )
    assert line.endswith(
        "send resourceclaims to an entry with failurePolicy: Ignore (the "
        "claims.validate.gpu-admission.io entry of manifests/webhooks)"
    )


def test_kinds_a_policy_adds_must_be_sent_too(tmp_path: Path, capsys) -> None:
    vwc_copy(tmp_path, "- apiGroups: [ray.io]", "- apiGroups: [ray.io]")
    path = policy_file(
        tmp_path,
        """
        workloads:
          - {group: example.com, kind: Trainer, templates: [spec.template]}
        """,
    )
    code, out, _ = run(
        capsys, "policy", "validate", str(path), "--manifests", str(tmp_path / "manifests")
    )
    assert code == 1
    assert f"{path}:7: spec.workloads[0]: trainers.example.com is not sent" in out


@pytest.mark.parametrize(
    "rule, expected",
    [
        ({"apiGroups": ["*"], "resources": ["*"], "operations": ["*"]}, True),
        ({"apiGroups": ["apps"], "resources": ["*/*"], "operations": ["UPDATE"]}, True),
        ({"apiGroups": ["apps"], "resources": ["deployments"], "operations": ["CREATE"]}, False),
        ({"apiGroups": [""], "resources": ["deployments"], "operations": ["UPDATE"]}, False),
        ({"apiGroups": ["apps"], "resources": ["deployments/scale"], "operations": ["*"]}, False),
    ],
)
def test_rule_matching_follows_the_api_server(rule: dict, expected: bool) -> None:
    assert rule_covers(rule, "apps", "deployments", "UPDATE") is expected


def test_subresources_match_their_own_wildcards() -> None:
    rule = {"apiGroups": [""], "resources": ["pods/*"], "operations": ["UPDATE"]}
    assert rule_covers(rule, "", "pods/ephemeralcontainers", "UPDATE")
    assert not rule_covers(rule, "", "pods", "UPDATE")
    star = {"apiGroups": [""], "resources": ["*"], "operations": ["UPDATE"]}
    assert not rule_covers(star, "", "pods/ephemeralcontainers", "UPDATE")


@pytest.mark.parametrize("kind", ["missing", "empty", "broken"])
def test_unusable_manifests_dir_exits_2(tmp_path: Path, capsys, kind: str) -> None:
    directory = tmp_path / "m"
    if kind != "missing":
        write(directory / "a.yaml", "kind: ConfigMap\n" if kind == "empty" else "a: [\n")
    code, out, err = run(capsys, "policy", "validate", str(LABELLED), "--manifests", str(directory))
    assert (code, out) == (2, "")
    assert err.startswith("gpu-admission: error: ") and err.count("\n") == 1


# --- policy test: the shipped suites ----------------------------------------------------


def test_every_shipped_suite_passes(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # PATH defaults to policies/tests
    code, out, err = run(capsys, "policy", "test")
    lines = out.splitlines()
    suites = policy_tests.discover_suites([TESTS])
    cases = sum(len(yaml.safe_load(p.read_text())["cases"]) for p in suites)
    assert (code, err) == (0, ""), out
    assert lines[-1] == f"{cases} passed, 0 failed"
    assert len(lines) == cases + 1 and all(line.endswith(" PASSED") for line in lines[:-1])


def test_every_shipped_policy_has_a_suite() -> None:
    tested = {
        (path.parent / yaml.safe_load(path.read_text())["policy"]).resolve()
        for path in policy_tests.discover_suites([TESTS])
    }
    assert {p.resolve() for p in SHIPPED} <= tested


@requires_corpus
@pytest.mark.parametrize("policy_name", sorted(POLICIES))
def test_the_conformance_corpus_passes_as_a_policy_test_suite(
    policy_name: str, tmp_path: Path, capsys
) -> None:
    # The table is the one source of the corpus' expected outcomes: the suite is written from
    # it here, so that `policy test` itself runs every real manifest, exact rule sets and all.
    # Files of kinds the policy does not declare are left out: `policy test` rightly fails a
    # case that judges nothing (tests/test_conformance.py covers them).
    compiled = policy.load_policy(POLICIES[policy_name])
    table = {
        name: row
        for name, row in load_table()["files"].items()
        if any(
            (d.get("apiVersion", "").rpartition("/")[0], d.get("kind")) in compiled.workloads
            for d in documents(name)
        )
    }
    assert len(table) > 70
    cases = [
        {
            "name": file_name,
            "description": row["why"],
            "manifest": str(CORPUS / file_name),
            "namespace": row["namespace"],
            "expect": {"denied": [], "warned": [], "audited": [], **row[policy_name]},
        }
        for file_name, row in sorted(table.items())
    ]
    suite_path = tmp_path / f"{policy_name}-conformance.test.yaml"
    suite_path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "gpu-admission.io/v1alpha1",
                "kind": "PolicyTestSuite",
                "metadata": {"name": f"{policy_name}-conformance"},
                "policy": str(POLICIES[policy_name]),
                "cases": cases,
            },
            sort_keys=False,
        )
    )
    code, out, err = run(capsys, "policy", "test", str(suite_path))
    assert (code, err) == (0, ""), out
    assert out.splitlines()[-1] == f"{len(table)} passed, 0 failed"


# --- policy test: failing, invalid and empty suites -------------------------------------


def suite(tmp_path: Path, cases: str, *, head: str = "", name: str = "s.test.yaml") -> Path:
    text = (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: PolicyTestSuite\n"
        f"policy: {LABELLED}\n{textwrap.dedent(head)}cases:\n"
        + textwrap.indent(textwrap.dedent(cases).strip("\n"), "  ")
        + "\n"
    )
    return write(tmp_path / name, text)


def run_suite(capsys, path: Path) -> tuple[int, list[str]]:
    code, out, err = run(capsys, "policy", "test", str(path))
    assert err == ""
    return code, out.splitlines()


def test_a_wrong_expectation_fails_with_details(tmp_path: Path, capsys) -> None:
    path = suite(
        tmp_path,
        f"""
        - name: web may use the training pool
          manifest: {GPU_POD}
          namespace: web
          expect: {{verdict: allowed, denied: []}}
        """,
    )
    code, lines = run_suite(capsys, path)
    assert code == 1
    assert lines[0] == f"{path}::web may use the training pool FAILED"
    assert f"    case at {path}:5" in lines
    assert "    verdict: expected allowed, got denied" in lines
    assert "    denied: expected [], got [pool-access]" in lines
    assert any(
        re.match(r" +deny \[pool-access\] Pod/trainer: spec\.containers\[0\]", x) for x in lines
    )
    assert lines[-1] == "0 passed, 1 failed"


def test_one_failing_case_fails_the_run_among_passing_ones(tmp_path: Path, capsys) -> None:
    path = suite(
        tmp_path,
        f"""
        - name: passes
          manifest: {GPU_POD}
          namespace: ml-train
          expect: {{verdict: allowed}}
        - name: fails
          manifest: {GPU_POD}
          namespace: ml-train
          expect: {{verdict: allowed, warned: [pool-access]}}
        """,
    )
    code, lines = run_suite(capsys, path)
    assert code == 1
    assert lines[-1] == "1 passed, 1 failed"


@pytest.mark.parametrize(
    "expect, failure",
    [
        ({"messages": ["no such text"]}, "messages: no violation matches 'no such text'"),
        ({"audited": ["privileged"]}, "audited: expected [privileged], got []"),
        ({"mutation": {"none": True}}, "mutation: expected none, got a patch of Pod/trainer: "),
        ({"mutation": {"applied": False}}, "mutation.applied: expected the patch only recorded"),
        (
            {"mutation": {"patched": {"spec.tolerations[0].value": "absent"}}},
            'mutation.patched spec.tolerations[0].value: expected "absent", got "present"',
        ),
        (
            {"mutation": {"patched": {"/spec/priorityClassName": "high"}}},
            "mutation.patched /spec/priorityClassName: absent from the patched Pod/trainer",
        ),
        (
            {"mutation": {"absent": ["spec.affinity"]}},
            "mutation.absent spec.affinity: the patched Pod/trainer has it",
        ),
        (
            {"mutation": {"patched": {"metadata.annotations[gpu-admission.io/injected]": 1}}},
            "mutation.patched metadata.annotations[gpu-admission.io/injected]: expected 1",
        ),
    ],
)
def test_each_kind_of_expectation_can_fail(
    tmp_path: Path, capsys, expect: dict, failure: str
) -> None:
    case = {
        "name": "c",
        "manifest": str(GPU_POD),
        "namespace": "ml-train",
        "expect": {"verdict": "allowed", **expect},
    }
    code, lines = run_suite(capsys, suite(tmp_path, yaml.safe_dump([case])))
    assert code == 1
    assert any(line.strip().startswith(failure) for line in lines), lines
    assert lines[-1] == "0 passed, 1 failed"


def test_booleans_are_not_numbers(tmp_path: Path, capsys) -> None:
    case = {
        "name": "c",
        "object": {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "m", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                ]
            },
        },
        "namespace": "ml-train",
        "expect": {
            "verdict": "allowed",
            "mutation": {"patched": {"/spec/containers/0/resources/limits/nvidia.com~1gpu": True}},
        },
    }
    code, lines = run_suite(capsys, suite(tmp_path, yaml.safe_dump([case])))
    assert code == 1 and "expected true, got 1" in " ".join(lines)


def test_an_object_nothing_judges_fails(tmp_path: Path, capsys) -> None:
    path = suite(
        tmp_path,
        """
        - name: a typo in the kind
          object: {apiVersion: v1, kind: Pd, metadata: {name: p}}
          expect: {verdict: allowed}
        """,
    )
    code, lines = run_suite(capsys, path)
    assert code == 1
    assert any(line.startswith("    nothing was judged: no object is a Pod") for line in lines)
    assert lines[-1] == "0 passed, 1 failed"


CASE = "- name: c\n  object: {kind: Pod}\n"


@pytest.mark.parametrize(
    "cases, head, error",
    [
        pytest.param(
            CASE + "  expect: {verdict: denied, denied: [privilegd]}\n",
            "",
            ":7: cases[0].expect.denied[0]: unknown rule id 'privilegd' (did you mean "
            "'privileged'?)",
            id="misspelt rule id",
        ),
        pytest.param(
            CASE + "  expect: {verdict: allowed, warn: [privileged]}\n",
            "",
            ":7: cases[0].expect.warn: unknown key 'warn' (did you mean 'warned'?)",
            id="unknown key in expect",
        ),
        pytest.param(
            "- name: c\n  objects: {kind: Pod}\n  expect: {verdict: allowed}\n",
            "",
            ":6: cases[0].objects: unknown key 'objects' (did you mean 'object'?)",
            id="unknown key in a case",
        ),
        pytest.param(
            CASE,
            "",
            ":5: cases[0]: missing 'expect': every case states what must happen",
            id="no expectation",
        ),
        pytest.param(
            CASE + "  expect: {denied: [privileged]}\n",
            "",
            ":7: cases[0].expect: missing 'verdict'",
            id="no verdict",
        ),
        pytest.param(
            CASE + "  expect: {verdict: alowed}\n",
            "",
            ":7: cases[0].expect.verdict: 'alowed' is not one of allowed, denied",
            id="misspelt verdict",
        ),
        pytest.param(
            "- name: c\n  expect: {verdict: allowed}\n",
            "",
            ":5: cases[0]: give exactly one of 'manifest' (a path) and 'object' (inline)",
            id="nothing to review",
        ),
        pytest.param(
            "- name: c\n  manifest: nope.yaml\n  expect: {verdict: allowed}\n",
            "",
            ":6: cases[0].manifest: ",
            id="missing manifest",
        ),
        pytest.param(
            CASE + "  expect: {verdict: allowed, messages: ['(']}\n",
            "",
            ":7: cases[0].expect.messages[0]: invalid regular expression",
            id="bad regex",
        ),
        pytest.param(
            CASE + "  expect: {verdict: allowed}\n" + CASE + "  expect: {verdict: allowed}\n",
            "",
            ":8: cases[1].name: duplicate case name 'c'",
            id="duplicate case name",
        ),
        pytest.param(
            CASE + "  expect: {verdict: allowed}\n  expect: {}\n",
            "",
            ":8: cases[0].expect: duplicate key",
            id="duplicate key",
        ),
        pytest.param(
            CASE + "  expect:\n    verdict: allowed\n    mutation: {none: true, applied: true}\n",
            "",
            ":9: cases[0].expect.mutation: 'none: true' cannot be combined",
            id="none with others",
        ),
        pytest.param(
            CASE + "  expect:\n    verdict: allowed\n    mutation: {absent: ['spec..x']}\n",
            "",
            ":9: cases[0].expect.mutation.absent[0]: invalid field path 'spec..x'",
            id="bad field path",
        ),
        pytest.param(
            "[]", "", ":5: cases: no cases: a suite that tests nothing fails", id="zero cases"
        ),
        pytest.param("[]", "namespace: ML\n", ":4: namespace: 'ML' does not match", id="bad ns"),
    ],
)
def test_an_invalid_suite_is_an_error(
    tmp_path: Path, capsys, cases: str, head: str, error: str
) -> None:
    path = suite(tmp_path, cases, head=head)
    code, lines = run_suite(capsys, path)
    assert code == 1
    assert lines[0] == f"{path} ERROR"
    assert any(line.startswith(f"    {path}{error}") for line in lines), lines
    assert lines[-1] == "0 passed, 0 failed, 1 error"


def test_a_suite_of_another_kind_is_an_error(tmp_path: Path, capsys) -> None:
    path = write(tmp_path / "x.test.yaml", "apiVersion: v1\nkind: ConfigMap\n")
    code, lines = run_suite(capsys, path)
    assert code == 1
    assert f"    {path}:2: kind: must be 'PolicyTestSuite', not 'ConfigMap'" in lines


def test_a_suite_with_an_invalid_policy_is_an_error(tmp_path: Path, capsys) -> None:
    broken = write(tmp_path / "p.yaml", "spec: {}\n")
    path = write(
        tmp_path / "s.test.yaml",
        """
        apiVersion: gpu-admission.io/v1alpha1
        kind: PolicyTestSuite
        policy: p.yaml
        cases:
          - {name: c, object: {kind: Pod}, expect: {verdict: allowed}}
        """,
    )
    code, lines = run_suite(capsys, path)
    assert code == 1
    assert f"    {path}:3: policy: policy {broken} cannot be used" in lines
    assert lines[-1] == "0 passed, 0 failed, 1 error"


def test_namespace_of_the_case_wins_then_the_suite_then_the_object(tmp_path: Path, capsys) -> None:
    write(
        tmp_path / "privileged.yaml",
        """
        apiVersion: v1
        kind: Pod
        metadata: {name: p, namespace: kube-system}
        spec:
          containers:
            - name: m
              image: i
              securityContext: {privileged: true}
              resources: {limits: {nvidia.com/gpu: 1}}
        """,
    )
    cases = """
        - name: its own namespace, exempt
          manifest: privileged.yaml
          expect: {verdict: allowed, audited: []}
        - name: the case's namespace wins
          manifest: privileged.yaml
          namespace: ml-train
          expect: {verdict: denied, denied: [privileged]}
        """
    code, lines = run_suite(capsys, suite(tmp_path, cases))
    assert (code, lines[-1]) == (0, "2 passed, 0 failed")
    code, lines = run_suite(capsys, suite(tmp_path, cases, head="namespace: research\n"))
    assert lines[-1] == "1 passed, 1 failed"
    assert any("its own namespace, exempt FAILED" in line for line in lines)


def test_suites_are_found_recursively_by_name(tmp_path: Path, capsys) -> None:
    case = f"- {{name: c, manifest: {GPU_POD}, namespace: ml-x, expect: {{verdict: allowed}}}}\n"
    suite(tmp_path, case, name="a.test.yaml")
    suite(tmp_path / "sub", case, name="b.test.yml")
    suite(tmp_path, case, name="not-a-suite.yaml")
    code, out, _ = run(capsys, "policy", "test", str(tmp_path))
    assert code == 0
    assert [line.split("::")[0] for line in out.splitlines()[:-1]] == [
        str(tmp_path / "a.test.yaml"),
        str(tmp_path / "sub" / "b.test.yml"),
    ]


def test_no_suites_is_a_failure(tmp_path: Path, capsys) -> None:
    code, out, _ = run(capsys, "policy", "test", str(tmp_path))
    assert code == 1
    assert out.splitlines()[-1] == "0 passed, 0 failed"


def test_a_missing_path_exits_2(tmp_path: Path, capsys) -> None:
    code, out, err = run(capsys, "policy", "test", str(tmp_path / "nope"))
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "no such file or directory" in err


# --- policy schema and help -------------------------------------------------------------


def test_schema_prints_the_policy_schema(capsys) -> None:
    code, out, _ = run(capsys, "policy", "schema")
    assert code == 0 and json.loads(out) == policy.schema()


def test_schema_of_suites_is_printed_and_is_a_valid_schema(capsys) -> None:
    import jsonschema

    code, out, _ = run(capsys, "policy", "schema", "--suite")
    assert code == 0 and json.loads(out) == policy_tests.schema()
    jsonschema.validators.validator_for(policy_tests.schema()).check_schema(policy_tests.schema())


@pytest.mark.parametrize("command", ["validate", "test", "schema", "migrate"])
def test_every_command_has_help_with_examples(capsys, command: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["policy", command, "--help"])
    assert exit_info.value.code == 0
    assert "examples:\n  gpu-admission policy " + command in capsys.readouterr().out


def test_policy_help_has_examples_and_validate_says_why_tolerations_need_no_lint(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["policy", "--help"])
    assert "examples:\n  gpu-admission policy validate " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["policy", "validate", "--help"])
    # The policy has no tolerations to mismatch: they are derived from the declared taints.
    assert "derived from them, so they always match" in capsys.readouterr().out


def test_a_directory_is_not_a_policy_file(tmp_path: Path, capsys) -> None:
    code, out, err = run(capsys, "policy", "validate", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == f"gpu-admission: error: {tmp_path}: is a directory, expected a policy file\n"


def test_a_case_the_engine_fails_on_is_an_error_and_the_others_still_run(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webhook.admission.objects import decide_object

    def failing(obj, *args, **kwargs):
        if (obj.get("metadata") or {}).get("name") == "broken":
            raise RuntimeError("the engine broke\non two lines")
        return decide_object(obj, *args, **kwargs)

    monkeypatch.setattr("webhook.audit.suites.decide_object", failing)
    path = suite(
        tmp_path,
        f"""
        - name: the engine fails
          object: {{apiVersion: v1, kind: Pod, metadata: {{name: broken}}, spec: {{}}}}
          expect: {{verdict: allowed}}
        - name: passes
          manifest: {GPU_POD}
          namespace: ml-train
          expect: {{verdict: allowed}}
        """,
    )
    code, lines = run_suite(capsys, path)
    assert code == 1
    assert lines == [
        f"{path}::the engine fails ERROR",
        f"    {path}:5: the engine raised RuntimeError: the engine broke on two lines",
        f"{path}::passes PASSED",
        "1 passed, 0 failed, 1 error",
    ]
    with pytest.raises(RuntimeError, match="the engine broke"):
        main(["policy", "test", str(path), "--debug"])


def test_a_closed_pipe_ends_the_output_quietly(tmp_path: Path) -> None:
    # `gpu-admission policy schema | head -1`: the reader is gone before the output is.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "webhook.cli", "policy", "schema"],
            cwd=REPO,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


def test_the_shipped_match_conditions_cover_the_strict_policy(capsys) -> None:
    strict = REPO / "policies" / "examples" / "strict.yaml"
    code, out, _ = run(
        capsys,
        "policy",
        "validate",
        str(strict),
        "--manifests",
        str(REPO / "manifests" / "webhooks"),
    )
    assert code == 0, out
    assert out.splitlines()[-1].startswith(f"{strict}: valid")


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("gpuNodesTainted: false", "every Pod can reach a GPU node under this policy"),
        (
            "vendorDomains: [nvidia.com, amd.com]\n"
            "gpuNodeTaints: [{key: nvidia.com/gpu, effect: NoSchedule}]",
            "they never look at resources under amd.com",
        ),
    ],
)
def test_match_conditions_that_miss_pods_needing_void_fail(
    tmp_path: Path, capsys, spec: str, reason: str
) -> None:
    path = policy_file(tmp_path, f"{spec}\ndeviceVisibility: {{injectVoid: true}}\n")
    code, out, _ = run(
        capsys, "policy", "validate", str(path), "--manifests", str(REPO / "manifests" / "webhooks")
    )
    assert code == 1, out
    line = next(line for line in out.splitlines() if "matchConditions" in line)
    assert ": spec.deviceVisibility.injectVoid: the matchConditions of the" in line
    assert reason in line and "delete the matchConditions" in line


EXCEPTION = """
exceptions:
  - name: {name}
    owner: ml-platform@example.com
    expires: "{expires}"
    namespace: ml
    match: {{selector: {{matchLabels: {{app: llama}}}}}}
    rules: [privileged]"""


def test_an_expired_exception_is_warned_naming_its_owner(tmp_path: Path, capsys) -> None:
    spec = TAINTED + EXCEPTION.format(name="old", expires="2020-01-31")
    spec += EXCEPTION.format(name="current", expires="2999-01-31").replace("exceptions:", "")
    path = policy_file(tmp_path, spec)
    code, out, _ = run(capsys, "policy", "validate", "--strict", str(path))
    assert code == 1
    [line] = [line for line in out.splitlines() if ": warning: exception " in line]
    assert re.search(r":\d+: spec.exceptions\[0\]: warning: exception 'old' expired", line)
    assert "renew it with its owner ml-platform@example.com, or delete it" in line


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            EXCEPTION.format(name="a", expires="2027-13-01"),
            "spec.exceptions[0].expires: not a date or time",
        ),
        (
            EXCEPTION.format(name="a", expires="2999-01-01")
            + EXCEPTION.format(name="a", expires="2999-01-01").replace("exceptions:", ""),
            "spec.exceptions[1].name: duplicate exception 'a'",
        ),
        (
            EXCEPTION.format(name="a", expires="9999-12-31"),
            "spec.exceptions[0].expires: not a date or time this policy can hold",
        ),
        (
            EXCEPTION.format(name="a", expires="2999-01-01").replace(
                "{matchLabels: {app: llama}}", "{matchLabels: {}}"
            ),
            "spec.exceptions[0].match.selector: this selector matches Pods that carry no label",
        ),
        (
            EXCEPTION.format(name="a", expires="2999-01-01").replace(
                "{matchLabels: {app: llama}}",
                "{matchExpressions: [{key: app, operator: NotIn, values: [x]}]}",
            ),
            "this selector matches Pods that carry no label",
        ),
        (
            EXCEPTION.format(name="a", expires="2999-01-01").replace(
                "{matchLabels: {app: llama}}",
                "{matchExpressions: [{key: app, operator: Exists, values: [llama]}]}",
            ),
            "spec.exceptions[0].match.selector.matchExpressions[0]: operator Exists takes no "
            "values",
        ),
        (
            EXCEPTION.format(name="a", expires="2999-01-01").replace(
                "rules: [privileged]", "rules: [topology, gpu-quantity]"
            ),
            "spec.exceptions[0].rules[1]: gpu-quantity cannot be excepted",
        ),
        (
            EXCEPTION.format(name="a", expires="2999-01-01").replace(
                "rules: [privileged]", "rules: [pool-access]"
            ),
            "spec.exceptions[0].rules[0]: pool-access cannot be excepted",
        ),
    ],
    ids=[
        "no such date",
        "duplicate name",
        "past the calendar",
        "empty selector",
        "only NotIn",
        "Exists with values",
        "gpu-quantity",
        "pool-access",
    ],
)
def test_a_broken_exception_is_refused(tmp_path: Path, capsys, spec: str, message: str) -> None:
    code, out, _ = run(capsys, "policy", "validate", str(policy_file(tmp_path, TAINTED + spec)))
    assert code == 1 and message in out


def test_an_exception_lifting_a_security_rule_says_what_it_gives(tmp_path: Path, capsys) -> None:
    path = policy_file(tmp_path, TAINTED + EXCEPTION.format(name="dbg", expires="2999-01-01"))
    code, out, _ = run(capsys, "policy", "validate", "--strict", str(path))
    assert code == 0
    assert "spec.exceptions[0]: info: exception 'dbg' lifts privileged whole" in out
