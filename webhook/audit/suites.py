"""Policy test suites: YAML files, kept in Git beside the policy, that say what the policy must
do to given manifests, run by ``gpu-admission policy test``.

A suite names its policy and lists cases; each case reviews one manifest file, a directory of
them or an inline object, and states the verdict and, optionally, the exact rule ids found in
each mode, regular expressions the violations must match, and what the mutating webhook must
patch. Rule ids are the policy's stable, user-visible ones. A suite is checked before it runs:
an unknown key, a misspelt rule id, a case without an expectation or a suite without cases is
an error, never a pass. Objects are decided through ``webhook.admission.objects``, which feeds
them to the engine the webhook runs.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from webhook.admission.objects import Mutation, Outcome, decide_object
from webhook.audit.documents import Document, DocumentError, discover, parse, read_text
from webhook.core.findings import MODE_WORD
from webhook.policy import schemas
from webhook.policy.files import missing_file
from webhook.policy.lines import duplicate_keys
from webhook.policy.load import PolicyError, load_policy
from webhook.policy.model import RULE_IDS, Policy

SUITE_SUFFIXES = (".test.yaml", ".test.yml")
MODE_KEYS = (("denied", "Enforce"), ("warned", "Warn"), ("audited", "Audit"))
_DOTTED = re.compile(r"(?:[^.\[\]]+|\[[^\]]*\])(?:\.[^.\[\]]+|\[[^\]]*\])*\Z")
_DOTTED_STEP = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]")
_NEEDS_BRACKETS = re.compile(r"[./\[\]]")


class SuiteError(ValueError):
    """A suite that cannot run. ``errors`` holds one ``source:line: path: message`` each."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"test suite {source} is invalid:\n  " + "\n  ".join(errors))


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    line: int
    objects: tuple[Any, ...]
    namespace: str | None  # the request namespace; None: each object's own, else "default"
    expect: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Suite:
    source: str
    policy: Policy
    cases: tuple[Case, ...]


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: Case
    failures: tuple[str, ...]  # empty when the case passed
    violations: tuple[str, ...]  # every finding, rendered, for the failure report

    @property
    def passed(self) -> bool:
        return not self.failures


def schema() -> dict[str, Any]:
    """The suite file's JSON Schema, shipped as package data for editors and for loading."""
    return schemas.load("policy-test.schema.json")


def _validator() -> jsonschema.protocols.Validator:
    return schemas.validator("policy-test.schema.json")


def discover_suites(paths: Sequence[str | Path]) -> list[Path]:
    """Suite files: files as given; directories searched recursively for ``*.test.yaml``."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found.extend(
                sorted(
                    f for f in path.rglob("*") if f.is_file() and f.name.endswith(SUITE_SUFFIXES)
                )
            )
        else:
            found.append(path)
    return found


# --- Loading ----------------------------------------------------------------------------


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite, its policy and its manifests; every problem is reported at once."""
    source = str(path)
    try:
        documents = parse(read_text(source), source)
    except DocumentError as exc:
        raise SuiteError(source, [str(exc)]) from None
    if len(documents) != 1:
        raise SuiteError(source, [f"{source}: expected one YAML document, found {len(documents)}"])
    document = documents[0]
    errors = [
        f"{source}:{line}: {render_path(path)}: duplicate key"
        for path, line in duplicate_keys(document.node)
    ]
    if not errors:
        errors = _schema_errors(document)
    if not errors:
        errors = _semantic_errors(document)
    if errors:
        raise SuiteError(source, errors)
    spec = document.obj
    base = Path(source).parent
    policy_path = base / spec["policy"]
    policy: Policy | None = None
    try:
        policy = load_policy(policy_path)
    except PolicyError as exc:
        errors.append(_error(document, ["policy"], f"policy {policy_path} cannot be used"))
        errors.extend(f"  {line}" for line in exc.errors)
    cases: list[Case] = []
    for index, raw in enumerate(spec["cases"]):
        objects: tuple[Any, ...] = ()
        if "object" in raw:
            objects = (raw["object"],)
        else:
            try:
                objects = _read_manifests(base / raw["manifest"])
            except DocumentError as exc:
                errors.append(_error(document, ["cases", index, "manifest"], str(exc)))
        cases.append(
            Case(
                name=raw["name"],
                line=document.line_of(render_path(["cases", index])),
                objects=objects,
                namespace=raw.get("namespace", spec.get("namespace")),
                expect=raw["expect"],
            )
        )
    if errors or policy is None:
        raise SuiteError(source, errors)
    return Suite(source, policy, tuple(cases))


def _read_manifests(path: Path) -> tuple[Any, ...]:
    if not path.exists():
        raise DocumentError(missing_file(path))
    files = discover([str(path)])
    objects = tuple(d.obj for f in files for d in parse(read_text(f), f))
    if not objects:
        raise DocumentError(f"{path}: no objects to review")
    return objects


def _schema_errors(document: Document) -> list[str]:
    errors: list[str] = []
    for err in sorted(_validator().iter_errors(document.obj), key=lambda e: e.json_path):
        path = list(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            known = sorted(err.schema.get("properties", {}))
            for name in sorted(set(err.instance) - set(known)):
                close = difflib.get_close_matches(name, known, 1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                message = f"unknown key {name!r}{hint}; allowed: {', '.join(known)}"
                errors.append(_error(document, [*path, name], message))
            continue
        if err.validator == "required":
            message = _missing_message(path, err.message.split("'")[1])
        elif err.validator == "const":
            message = f"must be {err.validator_value!r}, not {err.instance!r}"
        elif err.validator == "enum":
            message = f"{err.instance!r} is not one of {', '.join(map(str, err.validator_value))}"
        else:
            message = err.message
        errors.append(_error(document, path, message))
    return errors


def _missing_message(path: list[Any], key: str) -> str:
    if key in ("expect", "verdict"):
        # A case with nothing expected could only ever pass.
        return (
            f"missing {key!r}: every case states what must happen "
            "(expect: {verdict: allowed} or {verdict: denied}, then optionally denied, warned, "
            "audited, messages, mutation)"
        )
    return f"missing required key {key!r}"


def _semantic_errors(document: Document) -> list[str]:
    spec = document.obj
    errors: list[str] = []

    def err(path: list[Any], message: str) -> None:
        errors.append(_error(document, path, message))

    if not spec["cases"]:
        err(["cases"], "no cases: a suite that tests nothing fails; add at least one case")
    names: set[str] = set()
    for index, case in enumerate(spec["cases"]):
        at = ["cases", index]
        if case["name"] in names:
            err([*at, "name"], f"duplicate case name {case['name']!r}")
        names.add(case["name"])
        if ("manifest" in case) == ("object" in case):
            err(at, "give exactly one of 'manifest' (a path) and 'object' (inline)")
        expect = case["expect"]
        for key, _ in MODE_KEYS:
            for j, rule in enumerate(expect.get(key, [])):
                if rule not in RULE_IDS:
                    close = difflib.get_close_matches(rule, RULE_IDS, 1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    err(
                        [*at, "expect", key, j],
                        f"unknown rule id {rule!r}{hint}; rules: {', '.join(RULE_IDS)}",
                    )
        if expect["verdict"] == "allowed" and expect.get("denied"):
            err([*at, "expect", "denied"], "an allowed case cannot have denied rules")
        for j, pattern in enumerate(expect.get("messages", [])):
            try:
                re.compile(pattern)
            except re.error as exc:
                err([*at, "expect", "messages", j], f"invalid regular expression: {exc}")
        mutation = expect.get("mutation", {})
        if mutation.get("none") and len(mutation) > 1:
            err([*at, "expect", "mutation"], "'none: true' cannot be combined with other keys")
        for scope, fields_of in (([], mutation), (["workload"], mutation.get("workload", {}))):
            fields = [("patched", p) for p in fields_of.get("patched", {})]
            fields += [("absent", j) for j in range(len(fields_of.get("absent", [])))]
            for key, where in fields:
                text = where if key == "patched" else fields_of["absent"][where]
                if field_steps(text) is None:
                    err(
                        [*at, "expect", "mutation", *scope, key, where],
                        f"invalid field path {text!r}: use a JSON pointer "
                        "(/spec/tolerations/0/key) or a dotted path (spec.tolerations[0].key, "
                        "metadata.annotations[a.b/c])",
                    )
    return errors


def _error(document: Document, path: list[Any], message: str) -> str:
    rendered = render_path(path)
    return f"{document.source}:{document.line_of(rendered)}: {rendered}: {message}"


def render_path(path: Sequence[str | int]) -> str:
    """``cases[2].expect.mutation.patched[/spec/x]``: keys with dots or slashes in brackets."""
    out = ""
    for step in path:
        if isinstance(step, int) or _NEEDS_BRACKETS.search(step):
            out += f"[{step}]"
        else:
            out += f".{step}" if out else step
    return out or "(document)"


# --- Field paths ------------------------------------------------------------------------


def field_steps(path: str) -> list[str] | None:
    """A JSON pointer or a dotted path as its steps; None when it is neither."""
    if path.startswith("/"):
        return [s.replace("~1", "/").replace("~0", "~") for s in path.split("/")[1:]]
    if not _DOTTED.match(path):
        return None
    return [
        m.group(1) if m.group(1) is not None else m.group(2) for m in _DOTTED_STEP.finditer(path)
    ]


def lookup(obj: Any, steps: list[str]) -> tuple[bool, Any]:
    """(found, value) of a field; list items by their index."""
    for step in steps:
        if isinstance(obj, dict) and step in obj:
            obj = obj[step]
        elif isinstance(obj, list) and step.isdigit() and int(step) < len(obj):
            obj = obj[int(step)]
        else:
            return False, None
    return True, obj


def _same(expected: Any, actual: Any) -> bool:
    # Python's True == 1 would let `value: 1` pass against `true`.
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(
            _same(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(map(_same, expected, actual))
    return bool(expected == actual)


# --- Running ----------------------------------------------------------------------------


def run_case(suite: Suite, case: Case) -> CaseResult:
    """Review the case's objects with the suite's policy and compare with its expectation."""
    expect = case.expect
    mutation_expected = "mutation" in expect
    outcomes = [
        decide_object(
            _in_namespace(obj, case.namespace),
            suite.policy,
            case.namespace or "default",
            mutate=mutation_expected,
        )
        for obj in case.objects
    ]
    judged = [o for o in outcomes if o.judged]
    violations = tuple(
        f"{MODE_WORD[f.mode]} [{f.rule}] {_label(o)}: {f.violation.render()}"
        for o in judged
        for f in o.findings
    )
    if not judged:
        failure = (
            "nothing was judged: no object is a Pod or a workload kind the policy declares "
            "(check apiVersion and kind)"
        )
        return CaseResult(case, (failure,), violations)
    failures: list[str] = []
    verdict = "allowed" if all(o.allowed for o in judged) else "denied"
    if verdict != expect["verdict"]:
        failures.append(f"verdict: expected {expect['verdict']}, got {verdict}")
    for key, mode in MODE_KEYS:
        if key in expect:
            actual = sorted({f.rule for o in judged for f in o.findings if f.mode == mode})
            if set(expect[key]) != set(actual):
                failures.append(
                    f"{key}: expected [{', '.join(sorted(expect[key]))}], got [{', '.join(actual)}]"
                )
    rendered = [f.violation.render() for o in judged for f in o.findings]
    for pattern in expect.get("messages", []):
        if not any(re.search(pattern, text) for text in rendered):
            failures.append(f"messages: no violation matches {pattern!r}")
    if mutation_expected:
        failures.extend(_mutation_failures(expect["mutation"], judged, suite.policy))
    return CaseResult(case, tuple(failures), violations)


def _in_namespace(obj: Any, namespace: str | None) -> Any:
    """The object as the API server would see it created in ``namespace``."""
    if namespace is None or not isinstance(obj, dict):
        return obj
    metadata = obj.get("metadata")
    return {
        **obj,
        "metadata": {**(metadata if isinstance(metadata, dict) else {}), "namespace": namespace},
    }


def _label(outcome: Outcome) -> str:
    obj = outcome.obj if isinstance(outcome.obj, dict) else {}
    metadata = obj.get("metadata")
    meta = metadata if isinstance(metadata, dict) else {}
    return f"{obj.get('kind', '?')}/{meta.get('name') or meta.get('generateName') or '?'}"


def _mutation_failures(
    expected: Mapping[str, Any], judged: list[Outcome], policy: Policy
) -> list[str]:
    patched = [
        (_label(o) + (f" {m.template_path}" if m.template_path else ""), m)
        for o in judged
        for m in o.mutations
    ]
    if expected.get("none"):
        return [
            f"mutation: expected none, got a patch of {label}: "
            + ", ".join(f"{op['op']} {op['path']}" for op in m.operations)
            for label, m in patched
        ]
    if not patched:
        return ["mutation: expected a patch, got none"]
    failures: list[str] = []
    if "applied" in expected and expected["applied"] != policy.mutation_applies:
        failures.append(
            "mutation.applied: expected the patch applied, got it only recorded "
            "(mutation.mode Record)"
            if expected["applied"]
            else "mutation.applied: expected the patch only recorded, got it applied "
            "(mutation.mode Apply)"
        )
    pods = [(label, m) for label, m in patched if not m.workload]
    if ("patched" in expected or "absent" in expected) and not pods:
        failures.append("mutation: expected a patch of the Pods, got none")
    failures += _field_failures("mutation", expected, pods)
    if "workload" in expected:
        workloads = [(label, m) for label, m in patched if m.workload]
        if not workloads:
            failures.append("mutation.workload: expected a patch of the workload, got none")
        failures += _field_failures("mutation.workload", expected["workload"], workloads)
    if failures:
        failures.extend(
            f"  patch of {label}: " + ", ".join(f"{op['op']} {op['path']}" for op in m.operations)
            for label, m in patched
        )
    return failures


def _field_failures(
    key: str, expected: Mapping[str, Any], patched: list[tuple[str, Mutation]]
) -> list[str]:
    """Where the patched objects lack a field ``expected['patched']`` gives them (or its
    value), or hold one ``expected['absent']`` names."""
    failures: list[str] = []
    for label, m in patched:
        for path, value in expected.get("patched", {}).items():
            found, actual = lookup(m.mutated, field_steps(path) or [])
            if not found:
                failures.append(f"{key}.patched {path}: absent from the patched {label}")
            elif not _same(value, actual):
                failures.append(
                    f"{key}.patched {path}: expected {_json(value)}, got {_json(actual)} in {label}"
                )
        for path in expected.get("absent", []):
            found, actual = lookup(m.mutated, field_steps(path) or [])
            if found:
                failures.append(f"{key}.absent {path}: the patched {label} has it: {_json(actual)}")
    return failures


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
