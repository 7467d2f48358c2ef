"""``webhook.audit.documents``: manifests read from text keep where every field stands, for JSON as
for YAML, so that reports point at the offending line."""

from __future__ import annotations

import json

import pytest

from webhook.audit.documents import Document, DocumentError, parse

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train"},
    "spec": {
        "containers": [
            {"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}}
        ]
    },
}


def line_of(text: str, needle: str) -> int:
    """The 1-based line of the first line of ``text`` that contains ``needle``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def item_start(text: str, needle: str) -> int:
    """The line of the ``{`` that opens the array item holding ``needle``."""
    lines = text.splitlines()
    at = line_of(text, needle)
    return next(i for i in range(at, 0, -1) if lines[i - 1].strip() == "{")


GPU_LIMIT = "spec.containers[0].resources.limits[nvidia.com/gpu]"


def test_a_json_object_has_the_line_of_each_field() -> None:
    text = json.dumps(POD, indent=2)
    (document,) = parse(text, "pod.json")
    assert document.obj == POD
    assert (document.number, document.line) == (1, 1)
    assert document.line_of(GPU_LIMIT) == line_of(text, '"nvidia.com/gpu"')
    assert document.line_of("spec.containers[0].image") == line_of(text, '"image"')
    # A path that goes past what the object has stops at its deepest known part.
    assert document.line_of("spec.containers[0].securityContext") == item_start(text, '"main"')


def test_a_json_list_has_the_line_of_each_item_and_field() -> None:
    other = {**POD, "metadata": {"name": "other"}}
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": [POD, other]}, indent=2)
    first, second = parse(text, "list.json")
    assert [d.obj for d in (first, second)] == [POD, other]
    assert first.line < second.line
    assert second.line == item_start(text, '"other"')
    lines = text.splitlines()
    gpu_lines = [i for i, line in enumerate(lines, 1) if '"nvidia.com/gpu"' in line]
    assert [first.line_of(GPU_LIMIT), second.line_of(GPU_LIMIT)] == gpu_lines


def test_a_json_array_is_its_items_each_with_its_lines() -> None:
    other = {**POD, "metadata": {"name": "other"}}
    text = json.dumps([POD, other], indent=2)
    first, second = parse(text, "pods.json")
    assert [d.obj for d in (first, second)] == [POD, other]
    assert (first.line, second.line) == (2, item_start(text, '"other"'))
    gpu_lines = [i for i, line in enumerate(text.splitlines(), 1) if '"nvidia.com/gpu"' in line]
    assert [first.line_of(GPU_LIMIT), second.line_of(GPU_LIMIT)] == gpu_lines


def test_json_with_tab_indentation_keeps_its_lines() -> None:
    # PyYAML refuses tabs between tokens; JSON allows them.
    text = json.dumps(POD, indent="\t")
    (document,) = parse(text, "pod.json")
    assert document.obj == POD
    assert document.line_of(GPU_LIMIT) == line_of(text, '"nvidia.com/gpu"')


def test_json_values_are_read_as_json_reads_them() -> None:
    # YAML 1.1 would read 1e3 as the string "1e3".
    (document,) = parse('{"kind": "Pod", "spec": {"priority": 1e3, "x": "a\\/b"}}', "p.json")
    assert document.obj["spec"] == {"priority": 1000.0, "x": "a/b"}


def test_invalid_json_keeps_its_json_message() -> None:
    with pytest.raises(DocumentError) as info:
        parse('{\n  "kind": "Pod",\n  "spec": {,}\n}', "bad.json")
    assert str(info.value) == (
        "bad.json: line 3: not valid JSON: Expecting property name enclosed in double quotes"
    )


def test_yaml_documents_keep_their_number_and_line() -> None:
    text = "a: 1\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n"
    first, second = parse(text, "two.yaml")
    assert (first.number, first.line, second.number, second.line) == (1, 1, 2, 3)
    assert second.line_of("metadata.name") == 6
    assert second.where == "two.yaml document 2 (line 3)"


@pytest.mark.parametrize("metadata", [["a", "b"], "name", 3])
def test_a_malformed_object_is_still_described(metadata: object) -> None:
    document = Document("x.yaml", 1, 1, {"kind": "Pod", "metadata": metadata})
    assert document.describe() == "Pod/?"


def test_yaml_in_flow_style_is_read_as_yaml() -> None:
    documents = parse("{apiVersion: v1, kind: Pod, metadata: {name: p}}\n", "flow.yaml")
    assert [d.obj["metadata"]["name"] for d in documents] == ["p"]


def test_broken_json_keeps_its_json_error() -> None:
    with pytest.raises(DocumentError, match="not valid JSON"):
        parse('{"apiVersion": "v1",, }', "bad.json")
