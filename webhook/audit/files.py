"""Auditing manifests on disk: every object of every YAML and JSON file, directories read as
``kubectl -f`` reads them. An unreadable file is a problem and the audit goes on; what is no
Kubernetes object is noted and skipped."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from webhook.admission.objects import enforce_everything
from webhook.audit.documents import DocumentError, manifest_files, parse, read_text
from webhook.audit.judging import Audit, judge
from webhook.cluster.listing import Problem
from webhook.policy.model import Policy

Paths = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def audit_files(
    policy: Policy,
    paths: Paths,
    *,
    recursive: bool = False,
    namespace: str = "default",
    respect_modes: bool = False,
    stdin: str | None = None,
    raise_errors: bool = False,
    override: bool = False,
) -> Audit:
    """Judge every object in ``paths`` (a file or directory, or several; ``-`` is ``stdin``,
    the text read from standard input).

    A directory is read as ``kubectl -f`` reads it: its own YAML and JSON files, and with
    ``recursive`` (``-R``) those of its subdirectories too. Without ``recursive``, a directory
    whose subdirectories hold manifest files raises
    :class:`~webhook.audit.documents.SubdirectoriesNotRead` before anything is read: an audit
    that silently covered less than the tree it was given would pass for a clean one.

    ``namespace`` is that of objects that name none, and with ``override`` that of every
    object (``kubectl apply -n``, ``review -n``). By default every rule the policy turns on is
    enforced (what would it block?); ``respect_modes`` keeps its own modes. With
    ``raise_errors`` the engine's exception is raised rather than made the object's problem.
    """
    files = manifest_files(path_list(paths), recursive=recursive)
    audit = Audit(policy if respect_modes else enforce_everything(policy), respect_modes)
    judge_files(audit, files, namespace, stdin=stdin, raise_errors=raise_errors, override=override)
    return audit


def path_list(paths: Paths) -> list[str]:
    """One path or several, as strings (a bare string is one path, not its characters)."""
    if isinstance(paths, str | os.PathLike):
        return [os.fspath(paths)]
    return [os.fspath(path) for path in paths]


def judge_files(
    audit: Audit,
    files: Sequence[str],
    namespace: str,
    *,
    stdin: str | None,
    raise_errors: bool,
    override: bool = False,
) -> None:
    """Judge the objects of ``files`` (as :func:`~webhook.audit.documents.manifest_files`
    expands paths: no directory) into ``audit`` with its policy as it is. Standard input is
    read once: a second ``-`` finds it empty."""
    for source in files:
        try:
            documents = parse(read_text(source, stdin), source)
        except DocumentError as exc:
            audit.problems.append(Problem(source, str(exc)))
            continue
        finally:
            if source == "-" and stdin is not None:
                stdin = ""
        if not documents:
            audit.notes.append(f"{source}: no Kubernetes objects, skipped")
        for document in documents:
            if not document.is_kubernetes_object:
                where = f"{source} document {document.number}" if len(documents) > 1 else source
                audit.notes.append(
                    f"{where}: not a Kubernetes object (no apiVersion and kind), skipped"
                )
                continue
            judge(
                audit,
                document,
                document.where,
                namespace,
                raise_errors=raise_errors,
                override=override,
            )
