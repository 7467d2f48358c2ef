"""``gpu-admission policy migrate``: a policy of the shape before the ``tenants`` block took the
per-namespace settings, rewritten into the new one, deciding exactly as before.

What moves (each old entry becomes a ``tenants`` entry with the same ``namespaces``, merged
into an entry whose ``namespaces`` list is exactly equal, else appended):

- ``pools[].namespaces`` -> ``tenants[].reservedPools`` (a pool is reserved for the union of
  the entries naming it, as before for its own list);
- ``binderNamespaces`` -> ``tenants[].binder: true``;
- ``exemptions[]`` -> ``tenants[].exemptions[]`` (without ``namespaces``; one without a reason
  is given one that says so);
- ``namespaceOverrides[]`` -> ``tenants[].rules``: the first matching entry that states rules
  wins, so the moved overrides keep their order, ahead of any entry that states rules already
  (old overrides were consulted first).

New entries are appended, so the existing entries keep their places (``tenants[2]`` in a
message still names the same entry) and their first-match settings (``poolPreference``,
``entitlements``) stay theirs: a moved entry states none. Where a block that granted nothing
(``tenants: []``) receives entries, the first states ``grants: {}`` so that the defaults do not
come back. Everything else is kept as written, comments and key order included (round-trip
YAML); the comments inside a moved entry move with it, those around a removed field stay where
they were.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark
from ruamel.yaml.tokens import CommentToken

from webhook.policy.load import parse_policy
from webhook.policy.namespace_lint import MOVED_FIELDS

MOVED_SPEC_FIELDS = tuple(MOVED_FIELDS)


@dataclass(frozen=True)
class Migration:
    """The migrated policy's text, and what moved where (one line each; none: nothing to do,
    and ``text`` is the policy as it was, byte for byte)."""

    text: str
    moves: tuple[str, ...]


def migrate_policy(text: str, source: str = "<policy>") -> Migration:
    """The policy ``text`` in the new shape. :class:`PolicyError` for a policy that does not
    load (only a policy that loads can be migrated: its meaning is what is kept)."""
    parse_policy(text, source)
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 1 << 16  # never fold a long line the author wrote on one
    mapping, offset = _indentation(text)
    yaml.indent(mapping=mapping, sequence=offset + 2, offset=offset)
    start, body = _document_start(text)
    document = yaml.load(body)
    spec = document["spec"]
    tenants = _Tenants(spec)
    for moved in _old_fields_in_order(spec):
        if moved == "pools":
            for i, pool in enumerate(spec["pools"]):
                if "namespaces" in pool:
                    patterns = _remove(pool, "namespaces")
                    tenants.reserve(pool["name"], patterns, f"spec.pools[{i}].namespaces")
            continue
        # A new tenants block takes the place of the first field it replaces, and the
        # comment lines after that field (about the field after it) come after the block.
        taken = _remove(spec, moved, keep_following=tenants.takes_place_of(moved))
        tenants.following += taken.following
        if moved == "binderNamespaces":
            tenants.bind(dataclasses.replace(taken, following=[]))
        elif moved == "exemptions":
            leading = leading_comment(taken.value)
            for i, exemption in enumerate(taken.value):
                tenants.exempt(exemption, f"spec.exemptions[{i}]", [] if i else leading)
        else:
            overrides = taken.value
            leading = leading_comment(overrides)
            for i, override in enumerate(overrides):
                where = f"spec.namespaceOverrides[{i}]"
                tenants.override(override, where, [] if i else leading)
    moves = tenants.report()
    if not moves:
        return Migration(text, ())
    tenants.place()
    out = io.StringIO(start)
    out.seek(len(start))
    yaml.dump(document, out)
    migrated = out.getvalue()
    parse_policy(migrated, f"{source} (migrated)")
    return Migration(migrated, moves)


def _document_start(text: str) -> tuple[str, str]:
    """The lines up to an explicit document start (``---``) and the rest: ruamel writes neither
    that line nor the comments before it back, so they are kept as they are."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if line.startswith("---"):
            return "".join(lines[: index + 1]), "".join(lines[index + 1 :])
        if line.strip() and not line.lstrip().startswith("#"):
            break
    return "", text


def _indentation(text: str) -> tuple[int, int]:
    """How the policy indents: a nested mapping's keys, and a block sequence's dashes past its
    key (the item's content two further), as the first of each it writes (else 2 and 2)."""
    mapping: int | None = None
    offset: int | None = None
    key_only: int | None = None  # the indentation of a line that is a key alone ("spec:")
    for line in text.splitlines():
        content = line.strip()
        if not content or content.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if key_only is not None and content.startswith("- ") and indent >= key_only:
            offset = indent - key_only if offset is None else offset
        elif key_only is not None and indent > key_only and mapping is None:
            mapping = indent - key_only
        if mapping is not None and offset is not None:
            break
        key_only = indent if content.endswith(":") and not content.startswith("- ") else None
    return mapping or 2, 2 if offset is None else offset


def _old_fields_in_order(spec: CommentedMap) -> Iterator[str]:
    """The fields that hold something to move, in the order the policy writes them (so the
    new entries follow it): ``pools`` for its pools' namespaces."""
    for key in list(spec):
        if key in MOVED_SPEC_FIELDS:
            yield str(key)
        elif key == "pools" and any("namespaces" in pool for pool in spec["pools"]):
            yield "pools"


class _Tenants:
    """The ``tenants`` block being written: entries merged into or appended, and what moved,
    for the report."""

    def __init__(self, spec: CommentedMap) -> None:
        self.spec = spec
        existing = spec.get("tenants")
        self.granted_nothing = existing is not None and len(existing) == 0
        self.entries: CommentedSeq = existing if existing is not None else CommentedSeq()
        # Moved overrides go, in order, before the first entry that states rules already.
        self.rules_before: CommentedMap | None = next(
            (entry for entry in self.entries if "rules" in entry), None
        )
        self.last_rules: CommentedMap | None = None
        self.inserted = 0
        # What moved, with "{entry}" for the entry it went to (named once all are placed).
        self._noted: list[tuple[str, CommentedMap]] = []
        self.position = _first_moved_position(spec)
        self.following: Comments = []  # comment lines to put after the block

    def takes_place_of(self, key: str) -> bool:
        """Whether a new block goes where ``key`` is."""
        return "tenants" not in self.spec and list(self.spec).index(key) == self.position

    def reserve(self, pool: str, patterns: _Removed, where: str) -> None:
        entry = self._entry(patterns)
        names = entry.setdefault("reservedPools", _flow([]))
        if pool not in names:
            names.append(pool)
        self._moved(where, patterns, entry, ".reservedPools")

    def bind(self, patterns: _Removed) -> None:
        entry = self._entry(patterns)
        entry["binder"] = True
        self._moved("spec.binderNamespaces", patterns, entry, ".binder")

    def exempt(self, exemption: CommentedMap, where: str, leading: Comments) -> None:
        patterns = _remove(exemption, "namespaces")
        unexplained = not exemption.get("reason")
        if unexplained:
            exemption["reason"] = f"moved from {where}, which gave no reason"
        entry = self._entry(patterns, leading=leading)
        if "exemptions" not in entry:
            entry["exemptions"] = CommentedSeq()
        entry["exemptions"].append(exemption)
        target = f".exemptions[{len(entry['exemptions']) - 1}]"
        self._moved(where, patterns, entry, target)
        if unexplained:
            self._noted.append(
                (
                    f"note: {where} gave no reason, which an exemption now states: say whom it "
                    "trusts and why in {entry}" + target + ".reason",
                    entry,
                )
            )

    def override(self, override: CommentedMap, where: str, leading: Comments) -> None:
        patterns = _remove(override, "namespaces")
        entry = self._entry(patterns, leading=leading, rules=True)
        _put(entry, "rules", _remove(override, "rules"))
        self.last_rules = entry
        self._moved(where, patterns, entry, ".rules")

    def _entry(
        self, patterns: _Removed, *, leading: Comments | None = None, rules: bool = False
    ) -> CommentedMap:
        """The entry for ``patterns``: one whose ``namespaces`` list is exactly equal (for rule
        modes: one that states none yet, after the last moved override and before the entries
        that state rules already), else a new one. ``leading``: comment lines to put before
        it."""
        wanted = [str(p) for p in patterns.value]
        after = self._index(self.last_rules) if self.last_rules is not None else -1
        before = self._index(self.rules_before) if self.rules_before is not None else None
        for index, existing in enumerate(self.entries):
            if [str(p) for p in existing["namespaces"]] != wanted:
                continue
            if rules and (
                "rules" in existing or index <= after or (before is not None and index >= before)
            ):
                continue
            _put_before(self.entries, index, leading or [])
            found: CommentedMap = existing
            return found
        entry = CommentedMap()
        _put(entry, "namespaces", patterns)
        if self.granted_nothing:
            entry["grants"] = CommentedMap()  # an empty block granted nothing: so does this
            self.granted_nothing = False
        if rules and before is not None:
            index = before
            self.entries.insert(index, entry)
            self.inserted += 1
        else:
            index = len(self.entries)
            self.entries.append(entry)
        _put_before(self.entries, index, leading or [])
        return entry

    def _index(self, entry: CommentedMap) -> int:
        return next(i for i, e in enumerate(self.entries) if e is entry)

    def _moved(self, where: str, patterns: _Removed, entry: CommentedMap, target: str) -> None:
        names = ", ".join(str(p) for p in patterns.value)
        self._noted.append((f"{where} ({names}) -> {{entry}}{target}", entry))

    def place(self) -> None:
        """Put the block in the document where the first moved field was, if it was not in
        it yet."""
        if "tenants" not in self.spec:
            self.spec.insert(self.position, "tenants", self.entries)
            if self.following:
                _end_with(_last_collection(self.entries), self.following)
        elif self.entries.fa.flow_style():
            self.entries.fa.set_block_style()

    def report(self) -> tuple[str, ...]:
        """What moved where, in the order it moved, naming the entries where they are now;
        and which existing entries the moved overrides put after them."""
        lines = [
            text.replace("{entry}", f"spec.tenants[{self._index(entry)}]")
            for text, entry in self._noted
        ]
        if self.inserted and self.rules_before is not None:
            now = self._index(self.rules_before)
            lines.append(
                f"note: the entries from spec.tenants[{now - self.inserted}] on are now "
                f"spec.tenants[{now}] on (the moved namespace overrides go first)"
            )
        return tuple(lines)


def _first_moved_position(spec: CommentedMap) -> int:
    """Where a new ``tenants`` block goes: at the first moved spec field, else after pools."""
    keys = list(spec)
    for index, key in enumerate(keys):
        if key in MOVED_SPEC_FIELDS:
            return index
    return keys.index("pools") + 1 if "pools" in keys else len(keys)


def _flow(items: list[Any]) -> CommentedSeq:
    seq = CommentedSeq(items)
    seq.fa.set_flow_style()
    return seq


# --- Comments ---------------------------------------------------------------------------
# ruamel keeps the comment lines that follow a value where it read them: after the end-of-line
# comment of the last line, in the slot of the deepest last element (slot 2 of a mapping key,
# slot 0 of a sequence item), while they are indented as deep as it; the lines indented less
# at the end (``ca.end``) of each collection that ends there; and the lines between a key and
# its sequence's first item on the sequence (``ca.comment[1]``). A removed field's following
# lines stay where it was (after the field before it); its end-of-line comment and everything
# inside it go with its value.

Comments = list[CommentToken]


@dataclass
class _Removed:
    """A field taken out of its mapping: its value, the end-of-line comment of its last line
    where ruamel keeps that beside the value (a flow collection or a scalar), and the comment
    lines that followed it where no field before it could keep them."""

    value: Any
    end_of_line: str = ""
    following: Comments = field(default_factory=list)


def _remove(mapping: CommentedMap, key: str, *, keep_following: bool = False) -> _Removed:
    """Take ``key`` out of ``mapping``; the comment lines that followed it go after the field
    before it (with ``keep_following``, or where there is none, they stay in the result)."""
    value = mapping[key]
    keys = list(mapping)
    before = keys[keys.index(key) - 1] if keys.index(key) > 0 else None
    slot = mapping.ca.items.pop(key, None)
    removed = _Removed(value)
    following: Comments = []
    if slot is not None and slot[2] is not None:
        removed.end_of_line, after = _split(slot[2].value)
        following += _tokens(after)
    if _is_block(value):
        following += _take_following(value)
    elif isinstance(value, (CommentedMap, CommentedSeq)):
        value.ca.comment = None  # a flow collection's copy of the slot: the slot goes with it
    del mapping[key]
    if following and before is not None and not keep_following:
        _append_following(mapping, before, following)
    else:
        removed.following = following
    return removed


def _put(mapping: CommentedMap, key: str, removed: _Removed) -> None:
    """Set ``key`` to a removed field's value, with the comments that went with it."""
    mapping[key] = removed.value
    if removed.end_of_line or removed.following:
        text = (removed.end_of_line or "\n") + _text(removed.following)
        mapping.ca.items[key] = [None, None, CommentToken(text, CommentMark(0)), None]


def leading_comment(seq: CommentedSeq) -> Comments:
    """The comment lines between a sequence's key and its first item, taken off it (they go
    before the first item wherever it moves)."""
    comment = seq.ca.comment
    tokens: Comments = list(comment[1]) if comment and len(comment) > 1 and comment[1] else []
    seq.ca.comment = None
    return tokens


def _put_before(seq: CommentedSeq, index: int, lines: Comments) -> None:
    """Comment lines before item ``index`` of a block sequence: after the item before it."""
    if not lines:
        return
    if index == 0:
        seq.ca.comment = [None, list(lines)]
    else:
        _append_following(seq, index - 1, lines)


def _is_block(value: Any) -> bool:
    return (
        isinstance(value, (CommentedMap, CommentedSeq))
        and len(value) > 0
        and not value.fa.flow_style()
    )


def _chain(node: CommentedMap | CommentedSeq) -> list[CommentedMap | CommentedSeq]:
    """A block collection and the block collections that end where it ends, outermost first."""
    chain = [node]
    while True:
        last = chain[-1]
        key: Any = list(last)[-1] if isinstance(last, CommentedMap) else len(last) - 1
        if not _is_block(last[key]):
            return chain
        chain.append(last[key])


def _last_collection(node: CommentedMap | CommentedSeq) -> CommentedMap | CommentedSeq:
    return _chain(node)[-1]


def _slot(node: CommentedMap | CommentedSeq) -> tuple[Any, int]:
    """The key and comment slot of a collection's last element."""
    if isinstance(node, CommentedMap):
        return list(node)[-1], 2
    return len(node) - 1, 0


def _take_following(value: CommentedMap | CommentedSeq) -> Comments:
    """The comment lines after a block collection (not its last line's end-of-line comment),
    taken off it."""
    chain = _chain(value)
    key, index = _slot(chain[-1])
    slot = chain[-1].ca.items.get(key)
    following: Comments = []
    if slot is not None and slot[index] is not None:
        end_of_line, after = _split(slot[index].value)
        following += _tokens(after)
        if end_of_line:
            slot[index].value = end_of_line
        else:
            slot[index] = None
    for collection in reversed(chain):
        following += collection.ca.end or []
        collection.ca.end = []
    return following


def _append_following(container: CommentedMap | CommentedSeq, key: Any, lines: Comments) -> None:
    """Comment lines after ``container[key]``."""
    if _is_block(container[key]):
        _end_with(_last_collection(container[key]), lines)
        return
    index = 2 if isinstance(container, CommentedMap) else 0
    slot = container.ca.items.setdefault(key, [None, None, None, None])
    if slot[index] is None:
        slot[index] = CommentToken("\n" + _text(lines), CommentMark(0))
    else:
        slot[index].value += _text(lines)


def _end_with(collection: CommentedMap | CommentedSeq, lines: Comments) -> None:
    """Comment lines at the end of a block collection (ruamel writes a collection's end
    comments only where it keeps comments of its own)."""
    if collection.ca.comment is None:
        collection.ca.comment = [None, None]
    collection.ca.end = [*(collection.ca.end or []), *lines]


def _split(comment: str) -> tuple[str, str]:
    """A slot's comment: the end-of-line comment with its newline (or ""), and the lines
    after it."""
    first, newline, rest = comment.partition("\n")
    return (first + newline if first.strip() else ""), rest


def _tokens(text: str) -> Comments:
    """Comment lines as ruamel keeps them at the end of a collection: one token a line."""
    return [
        CommentToken(line.lstrip(" ") + "\n", CommentMark(len(line) - len(line.lstrip(" "))))
        for line in text.splitlines()
    ]


def _text(tokens: Comments) -> str:
    return "".join(" " * t.start_mark.column + t.value.lstrip(" ") for t in tokens)
