"""``gpu-admission policy``: validate policies (and their webhook wiring), run policy test suites,
print the policy's JSON Schema.

``validate`` reports what loading reports (schema and semantic errors, with lines), then warns
about what only a whole-policy view shows: pools that can share nodes yet declare a resource
differently, namespace overrides and exemptions that can never take effect, pools no governed
namespace may use. With ``--manifests`` it also checks that the ValidatingWebhookConfiguration
sends the webhook every kind the policy judges: a kind left out is never reviewed at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from webhook.audit import suites
from webhook.audit.documents import parse, read_text
from webhook.cli import migrate, output, policy_init, workloads
from webhook.cli.common import add_command, add_command_group, error, expired_message
from webhook.cli.webhook_coverage import (
    ManifestsError,
    WebhookManifests,
    claims_failing_closed_errors,
    coverage_errors,
    defaults_coverage_errors,
    match_condition_errors,
    webhook_manifests,
)
from webhook.core.wording import count, number
from webhook.policy.files import missing_file
from webhook.policy.load import PolicyError, load_policy, schema

DEFAULT_TESTS = "policies/tests"

POLICY_EXAMPLES = """\
examples:
  gpu-admission policy validate my-policy.yaml --manifests manifests/webhooks
  gpu-admission policy test                          # every suite under policies/tests
  gpu-admission policy schema > policy.schema.json   # for editors

`gpu-admission policy SUBCOMMAND --help` describes each, with examples.
"""

VALIDATE_EXAMPLES = """\
examples:
  gpu-admission policy validate policies/default.yaml
  gpu-admission policy validate policies/examples/*.yaml --strict
  gpu-admission policy validate my-policy.yaml --manifests manifests/webhooks

Errors and warnings are printed as  FILE:LINE: FIELD.PATH: MESSAGE.
Warnings (whole-policy lints): pools whose nodeSelectors can match the same node yet give a
resource different sharing modes; namespace overrides that an earlier override or an
exemption makes unreachable; exemptions made redundant by another; pools whose namespaces are
all exempt from pool-access; pools one tenant may use that offer a resource in two sharing
modes with no poolPreference to choose (every Pod asking for it would be denied as ambiguous);
gpuPods: Enforce written with reachablePods unset (node agents denied on GPU nodes); GPU node
taints missing; fields that moved into tenants (policy migrate). Tolerations need no lint: a
policy declares taints (a pool's taints, gpuNodeTaints) and the tolerations it injects are
derived from them, so they always match.
--manifests DIR: every kind the policy judges must be sent to the validating webhook (CREATE
and UPDATE, Pods' ephemeralcontainers on UPDATE, DRA's claims and claim templates on CREATE) by
the ValidatingWebhookConfiguration(s) in DIR, rendered with `kubectl kustomize` when DIR has a
kustomization; ResourceClaims only by a webhook that fails open.

exit status: 0 valid (warnings allowed unless --strict), 1 invalid, 2 unreadable or misused.
"""

TEST_EXAMPLES = """\
examples:
  gpu-admission policy test                          # every suite under policies/tests
  gpu-admission policy test policies/tests/mig-mixed.test.yaml
  gpu-admission policy test path/to/suites other.test.yaml

Suites are files named *.test.yaml (or *.test.yml), found recursively under each directory;
a file given by name is read whatever its name. A suite:

  apiVersion: gpu-admission.io/v1alpha1
  kind: PolicyTestSuite
  policy: ../examples/mig-mixed.yaml     # relative to the suite file
  namespace: ml                          # optional: the namespace cases are reviewed in
  cases:
    - name: a catalogued profile is allowed and tolerates the GPU taint
      manifest: mig-mixed/mig-1g-10gb.yaml   # a file (every document) or a directory
      expect:
        verdict: allowed                 # required: allowed | denied
        denied: []                       # optional, exact sets of rule ids per mode
        warned: []
        audited: []
        mutation:                        # optional: what the mutating webhook does
          applied: true                  # false: only recorded (mutation.mode Record)
          patched: {/spec/tolerations/0/key: nvidia.com/gpu}
          absent: [spec.affinity]
    - name: a malformed profile is denied
      object: {apiVersion: v1, kind: Pod, ...}    # inline instead of manifest
      namespace: research                # the request namespace: wins over metadata.namespace
      expect:
        verdict: denied
        denied: [resource-name]
        messages: ['did you mean nvidia\\.com/mig-1g\\.10gb']  # regex, on a violation
    - name: nothing is patched
      manifest: plain-pod.yaml
      expect: {verdict: allowed, mutation: {none: true}}

Field paths are JSON pointers or dotted paths; quote a dotted path with brackets inside a
flow collection: absent: ["spec.containers[1].env"].
A suite is checked before it runs: an unknown key, a misspelt rule id, a case without expect,
a suite without cases is an error. `gpu-admission policy schema --suite` prints its schema.

exit status: 0 when every case passed, 1 on a failed case or an invalid suite, 2 on a missing
PATH.
"""

SCHEMA_EXAMPLES = """\
examples:
  gpu-admission policy schema > policy.schema.json
  gpu-admission policy schema --suite > policy-test.schema.json

For editors: put  # yaml-language-server: $schema=policy.schema.json  at the top of a file.
"""


def add_subcommands(commands: argparse._SubParsersAction[Any]) -> None:
    sub = add_command_group(
        commands,
        "policy",
        summary="validate policies, run policy tests, print the policy schema",
        description="Tools for writing gpu-admission policies.",
        epilog=POLICY_EXAMPLES,
    )

    validate = add_command(
        sub,
        "validate",
        summary="check policy files: schema, semantics, whole-policy lints, webhook wiring",
        description="Check policy files as the webhook loads them (schema and semantic errors, "
        "with line numbers), warn about what only a whole-policy view shows, and with "
        "--manifests check that the webhook is sent every kind the policy judges.",
        epilog=VALIDATE_EXAMPLES,
    )
    validate.add_argument("policies", nargs="+", metavar="POLICY", help="policy files")
    validate.add_argument(
        "--manifests",
        metavar="DIR",
        help="the deployment's manifests (a kustomization or plain YAML) to check the "
        "ValidatingWebhookConfiguration against",
    )
    validate.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    validate.set_defaults(func=run_validate)

    test = add_command(
        sub,
        "test",
        summary="run policy test suites (*.test.yaml)",
        description="Run policy test suites: review each case's manifests with the suite's "
        "policy and compare the verdict, the rules found per mode, the messages and the "
        "mutation with what the case expects.",
        epilog=TEST_EXAMPLES,
    )
    test.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help=f"suite files or directories to search (default: {DEFAULT_TESTS})",
    )
    test.set_defaults(func=run_test)

    schema_parser = add_command(
        sub,
        "schema",
        summary="print the policy's JSON Schema",
        description="Print the JSON Schema of policy files (or of test suites), for editors.",
        epilog=SCHEMA_EXAMPLES,
    )
    schema_parser.add_argument(
        "--suite", action="store_true", help="the schema of test suite files instead"
    )
    schema_parser.set_defaults(func=run_schema)
    workloads.add_to(sub)
    migrate.add_to(sub)
    policy_init.add_to(sub)


# --- policy schema ----------------------------------------------------------------------


def run_schema(args: argparse.Namespace) -> int:
    json.dump(suites.schema() if args.suite else schema(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


# --- policy validate --------------------------------------------------------------------


def run_validate(args: argparse.Namespace) -> int:
    colour = output.use_colour(sys.stdout)
    hooks: WebhookManifests | None = None
    if args.manifests:
        try:
            hooks = webhook_manifests(Path(args.manifests))
        except ManifestsError as exc:
            error(str(exc))
            return 2
    status = 0
    for source in args.policies:
        path = Path(source)
        if path.is_dir():
            error(f"{source}: is a directory, expected a policy file")
            status = 2
            continue
        if not path.is_file():
            error(missing_file(source))
            status = 2
            continue
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            for line in exc.errors:
                print(line)
            invalid = output.paint("invalid", "red", colour)
            print(f"{source}: {invalid}, {count(exc.errors, 'error')}")
            status = max(status, 1)
            continue
        warnings = [
            f"{source}:{w.line}: {w.path}: {output.paint('warning', 'yellow', colour)}: {w.message}"
            for w in policy.warnings
            if w.level == "warning"
        ]
        warnings += [
            f"{source}:{e.line}: spec.exceptions[{i}]: "
            f"{output.paint('warning', 'yellow', colour)}: {expired_message(e)}"
            for i, e in policy.expired_exceptions(time.time())
        ]
        notes = [
            f"{source}:{w.line}: {w.path}: {output.paint('info', 'dim', colour)}: {w.message}"
            for w in policy.warnings
            if w.level == "info"
        ]
        # Entries the server drops at load (it serves without them): refused here.
        errors = [
            f"{source}:{w.line}: {w.path}: {w.message}"
            for w in policy.warnings
            if w.level == "error"
        ]
        if hooks is not None:
            # Read again for the lines of spec.workloads, which the compiled policy forgets.
            document = parse(read_text(source), source)[0]
            errors += coverage_errors(policy, document, hooks.rules, args.manifests)
            errors += claims_failing_closed_errors(document, hooks, args.manifests)
            errors += match_condition_errors(policy, document, hooks, args.manifests)
            errors += defaults_coverage_errors(policy, document, hooks, args.manifests)
        for line in errors:
            print(line)
        for line in warnings + notes:
            print(line)
        if errors or (warnings and args.strict):
            verdict = output.paint("invalid", "red", colour)
            status = max(status, 1)
        else:
            verdict = output.paint("valid", "green", colour)
        counts = [count(errors, "error")] if errors else []
        counts += [count(warnings, "warning")] if warnings else []
        strict = " (--strict)" if not errors and warnings and args.strict else ""
        detail = f", {', '.join(counts)}" if counts else ""
        if hooks is not None and not errors:
            detail += f" (the webhook rules in {args.manifests} cover every kind it judges)"
        print(f"{source}: {verdict}{strict}{detail}")
    return status


# --- policy test ------------------------------------------------------------------------


def run_test(args: argparse.Namespace) -> int:
    paths = args.paths or [DEFAULT_TESTS]
    for path in paths:
        if not Path(path).exists():
            error(missing_file(path))
            return 2
    colour = output.use_colour(sys.stdout)
    outcome = {
        "PASSED": output.paint("PASSED", "green", colour),
        "FAILED": output.paint("FAILED", "red", colour),
        "ERROR": output.paint("ERROR", "red", colour),
    }
    passed = failed = errors = 0
    found = suites.discover_suites(paths)
    if not found:
        print(f"no test suites (*.test.yaml) in {', '.join(paths)}")
    for suite_path in found:
        try:
            suite = suites.load_suite(suite_path)
        except suites.SuiteError as exc:
            print(f"{suite_path} {outcome['ERROR']}")
            for line in exc.errors:
                print(f"    {line}")
            errors += 1
            continue
        for case in suite.cases:
            name = f"{suite.source}::{case.name}"
            try:
                result = suites.run_case(suite, case)
            except Exception as exc:  # the engine failing on an input is a result to report
                if args.debug:
                    raise
                print(f"{name} {outcome['ERROR']}")
                detail = " ".join(str(exc).split()) or "(no message)"
                print(
                    f"    {suite.source}:{case.line}: the engine raised "
                    f"{type(exc).__name__}: {detail}"
                )
                errors += 1
                continue
            if result.passed:
                print(f"{name} {outcome['PASSED']}")
                passed += 1
                continue
            failed += 1
            print(f"{name} {outcome['FAILED']}")
            print(f"    case at {suite.source}:{case.line}")
            for failure in result.failures:
                print(f"    {failure}")
            print("    violations:" if result.violations else "    violations: none")
            for violation in result.violations:
                print(f"      {violation}")
    ok = bool(found) and not failed and not errors
    summary = f"{passed} passed, {failed} failed" + (
        f", {number(errors, 'error')}" if errors else ""
    )
    print(output.paint(summary, "green" if ok else "red", colour))
    return 0 if ok else 1
