"""``gpu-admission review``: judge manifests (or answer an AdmissionReview) with a policy."""

from __future__ import annotations

import argparse
import difflib
import sys

import yaml

from webhook import engine, reports
from webhook.documents import Document, DocumentError, parse, read_text
from webhook.judge import Mutation, judge
from webhook.policy import default_policy_path, load_policy

EXAMPLES = """\
examples:
  gpu-admission review -f pod.yaml
  gpu-admission review -f deploy.yaml -n ml --mutate
  kubectl get pods -A -o yaml | gpu-admission review -f - -o json
  helm template ./chart | gpu-admission review -f - --policy policies/strict.yaml
  gpu-admission review -f admission-review.json      # answered with the AdmissionReview response

exit status: 0 when every object is allowed, 1 when one is denied, 2 on errors.
"""


def add_subcommands(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "review",
        help="judge manifests with a policy",
        description="Judge Kubernetes manifests (or an AdmissionReview) with a gpu-admission "
        "policy: the verdict, every violation with its field path and fix, and with --mutate "
        "the patch the mutating webhook would apply.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="a manifest file, or - for standard input; repeatable",
    )
    add_policy_argument(parser)
    parser.add_argument(
        "-n",
        "--namespace",
        help="the namespace to judge objects in, as the API server's request namespace: objects "
        "that name none are judged here, and when -n is given it wins over the object's own, "
        "as `kubectl apply -n` would refuse a mismatch (default: the object's, else default)",
    )
    parser.add_argument(
        "--mutate", action="store_true", help="also show the patch and the mutated object"
    )
    parser.add_argument(
        "--diff",
        action="store_true",
        help="with --mutate: show the mutation as a diff instead of the object",
    )
    parser.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    parser.set_defaults(func=run)


def add_policy_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy", metavar="FILE", help="the policy file (default: the packaged default policy)"
    )


def policy_from(args: argparse.Namespace):
    return load_policy(args.policy or default_policy_path())


def run(args: argparse.Namespace) -> int:
    policy = policy_from(args)
    documents: list[Document] = []
    for source in args.files:
        try:
            documents.extend(parse(read_text(source), source))
        except DocumentError as exc:
            print(f"gpu-admission: error: {exc}", file=sys.stderr)
            return 2
    reviews = [
        d for d in documents if isinstance(d.obj, dict) and d.obj.get("kind") == "AdmissionReview"
    ]
    if reviews:
        responses = []
        for document in reviews:
            try:
                responses.append(engine.review(document.obj, policy, mutate=args.mutate))
            except engine.RequestError as exc:
                print(f"gpu-admission: error: {document.source}: {exc}", file=sys.stderr)
                return 2
        reports.dump(
            responses[0] if len(responses) == 1 else responses,
            "json" if args.output == "table" else args.output,
        )
        return 0 if all(r["response"]["allowed"] for r in responses) else 1

    namespace, override = args.namespace or "default", args.namespace is not None
    rows = [
        (d, judge(d.obj, policy, namespace, mutate=args.mutate, override=override))
        for d in documents
    ]
    if args.output == "table":
        reports.table(rows, sys.stdout, show_mutation=args.mutate and not args.diff)
        if args.mutate and args.diff:
            for document, outcome in rows:
                for mutation in outcome.mutations:
                    sys.stdout.writelines(_diff(document, mutation))
        elif args.mutate:
            for document, outcome in rows:
                for mutation in outcome.mutations:
                    label = mutation.template_path or "the Pod"
                    sys.stdout.write(f"--- mutated {document.describe()} ({label})\n")
                    yaml.safe_dump(mutation.mutated, sys.stdout, sort_keys=False)
    else:
        records = [reports.outcome_record(d, o, with_mutation=args.mutate) for d, o in rows]
        reports.dump(records, args.output)
    return 0 if all(o.allowed for _, o in rows) else 1


def _diff(document: Document, mutation: Mutation) -> list[str]:
    before = yaml.safe_dump(mutation.original, sort_keys=False).splitlines(keepends=True)
    after = yaml.safe_dump(mutation.mutated, sort_keys=False).splitlines(keepends=True)
    label = document.describe() + (f" {mutation.template_path}" if mutation.template_path else "")
    return list(difflib.unified_diff(before, after, f"{label} (before)", f"{label} (mutated)"))
