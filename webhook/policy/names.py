"""Names compared the way a reader means them: resource names with their near misses, host paths
as the kubelet would mount them. Compiled into the policy once, read on the request path."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator


def normalise_host_path(path: str) -> str:
    """``//dev/./nvidia0/`` is ``/dev/nvidia0``: what the kubelet would mount."""
    return posixpath.normpath(re.sub(r"/+", "/", path)) if path else path


def near_miss_key(name: str) -> str:
    """What a resource name looks like with case, separators and a plural 's' ignored."""
    # Four replaces take a fifth of the time of a regular expression or str.translate.
    key = name.lower().replace("-", "").replace(".", "").replace("_", "").replace("+", "")
    return key[:-1] if key.endswith("s") else key


class NearMisses:
    """Declared resource names by their near-miss key, indexed so that finding a name's near
    miss takes the same time however many names the policy declares: a review can name
    thousands of resources, and each unknown one is diagnosed while the event loop waits.
    ``in`` looks up a near-miss key; ``match`` answers what a scan of the names in sorted
    order would: the first with the same key, else the first anagram, else the first one
    edit away."""

    def __init__(self, declared: frozenset[str] | set[str]) -> None:
        self._by_key: dict[str, str] = {}
        for name in sorted(declared):
            self._by_key[near_miss_key(name)] = name
        self._anagrams: dict[tuple[str, str], str] = {}
        # (key's domain, key's short name or it with one letter dropped) -> candidates
        self._edits: dict[tuple[str, str], list[int]] = {}
        self._shorts: list[tuple[str, str]] = []  # (short name of the key, declared name)
        self._longest = max((len(key.partition("/")[2]) for key in self._by_key), default=0)
        for index, (key, name) in enumerate(self._by_key.items()):
            domain, _, short = key.partition("/")
            self._anagrams.setdefault(("".join(sorted(short)), name.split("/")[0]), name)
            self._shorts.append((short, name))
            for variant in _one_letter_dropped(short):
                slots = self._edits.setdefault((domain, variant), [])
                if index not in slots:
                    slots.append(index)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def match(self, name: str) -> str | None:
        """The declared name that ``name`` is a near miss of, if any."""
        key = near_miss_key(name)
        found = self._by_key.get(key)
        if found is not None:
            return found
        domain, _, short = key.partition("/")
        if len(short) > self._longest + 1:
            return None  # no anagram and no edit away: nothing declared is that long
        # ``sharedgpu`` for ``gpu.shared``: the same letters in another order, same domain.
        found = self._anagrams.get(("".join(sorted(short)), name.split("/")[0]))
        return found if found is not None else self._one_edit(domain, short)

    def _one_edit(self, domain: str, short: str) -> str | None:
        """``gpuu``, ``gou``, ``gp`` for ``gpu``: one letter added, changed or dropped. Two
        names one edit apart share the shorter one or a one-letter drop of both, so the
        index yields every candidate; the exact test picks among them."""
        if len(short) < 2:
            return None
        candidates: set[int] = set()
        for variant in _one_letter_dropped(short):
            candidates.update(self._edits.get((domain, variant), ()))
        for index in sorted(candidates):
            candidate_short, candidate = self._shorts[index]
            if within_one_edit(short, candidate_short):
                return candidate
        return None


def _one_letter_dropped(word: str) -> Iterator[str]:
    """The word itself and each word made by dropping one of its letters."""
    yield word
    for index in range(len(word)):
        yield word[:index] + word[index + 1 :]


def within_one_edit(a: str, b: str) -> bool:
    """Whether one letter added, changed or dropped turns ``a`` into ``b``."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            rest = index + 1
            return a[rest:] == b[rest:] if len(a) == len(b) else a[index:] == b[rest:]
    return True
