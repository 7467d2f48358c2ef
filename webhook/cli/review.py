"""``gpu-admission review``: judge manifests (or answer an AdmissionReview) with a policy."""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any

from webhook.admission.engine import review
from webhook.admission.objects import Mutation, Outcome, decide_object
from webhook.admission.request import RequestError
from webhook.audit.documents import Document
from webhook.audit.judging import judging_failure
from webhook.cli import output, tables
from webhook.cli.common import (
    add_command,
    add_filename_arguments,
    add_policy_argument,
    error,
    policy_from,
    read_documents,
)
from webhook.policy.model import Policy

EXAMPLES = """\
examples:
  gpu-admission review -f pod.yaml
  gpu-admission review -f train.yaml serve.yaml       # several files after one -f
  gpu-admission review -f manifests/ -R               # a directory; -R for its subdirectories
  gpu-admission review -f deploy.yaml -n ml --mutate
  kubectl get pods -A -o yaml | gpu-admission review -f - -o json
  helm template ./chart | gpu-admission review -f - --policy policies/examples/strict.yaml
  gpu-admission review -f admission-review.json      # answered with the AdmissionReview response

Give either AdmissionReviews or plain manifests: a run that mixes them is refused.

exit status: 0 when every object is allowed, 1 when one is denied, 2 on errors (a file or an
object that cannot be read or judged is reported, and the others still are).
"""


def add_subcommands(commands: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(
        commands,
        "review",
        summary="judge manifests with a policy",
        description="Judge Kubernetes manifests (or an AdmissionReview) with a gpu-admission "
        "policy: the verdict, every violation with its field path and fix, and with --mutate "
        "the patch the mutating webhook would apply.",
        epilog=EXAMPLES,
    )
    add_filename_arguments(parser, parser, required=True)
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
        help="with --mutate (required): show the mutation as a diff instead of the object",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "wide", "json", "yaml"),
        default="table",
        help="table: one line per object, clipped to the terminal; wide: every message "
        "(default: table)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Decide every object of the files (or answer their AdmissionReviews)."""
    if args.diff and not args.mutate:
        # --diff only changes how the mutation is shown: alone it would silently do nothing.
        print("gpu-admission review: error: --diff needs --mutate", file=sys.stderr)
        return 2
    read = read_documents(args)
    if read is None:
        return 2
    # Unreadable files are reported now, and the exit status is 2 once the rest is judged.
    documents, unreadable = read
    policy = policy_from(args)
    if unreadable and not documents:
        return 2  # nothing to judge: the errors said it all
    reviews = [d for d in documents if _is_admission_review(d)]
    if reviews:
        plain = next((d for d in documents if not _is_admission_review(d)), None)
        if plain is not None:
            # An AdmissionReview is answered as the webhook would; the plain objects would
            # have no place in that answer, and dropping them would hide their verdicts.
            error(
                f"{plain.where} is not an AdmissionReview but {reviews[0].where} is: review "
                "AdmissionReviews and plain manifests in separate runs"
            )
            return 2
        status = _answer_reviews(reviews, policy, args)
        return 2 if unreadable else status

    namespace, override = args.namespace or "default", args.namespace is not None
    rows: list[tuple[Document, Outcome]] = []
    failures: list[tuple[Document, str]] = []
    for document in documents:
        try:
            outcome = decide_object(
                document.obj, policy, namespace, mutate=args.mutate, override=override
            )
        except Exception as exc:  # one malformed object must not hide the others' verdicts
            if args.debug:
                raise
            failures.append((document, judging_failure(document.where, document, exc)))
            continue
        rows.append((document, outcome))
    for _, message in failures:
        error(message)
    if args.output in ("table", "wide"):
        tables.review_table(
            rows,
            sys.stdout,
            wide=args.output == "wide",
            show_mutation=args.mutate and not args.diff,
            failed=len(failures),
            unreadable=unreadable,
        )
        if args.mutate and args.diff:
            for document, outcome in rows:
                for mutation in outcome.mutations:
                    sys.stdout.writelines(_diff(document, mutation))
        elif args.mutate:
            for document, outcome in rows:
                for mutation in outcome.mutations:
                    label = mutation.template_path or (
                        "its GPU defaults" if mutation.workload else "the Pod"
                    )
                    sys.stdout.write(f"--- mutated {document.describe()} ({label})\n")
                    sys.stdout.write(output.to_yaml(mutation.mutated))
    else:
        records = [output.outcome_record(d, o, with_mutation=args.mutate) for d, o in rows]
        records += [
            {"source": d.source, "document": d.number, "line": d.line, "error": message}
            for d, message in failures
        ]
        records.append(
            tables.summary_record([o for _, o in rows], failed=len(failures), unreadable=unreadable)
        )
        output.dump(records, args.output)
    if failures or unreadable:
        return 2
    return 0 if all(o.allowed for _, o in rows) else 1


def _is_admission_review(document: Document) -> bool:
    return isinstance(document.obj, dict) and document.obj.get("kind") == "AdmissionReview"


def _answer_reviews(reviews: list[Document], policy: Policy, args: argparse.Namespace) -> int:
    """The webhook's response to each AdmissionReview; one that cannot be answered is an
    error and the others are still answered."""
    responses = []
    failed = False
    for document in reviews:
        try:
            responses.append(review(document.obj, policy, mutate=args.mutate))
        except RequestError as exc:  # what the webhook answers with HTTP 400
            error(f"{document.where}: {exc}")
            failed = True
        except Exception as exc:
            if args.debug:
                raise
            error(judging_failure(document.where, document, exc))
            failed = True
    if responses:
        output.dump(
            responses[0] if len(reviews) == 1 else responses,
            "json" if args.output == "table" else args.output,
        )
    if failed:
        return 2
    return 0 if all(r["response"]["allowed"] for r in responses) else 1


def _diff(document: Document, mutation: Mutation) -> list[str]:
    before = output.to_yaml(mutation.original).splitlines(keepends=True)
    after = output.to_yaml(mutation.mutated).splitlines(keepends=True)
    label = document.describe() + (f" {mutation.template_path}" if mutation.template_path else "")
    return list(difflib.unified_diff(before, after, f"{label} (before)", f"{label} (mutated)"))
