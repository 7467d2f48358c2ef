"""The user documentation holds together: every relative link of README.md, CONTRIBUTING.md and
docs/*.md names a file that exists, and every ``#anchor`` (in the same file or in
``file.md#anchor``) a heading of its target, by GitHub's slug rules; the README stays short
and every long document opens with its table of contents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import REPO

DOCUMENTS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 300
# A document longer than this opens with a list linking each of its sections.
LONG_DOCUMENT = 100

FENCED = re.compile(r"^```.*?^```$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); text may run over a line break.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:...


def prose(text: str) -> str:
    """The text without fenced blocks, where nothing is a link or a heading."""
    return FENCED.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (link targets and markup dropped), lower-case,
    every character but letters, digits, spaces, ``-`` and ``_`` removed, spaces to ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a document's headings; a repeated heading gets ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    found = set()
    for _, heading in HEADING.findall(prose(text)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    return [target for target in LINK.findall(CODE_SPAN.sub("code", prose(text)))]


def broken_links(documents: list[Path], root: Path = REPO) -> list[str]:
    """Every relative link of ``documents`` whose file or anchor does not exist, as
    ``document: target (why)``, the document relative to ``root``."""
    problems = []
    for document in documents:
        text = document.read_text("utf-8")
        for target in links(text):
            if EXTERNAL.match(target):
                continue
            path, _, anchor = target.partition("#")
            file = (document.parent / path).resolve() if path else document
            where = f"{document.relative_to(root)}: {target}"
            if not file.exists():
                problems.append(f"{where} (no file {path})")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text("utf-8")):
                problems.append(f"{where} (no heading #{anchor} in {file.name})")
    return problems


def test_every_relative_link_and_anchor_resolves() -> None:
    assert broken_links(DOCUMENTS) == []


def test_a_broken_link_and_a_broken_anchor_are_reported(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text(
        "# Guide\n\n## Serving: connections and deadlines\n\n## Limits\n\n## Limits\n", "utf-8"
    )
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Project\n\n## Quick start\n\n"
        "[ok](docs/guide.md#serving-connections-and-deadlines), [ok](docs/guide.md#limits-1), "
        "[ok](#quick-start), [ok](https://example.com/nowhere), `[code](missing.md)`\n\n"
        "[gone](docs/missing.md), [wrong anchor](docs/guide.md#serving),\n"
        "[no such section](#install)\n\n"
        "```\n[in a block](nowhere.md)\n```\n",
        "utf-8",
    )
    assert broken_links([readme], tmp_path) == [
        "README.md: docs/missing.md (no file docs/missing.md)",
        "README.md: docs/guide.md#serving (no heading #serving in guide.md)",
        "README.md: #install (no heading #install in README.md)",
    ]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The parts of `spec`", "the-parts-of-spec"),
        ("Dynamic Resource Allocation (DRA)", "dynamic-resource-allocation-dra"),
        ("The server's worker", "the-servers-worker"),
        ("Serving: connections and deadlines", "serving-connections-and-deadlines"),
        ("Break-glass", "break-glass"),
        ("gpu_admission metrics", "gpu_admission-metrics"),
        ("[certs](certs.md) and serve", "certs-and-serve"),
    ],
)
def test_anchors_follow_githubs_slugs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_the_readme_stays_short() -> None:
    lines = (REPO / "README.md").read_text("utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move text into docs/"


LONG_DOCUMENTS = [d for d in DOCUMENTS if d.read_text("utf-8").count("\n") > LONG_DOCUMENT]


@pytest.mark.parametrize("document", LONG_DOCUMENTS, ids=lambda path: path.name)
def test_a_long_document_opens_with_its_table_of_contents(document: Path) -> None:
    text = document.read_text("utf-8")
    sections = [slug(heading) for level, heading in HEADING.findall(prose(text)) if level == "##"]
    first_section = text.index("\n## ")
    listed = {target[1:] for target in links(text[:first_section]) if target.startswith("#")}
    assert sorted(set(sections) - listed) == [], (
        f"{document.name}: sections missing from its contents"
    )
