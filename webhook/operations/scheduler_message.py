"""The reason counts of a scheduler's ``FailedScheduling`` message, read as kube-scheduler
writes them (``pkg/scheduler/framework/types.go``, ``FitError.Error``)::

    0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint
    {nvidia.com/gpu: present}, 2 node(s) didn't match Pod's node affinity/selector.
    preemption: 0/6 nodes are available: 2 No preemption victims found for incoming pod,
    4 Preemption is not helpful for scheduling.

What follows the counted reasons is left out: each post-filter plugin's sentence (the
preemption part, which repeats the nodes for another question, and from Kubernetes 1.34 the
DRA plugin's ``no new claims to deallocate``, before it). A pre-filter's rejection
(``pod has unbound immediate PersistentVolumeClaims``) is a sentence of its own before the
counts, kept as a reason.

Tolerant of the wordings of other releases and schedulers: the taint plugin's older
``node(s) had taint {k: v}, that the pod didn't tolerate`` and newer ``had untolerated
taint(s)``, NodeAffinity's older ``didn't match node selector``,
a message without counts (DRA's ``cannot allocate all claims``, ``no nodes available to
schedule pods``) kept whole as one reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

ReasonKind = Literal["insufficient", "taint", "affinity", "unschedulable", "claims", "other"]

_HEADER = re.compile(r"^\s*\d+/\d+ nodes are available:?\s*")
_COUNTED = re.compile(r"^(?P<count>\d+)\s+(?P<text>.+)$")
_INSUFFICIENT = re.compile(r"^Insufficient (?P<resource>\S+)$")
# Matched against the reason text, in order: the first that matches gives its kind.
_KINDS: tuple[tuple[ReasonKind, re.Pattern[str]], ...] = (
    ("taint", re.compile(r"\btaints?\b|untolerated", re.IGNORECASE)),
    (
        "affinity",
        re.compile(r"didn't match (?:Pod's )?node (?:affinity|selector)", re.IGNORECASE),
    ),
    ("unschedulable", re.compile(r"were unschedulable|node\(s\) unschedulable", re.IGNORECASE)),
    (
        "claims",
        re.compile(r"resource ?claim|allocate all claims|\bclaims?\b", re.IGNORECASE),
    ),
)


@dataclass(frozen=True, slots=True)
class SchedulerReason:
    """One reason of the message: how many nodes it names (0 when it gives no count), the
    scheduler's words, its kind, and for ``insufficient`` the resource."""

    count: int
    text: str
    kind: ReasonKind
    resource: str = ""

    def __str__(self) -> str:
        return f"{self.count} {self.text}" if self.count else self.text


@dataclass(frozen=True, slots=True)
class SchedulerMessage:
    """A FailedScheduling message: its reasons, in its order."""

    reasons: tuple[SchedulerReason, ...]


def parse_scheduler_message(message: str) -> SchedulerMessage:
    """The reasons of a FailedScheduling message (see the module's docstring)."""
    text = " ".join(message.split())
    text = re.split(r"\s*\bpreemption:", text, maxsplit=1)[0].strip()
    header = _HEADER.match(text)
    if header is None:
        body = text.rstrip(".")
        return SchedulerMessage((_reason(0, body),) if body else ())
    reasons = []
    for sentence in _sentences(text[header.end() :]):
        parts = _split(sentence)
        if not any(_COUNTED.match(part) for part in parts):
            reasons.append(_reason(0, sentence))  # a pre-filter's rejection
            continue
        for part in parts:
            counted = _COUNTED.match(part)
            reasons.append(
                _reason(int(counted["count"]), counted["text"]) if counted else _reason(0, part)
            )
        break  # the counts are the filters' sentence: what follows is the post-filters'
    return SchedulerMessage(tuple(reasons))


def _sentences(body: str) -> list[str]:
    """The sentences of the message after its header, split at a full stop followed by a
    space outside braces (a taint is written ``{key: value}``)."""
    sentences: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(body):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "." and depth == 0 and body[index + 1 : index + 2] in (" ", ""):
            sentences.append(body[start:index].strip())
            start = index + 1
    sentences.append(body[start:].strip())
    return [sentence for sentence in sentences if sentence]


def _reason(count: int, text: str) -> SchedulerReason:
    text = text.strip().rstrip(".")
    insufficient = _INSUFFICIENT.match(text)
    if insufficient is not None:
        return SchedulerReason(count, text, "insufficient", insufficient["resource"])
    kind: ReasonKind = next((kind for kind, pattern in _KINDS if pattern.search(text)), "other")
    return SchedulerReason(count, text, kind)


def _split(body: str) -> list[str]:
    """The reasons of the body, split at the commas outside braces (a taint is written
    ``{key: value}``), and the older taint wording's ``, that the pod didn't tolerate`` kept
    with its reason."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in body:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    merged: list[str] = []
    for part in parts:
        if merged and not _COUNTED.match(part) and part.startswith("that the pod"):
            merged[-1] = f"{merged[-1]}, {part}"
        else:
            merged.append(part)
    return [part for part in merged if part]
