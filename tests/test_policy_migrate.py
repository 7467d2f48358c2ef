"""``gpu-admission policy migrate``: the per-namespace settings move into ``tenants`` and every
decision stays the same.

The acceptance test: every shipped policy, every policy file of the tests (among them the
shipped ones as they were before they were migrated, in tests/fixtures/before-tenants) and the
policies the check suites embed, migrated, decide every object of the corpus (the conformance
manifests, the project's fixtures, the example suites' objects, and probes aimed at each
pool, binder and exemption of the policy) exactly as before, in every namespace the policy
names and in one it names nowhere: the same verdict, warnings, findings, audit annotations
and patch, and the same verdict again on the patched Pod. Then the migration's own
promises: idempotence, comments and order kept, entries merged only into an equal
``namespaces`` list, first-match rule modes in their order; and generated policies (hypothesis)
that combine all of it.
"""

from __future__ import annotations

import copy
import re
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webhook
from tests.checks.test_modes_and_scope import EXEMPTIONS_SPEC, OVERRIDES_SPEC
from tests.checks.test_pool_confinement import POOLS as CONFINED_POOLS
from tests.conformance.corpus import CORPUS
from tests.support.admission import POOLS_SPEC
from tests.support.paths import REPO, SHARED
from tests.test_compile import POOLS as COMPILED_POOLS
from tests.test_compile import TAINTED
from tests.test_policy import RULE_SET_POLICY
from webhook.admission.objects import admission_review
from webhook.cli.main import main
from webhook.policy.migrate import migrate_policy

NOW = 1_800_000_000.0  # the time exceptions are judged at: fixed, as decisions must be
OLD_FIELDS = ("binderNamespaces", "exemptions", "namespaceOverrides")
UNNAMED = "named-by-no-pattern"


def document(spec: str, name: str = "embedded") -> str:
    body = textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ")
    return (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        f"metadata:\n  name: {name}\nspec:\n{body}\n"
    )


def policy_files() -> list[Path]:
    """The shipped policies and every policy file under tests/ and policies/tests/."""
    shipped = [REPO / "policies" / "default.yaml", *sorted((REPO / "policies/examples").glob("*"))]
    found = [
        path
        for folder in (REPO / "tests" / "fixtures", REPO / "policies" / "tests")
        for path in sorted(folder.rglob("*.y*ml"))
        if "kind: GPUAdmissionPolicy" in path.read_text("utf-8")
    ]
    return shipped + found


# The policies the check suites build from text, where they keep it in a constant.
EMBEDDED = {
    "tests/support POOLS_SPEC": POOLS_SPEC,
    "test_pool_confinement POOLS": CONFINED_POOLS,
    "test_pool_confinement POOLS, pool-access exempt": CONFINED_POOLS
    + "exemptions: [{namespaces: [ml], rules: [pool-access]}]\n",
    "test_modes_and_scope OVERRIDES": OVERRIDES_SPEC,
    "test_modes_and_scope EXEMPTIONS": EXEMPTIONS_SPEC,
    "test_policy RULE_SET_POLICY": RULE_SET_POLICY,
    "test_compile POOLS": TAINTED + COMPILED_POOLS,
}
POLICIES = {str(p.relative_to(REPO)): p.read_text("utf-8") for p in policy_files()}
POLICIES.update({name: document(spec) for name, spec in EMBEDDED.items()})


# --- The corpus -----------------------------------------------------------------------------


def _documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text("utf-8")) if isinstance(d, dict)]


@cache
def corpus() -> tuple[dict, ...]:
    """Every object of the conformance corpus (where it lies beside the repository), of the
    project's fixtures and of the example suites."""
    objects: list[dict] = []
    shared = [CORPUS, SHARED / "conformance" / "governance", SHARED / "conformance" / "dra"]
    for folder in shared:
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
            objects += _documents(path)
    for path in sorted((REPO / "tests" / "fixtures").glob("*.json")):
        objects.append(yaml.safe_load(path.read_text("utf-8"))["request"]["object"])
    for path in sorted((REPO / "tests" / "fixtures" / "catalogue").glob("*.yaml")):
        objects += [d for d in _documents(path) if "kind" in d]
    for path in sorted((REPO / "policies" / "tests").rglob("*.yaml")):
        for doc in _documents(path):
            if doc.get("kind") == "PolicyTestSuite":
                objects += [c["object"] for c in doc["cases"] if "object" in c]
            elif doc.get("kind") != "GPUAdmissionPolicy":
                objects.append(doc)
    return tuple(objects)


def _gpu_pod(name: str, **spec: Any) -> dict:
    container = {
        "name": "app",
        "image": "registry.example.com/app:1",
        "resources": {"limits": {spec.pop("resource", "nvidia.com/gpu"): 1}},
    }
    metadata = {"name": name, **spec.pop("metadata", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [container], **spec},
    }


def probes(doc: dict) -> list[dict]:
    """Pods aimed at what the policy says per namespace: each pool (by annotation, asking for
    what it offers), a named node, a wildcard toleration with a host path, each service
    account an exemption names."""
    spec = doc["spec"]
    pods = [
        _gpu_pod("named-node", nodeName="gpu-node-1"),
        _gpu_pod(
            "agent",
            tolerations=[{"operator": "Exists"}],
            volumes=[{"name": "dev", "hostPath": {"path": "/dev"}}],
        ),
    ]
    for pool in spec.get("pools", []):
        pods.append(
            _gpu_pod(
                f"in-{pool['name']}",
                resource=pool["resources"][0]["name"],
                metadata={"annotations": {"gpu-admission.io/pool": pool["name"]}},
            )
        )
    accounts = {a for e in spec.get("exemptions", []) for a in e.get("serviceAccounts", [])}
    for account in sorted(accounts):
        pod = _gpu_pod(f"as-{account}", serviceAccountName=account)
        pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        pods.append(pod)
    return pods


def _sample(pattern: str) -> str:
    """A namespace name a pattern matches: each glob character replaced by one it admits."""
    sample = re.sub(r"\[!?([^\]])[^\]]*\]", r"\1", pattern)
    return sample.replace("*", "x").replace("?", "a")


def namespaces(doc: dict) -> list[str]:
    """Every namespace the policy names (a sample of each glob) and one it names nowhere."""
    spec = doc["spec"]
    patterns: list[str] = []
    for pool in spec.get("pools", []):
        patterns += pool.get("namespaces", [])
    patterns += spec.get("binderNamespaces", [])
    for key in ("exemptions", "namespaceOverrides", "tenants"):
        for entry in spec.get(key, []):
            patterns += entry["namespaces"]
    patterns += [e["namespace"] for e in spec.get("exceptions", [])]
    return sorted({_sample(p) for p in patterns} | {UNNAMED, "default"})


def decisions(policy: webhook.Policy, obj: dict, namespace: str) -> list[Any]:
    """Everything a decision holds: the response (verdict, message, warnings, audit
    annotations, patch), the findings and the patch; and the decision on the patched Pod."""

    def decide(target: dict, mutate: bool) -> Any:
        try:
            review = admission_review(target, namespace, uid="migrate")
            made = webhook.decide(review, policy, mutate=mutate, now=NOW)
        except Exception as exc:  # the same failure in both is the same decision
            return repr(exc)
        return made

    validated, mutated = decide(obj, False), decide(obj, True)
    found: list[Any] = []
    for made in (validated, mutated):
        found.append(made if isinstance(made, str) else (made.response, made.findings, made.patch))
    if not isinstance(mutated, str) and mutated.patch:
        patched = jsonpatch.apply_patch(copy.deepcopy(obj), list(mutated.patch))
        again = decide(patched, False)
        found.append(again if isinstance(again, str) else (again.response, again.findings))
    return found


def assert_same_decisions(old_text: str, new_text: str, extra: list[dict] = ()) -> int:
    """Judge every object in every namespace under both; returns how many were compared."""
    doc = yaml.safe_load(old_text)
    old = webhook.parse_policy(old_text, "<old>")
    new = webhook.parse_policy(new_text, "<new>")
    differences = []
    compared = 0
    objects = [*corpus(), *probes(doc), *extra]
    for namespace in namespaces(doc):
        for obj in objects:
            compared += 1
            if decisions(old, obj, namespace) != decisions(new, obj, namespace):
                name = (obj.get("metadata") or {}).get("name")
                differences.append(f"{obj.get('kind')} {name} in {namespace}")
    assert differences == [], differences[:10]
    return compared


def has_old_fields(text: str) -> bool:
    spec = yaml.safe_load(text)["spec"]
    return any(k in spec for k in OLD_FIELDS) or any(
        "namespaces" in p for p in spec.get("pools", [])
    )


def deprecations(text: str) -> list[str]:
    return [
        w.message for w in webhook.parse_policy(text).warnings if "moves into tenants" in w.message
    ]


# --- The acceptance test --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_migrated_policy_decides_the_corpus_as_before(name: str) -> None:
    text = POLICIES[name]
    migration = migrate_policy(text, name)
    assert not has_old_fields(migration.text)
    assert bool(migration.moves) == has_old_fields(text)
    compared = assert_same_decisions(text, migration.text)
    assert compared > len(corpus())
    # The old fields are warned of; the migrated policy has nothing to warn of.
    assert bool(deprecations(text)) == has_old_fields(text)
    assert deprecations(migration.text) == []
    # Idempotent: a migrated policy has nothing left to move.
    assert migrate_policy(migration.text, name) == type(migration)(migration.text, ())


def test_the_corpus_is_the_whole_corpus() -> None:
    """The acceptance test judges what it says: the conformance manifests (where they lie
    beside the repository), the fixtures and the suites' objects."""
    kinds = {obj.get("kind") for obj in corpus()}
    assert {"Pod", "Deployment", "Job", "DaemonSet", "PyTorchJob", "Workflow"} <= kinds
    if CORPUS.is_dir():
        assert len(corpus()) > 250
    assert any(has_old_fields(t) for t in POLICIES.values())
    assert len([n for n in POLICIES if n.startswith(("policies/", "tests/"))]) >= 8


def test_each_old_field_is_warned_of_at_its_line() -> None:
    found = [
        (w.line, w.path, w.message)
        for w in webhook.parse_policy(COMMENTED).warnings
        if "moves into" in w.message
    ]
    then = "in this release; `gpu-admission policy migrate` rewrites it"
    assert found == [
        (
            12,
            "spec.pools[0].namespaces",
            f"spec.pools[0].namespaces moves into tenants[].reservedPools {then}",
        ),
        (19, "spec.binderNamespaces", f"spec.binderNamespaces moves into tenants[].binder {then}"),
        (
            22,
            "spec.namespaceOverrides",
            f"spec.namespaceOverrides moves into tenants[].rules {then}",
        ),
        (30, "spec.exemptions", f"spec.exemptions moves into tenants[].exemptions {then}"),
    ]


# --- What the migration writes ----------------------------------------------------------------

COMMENTED = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata:
  name: commented
spec:
  # The pools.
  pools:
    - name: a100
      nodeSelector: {pool: a100}
      taints: [{key: pool, value: a100, effect: NoSchedule}]
      resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
      namespaces: [team-a]  # team A bought these
      # after the namespaces of a100
    - name: l4
      nodeSelector: {pool: l4}
      taints: [{key: pool, value: l4, effect: NoSchedule}]
      resources: [{name: nvidia.com/gpu.shared, sharing: TimeSlicing}]
  # The binder.
  binderNamespaces: [volcano-system]
  rules:
    default: {gpuPods: Enforce, reachablePods: Warn}
  namespaceOverrides:
    # Team A tries things out.
    - namespaces: [team-a]
      rules: {privileged: {gpuPods: Warn}}  # for now
    - namespaces: ["lab-*"]
      rules:
        default: {gpuPods: Audit}
  # Who is exempt.
  exemptions:
    # The operators.
    - namespaces:
        - kube-system   # control plane
        - gpu-operator  # GPU Operator
      reason: Operators manage drivers.
    # Monitoring's node-exporter.
    - namespaces: [monitoring]
      serviceAccounts: [node-exporter]
      rules: [host-devices]
  # The end.
  newChecks: Warn
"""

MIGRATED = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUAdmissionPolicy
metadata:
  name: commented
spec:
  # The pools.
  pools:
    - name: a100
      nodeSelector: {pool: a100}
      taints: [{key: pool, value: a100, effect: NoSchedule}]
      resources: [{name: nvidia.com/gpu, sharing: Exclusive}]
      # after the namespaces of a100
    - name: l4
      nodeSelector: {pool: l4}
      taints: [{key: pool, value: l4, effect: NoSchedule}]
      resources: [{name: nvidia.com/gpu.shared, sharing: TimeSlicing}]
  # The binder.
  tenants:
    # Team A tries things out.
    - namespaces: [team-a] # team A bought these
      reservedPools: [a100]
      rules: {privileged: {gpuPods: Warn}} # for now
    - namespaces: [volcano-system]
      binder: true
    - namespaces: ["lab-*"]
      rules:
        default: {gpuPods: Audit}
    # The operators.
    - namespaces:
        - kube-system   # control plane
        - gpu-operator  # GPU Operator
      exemptions:
        - reason: Operators manage drivers.
    # Monitoring's node-exporter.
    - namespaces: [monitoring]
      exemptions:
        - serviceAccounts: [node-exporter]
          rules: [host-devices]
          reason: moved from spec.exemptions[1], which gave no reason
  rules:
    default: {gpuPods: Enforce, reachablePods: Warn}
  # Who is exempt.
  # The end.
  newChecks: Warn
"""


def test_every_comment_and_the_order_of_what_stays_are_kept() -> None:
    migration = migrate_policy(COMMENTED)
    assert migration.text == MIGRATED
    assert migration.moves == (
        "spec.pools[0].namespaces (team-a) -> spec.tenants[0].reservedPools",
        "spec.binderNamespaces (volcano-system) -> spec.tenants[1].binder",
        "spec.namespaceOverrides[0] (team-a) -> spec.tenants[0].rules",
        "spec.namespaceOverrides[1] (lab-*) -> spec.tenants[2].rules",
        "spec.exemptions[0] (kube-system, gpu-operator) -> spec.tenants[3].exemptions[0]",
        "spec.exemptions[1] (monitoring) -> spec.tenants[4].exemptions[0]",
        "note: spec.exemptions[1] gave no reason, which an exemption now states: say whom it "
        "trusts and why in spec.tenants[4].exemptions[0].reason",
    )
    assert_same_decisions(COMMENTED, migration.text)


@pytest.mark.parametrize(
    "written, migrated",
    [
        # Sequences at the key's own indentation (as kubectl writes them) stay so.
        (
            "  gpuNodeTaints:\n  - {key: a, effect: NoSchedule}\n"
            "  exemptions:\n  - namespaces:\n    - b\n    reason: r\n",
            "  gpuNodeTaints:\n  - {key: a, effect: NoSchedule}\n"
            "  tenants:\n  - namespaces:\n    - b\n    exemptions:\n    - reason: r\n",
        ),
        # Four spaces a level.
        (
            "    gpuNodeTaints: [{key: a, effect: NoSchedule}]\n    binderNamespaces: [b]\n",
            "    gpuNodeTaints: [{key: a, effect: NoSchedule}]\n"
            "    tenants:\n      - namespaces: [b]\n        binder: true\n",
        ),
    ],
)
def test_the_policy_keeps_its_indentation(written: str, migrated: str) -> None:
    head = "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
    indent = written[: len(written) - len(written.lstrip())]
    head += f"metadata:\n{indent}name: x\nspec:\n"
    assert migrate_policy(head + written).text == head + migrated


def test_the_comment_about_the_next_field_stays_before_it() -> None:
    text = document(
        TAINTED
        + "exemptions:\n  - namespaces: [kube-system]\n    reason: control plane\n"
        + "# About the daemon sets.\ndevicePluginDaemonSets: [{namespace: a, name: b}]\n"
    )
    migrated = migrate_policy(text).text
    assert migrated.endswith(
        "  tenants:\n    - namespaces: [kube-system]\n      exemptions:\n"
        "        - reason: control plane\n  # About the daemon sets.\n"
        "  devicePluginDaemonSets: [{namespace: a, name: b}]\n"
    )


def test_the_lines_up_to_an_explicit_document_start_are_kept() -> None:
    head = "# yaml-language-server: $schema=policy.schema.json\n---\n"
    text = document(TAINTED + "binderNamespaces: [b]\n")
    assert migrate_policy(head + text).text.startswith(head + "apiVersion:")


def test_a_policy_with_nothing_to_move_is_left_byte_for_byte() -> None:
    text = COMMENTED.replace("  newChecks: Warn\n", "  newChecks:   Warn   # spaced\n")
    migrated = migrate_policy(text).text
    assert migrate_policy(migrated) == type(migrate_policy(migrated))(migrated, ())


def spec_of(migrated: str) -> dict:
    return yaml.safe_load(migrated)["spec"]


def test_entries_merge_only_into_an_exactly_equal_namespaces_list() -> None:
    text = document(
        TAINTED
        + """
tenants:
  - namespaces: [a, b]
    poolPreference: [p]
  - namespaces: [b, a]
    contact: ops@example.com
    grants: {hostIPC: true}
pools:
  - {name: p, nodeSelector: {pool: p}, resources: [{name: nvidia.com/gpu, sharing: Exclusive}]}
binderNamespaces: [b, a]
exemptions: [{namespaces: [a], reason: ops}, {namespaces: [a, b], reason: agents}]
"""
    )
    tenants = spec_of(migrate_policy(text).text)["tenants"]
    assert tenants == [
        {
            "namespaces": ["a", "b"],
            "poolPreference": ["p"],
            "exemptions": [{"reason": "agents"}],
        },
        {
            "namespaces": ["b", "a"],
            "contact": "ops@example.com",
            "grants": {"hostIPC": True},
            "binder": True,
        },
        {"namespaces": ["a"], "exemptions": [{"reason": "ops"}]},
    ]


def test_moved_rule_modes_keep_their_order() -> None:
    """The first match wins: a later override never merges into an entry before an earlier
    one's, and moved overrides go before the entries that state rules already (the old
    overrides were consulted first)."""
    text = document(
        TAINTED
        + """
tenants:
  - namespaces: [b]
    grants: {hostIPC: true}
  - namespaces: ["*"]
    rules: {privileged: {gpuPods: Audit}}
namespaceOverrides:
  - namespaces: [a]
    rules: {privileged: {gpuPods: Warn}}
  - namespaces: [b]
    rules: {privileged: {gpuPods: "Off"}}
  - namespaces: [a, b]
    rules: {privileged: {gpuPods: Warn}}
"""
    )
    migration = migrate_policy(text)
    tenants = spec_of(migration.text)["tenants"]
    # [b] states no rules yet, but comes before the first moved override's entry.
    assert [(t["namespaces"], "rules" in t) for t in tenants] == [
        (["b"], False),
        (["a"], True),
        (["b"], True),
        (["a", "b"], True),
        (["*"], True),
    ]
    assert migration.moves[-1] == (
        "note: the entries from spec.tenants[1] on are now spec.tenants[4] on (the moved "
        "namespace overrides go first)"
    )
    assert_same_decisions(text, migration.text)


def test_a_block_that_granted_nothing_still_does() -> None:
    text = document(TAINTED + "tenants: []\nbinderNamespaces: [volcano-system]\n")
    migrated = migrate_policy(text).text
    assert spec_of(migrated)["tenants"] == [
        {"namespaces": ["volcano-system"], "grants": {}, "binder": True}
    ]
    assert not webhook.parse_policy(migrated).grants("ml").capabilities
    assert_same_decisions(text, migrated)


def test_a_policy_that_does_not_load_is_not_migrated() -> None:
    with pytest.raises(webhook.PolicyError):
        migrate_policy(document("binderNamespaces: []"))


# --- The command --------------------------------------------------------------------------


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_migrate_prints_the_policy_and_what_moved(tmp_path: Path, capsys) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(COMMENTED, "utf-8")
    code, out, err = run(capsys, "policy", "migrate", str(path))
    assert (code, out) == (0, MIGRATED)
    assert err.splitlines()[0] == (
        "gpu-admission: spec.pools[0].namespaces (team-a) -> spec.tenants[0].reservedPools"
    )
    assert path.read_text("utf-8") == COMMENTED


def test_migrate_writes_out_or_in_place_and_then_has_nothing_to_do(tmp_path: Path, capsys) -> None:
    path, out_path = tmp_path / "policy.yaml", tmp_path / "migrated.yaml"
    path.write_text(COMMENTED, "utf-8")
    assert run(capsys, "policy", "migrate", str(path), "-o", str(out_path))[:2] == (0, "")
    assert out_path.read_text("utf-8") == MIGRATED
    assert run(capsys, "policy", "migrate", str(path), "--in-place")[:2] == (0, "")
    assert path.read_text("utf-8") == MIGRATED
    code, out, err = run(capsys, "policy", "migrate", str(path), "--in-place")
    assert (code, out, err) == (0, "", f"gpu-admission: {path}: nothing to migrate\n")


def test_migrate_refuses_a_policy_that_does_not_load(tmp_path: Path, capsys) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(document("binderNamespaces: []"), "utf-8")
    code, out, err = run(capsys, "policy", "migrate", str(path), "--in-place")
    assert (code, out) == (1, "")
    assert f"{path}:6: spec.binderNamespaces: [] should be non-empty" in err
    assert err.splitlines()[-1] == f"{path}: invalid, 1 error"
    assert path.read_text("utf-8") == document("binderNamespaces: []")


def test_migrate_of_a_missing_file_or_two_destinations_is_misuse(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "missing.yaml"
    code, _, err = run(capsys, "policy", "migrate", str(missing))
    assert (code, err) == (2, f"gpu-admission: error: {missing}: no such file or directory\n")
    with pytest.raises(SystemExit) as exited:
        main(["policy", "migrate", str(missing), "-o", "x.yaml", "--in-place"])
    assert exited.value.code == 2


# --- Generated policies -------------------------------------------------------------------

NAMESPACE_LISTS = (["team-a"], ["team-*"], ["team-a", "ml"], ["ml"], ["ml-?", "ops"])
JUDGED_IN = ("team-a", "team-b", "ml", "ml-1", "ops", "other")
RULES = ("privileged", "host-devices", "pool-access", "sharing-mode")
MODES = ("Warn", "Audit", '"Off"', "Enforce")


def _flow_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


@st.composite
def old_policies(draw) -> str:
    """Policies of the old shape with everything that moves, and tenants entries (none, an
    empty block, or some) whose namespaces lists often equal a moved one's."""
    lists = st.sampled_from(NAMESPACE_LISTS)
    lines = [TAINTED.strip(), "pools:"]
    for name in ("p0", "p1"):
        lines += [
            f"  - name: {name}",
            f"    nodeSelector: {{pool: {name}}}",
            f"    taints: [{{key: pool, value: {name}, effect: NoSchedule}}]",
            "    resources: [{name: nvidia.com/gpu, sharing: "
            + ("Exclusive" if name == "p0" else "TimeSlicing")
            + "}]",
        ]
        if draw(st.booleans()):
            lines.append(f"    namespaces: {_flow_list(draw(lists))}")
    if draw(st.booleans()):
        lines.append(f"binderNamespaces: {_flow_list(draw(lists))}")
    exemptions = draw(st.lists(lists, max_size=3))
    if exemptions:
        lines.append("exemptions:")
    for patterns in exemptions:
        lines.append(f"  - namespaces: {_flow_list(patterns)}")
        if draw(st.booleans()):
            lines.append("    serviceAccounts: [agent]")
        rules = draw(st.lists(st.sampled_from(RULES), max_size=2, unique=True))
        if rules:
            lines.append(f"    rules: [{', '.join(rules)}]")
    overrides = draw(st.lists(lists, max_size=3))
    if overrides:
        lines.append("namespaceOverrides:")
    for patterns in overrides:
        rule = draw(st.sampled_from(("default", *RULES)))
        lines += [
            f"  - namespaces: {_flow_list(patterns)}",
            f"    rules: {{{rule}: {{gpuPods: {draw(st.sampled_from(MODES))}}}}}",
        ]
    tenants = draw(st.integers(-1, 3))  # -1: no block; 0: an empty one
    if tenants == 0:
        lines.append("tenants: []")
    elif tenants > 0:
        lines.append("tenants:")
    for _ in range(max(tenants, 0)):
        setting = draw(
            st.sampled_from(
                [
                    "grants: {capabilities: [NET_ADMIN]}",
                    "poolPreference: [p1]",
                    "entitlements: {maxGPUsPerPod: 1}",
                    "reservedPools: [p1]",
                    "binder: true",
                    f"rules: {{pool-access: {{gpuPods: {draw(st.sampled_from(MODES))}}}}}",
                ]
            )
        )
        lines += [f"  - namespaces: {_flow_list(draw(lists))}", f"    {setting}"]
    return document("\n".join(lines) + "\n", name="generated")


def _generated_pods() -> list[dict]:
    pods = [
        _gpu_pod("plain"),
        _gpu_pod("shared", resource="nvidia.com/gpu"),
        _gpu_pod("named-node", nodeName="gpu-node-1"),
        _gpu_pod("agent", serviceAccountName="agent", tolerations=[{"operator": "Exists"}]),
        _gpu_pod("net-admin"),
    ]
    for pool in ("p0", "p1"):
        pods.append(
            _gpu_pod(f"in-{pool}", metadata={"annotations": {"gpu-admission.io/pool": pool}})
        )
    pods[3]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    pods[3]["spec"]["volumes"] = [{"name": "dev", "hostPath": {"path": "/dev"}}]
    pods[4]["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["NET_ADMIN"]}}
    return pods


GENERATED_PODS = _generated_pods()


@settings(
    derandomize=True,
    database=None,
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(old_policies())
def test_generated_policies_decide_as_before_once_migrated(text: str) -> None:
    migration = migrate_policy(text, "<generated>")
    assert not has_old_fields(migration.text)
    old = webhook.parse_policy(text)
    new = webhook.parse_policy(migration.text)
    for namespace in JUDGED_IN:
        for pod in GENERATED_PODS:
            assert decisions(old, pod, namespace) == decisions(new, pod, namespace), (
                pod["metadata"]["name"],
                namespace,
                migration.text,
            )
    assert migrate_policy(migration.text).moves == ()


def test_the_report_names_each_entry_where_it_ends_up() -> None:
    """A moved override put before the entries that state rules already shifts them and the
    entries appended earlier: the report names every entry at its final place."""
    text = document(
        TAINTED
        + """
tenants:
  - {namespaces: [x], grants: {hostIPC: true}}
  - {namespaces: [r], rules: {privileged: {gpuPods: Warn}}}
exemptions: [{namespaces: [e]}]
namespaceOverrides: [{namespaces: [o], rules: {privileged: {gpuPods: Audit}}}]
"""
    )
    migration = migrate_policy(text)
    assert [t["namespaces"] for t in spec_of(migration.text)["tenants"]] == [
        ["x"],
        ["o"],
        ["r"],
        ["e"],
    ]
    assert migration.moves == (
        "spec.exemptions[0] (e) -> spec.tenants[3].exemptions[0]",
        "note: spec.exemptions[0] gave no reason, which an exemption now states: say whom it "
        "trusts and why in spec.tenants[3].exemptions[0].reason",
        "spec.namespaceOverrides[0] (o) -> spec.tenants[1].rules",
        "note: the entries from spec.tenants[1] on are now spec.tenants[2] on (the moved "
        "namespace overrides go first)",
    )
    assert_same_decisions(text, migration.text)
