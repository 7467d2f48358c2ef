"""``webhook.admission.patch``: RFC 6901 pointers and the add-only RFC 6902 operations the
planner emits.

Every operation built here is also applied with the ``jsonpatch`` library (and a few with
kubectl), so "applies to the object as it is" is checked, not assumed.
"""

from __future__ import annotations

import copy

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.patching import apply_both, apply_jsonpatch
from webhook.admission import patch

# --- escape / pointer / unescape ----------------------------------------------------------


@pytest.mark.parametrize(
    ("segment", "escaped"),
    [
        ("spec", "spec"),
        ("gpu-admission.io/injected", "gpu-admission.io~1injected"),
        ("a~b", "a~0b"),
        ("~1", "~01"),  # "~" first, or "~1" would come back as "/"
        ("/~", "~1~0"),
        ("a//b~~", "a~1~1b~0~0"),
        ("", ""),
        (3, "3"),
        ("-", "-"),
    ],
)
def test_escape(segment, escaped):
    assert patch.escape(segment) == escaped
    assert patch.unescape(escaped) == str(segment)


def test_pointer():
    assert patch.pointer(()) == ""
    assert patch.pointer(("spec", "tolerations")) == "/spec/tolerations"
    assert patch.pointer(("spec", "containers", 0, "env")) == "/spec/containers/0/env"
    assert (
        patch.pointer(("metadata", "annotations", "example.com/a~b"))
        == "/metadata/annotations/example.com~1a~0b"
    )


def test_pointer_agrees_with_jsonpatch():
    for key in ("a/b", "a~b", "~1", "~0/", "x/~/y", ""):
        doc = {"metadata": {"annotations": {key: "v"}}}
        pointer = patch.pointer(("metadata", "annotations", key))
        assert jsonpatch.JsonPointer(pointer).resolve(doc) == "v"


@settings(derandomize=True, database=None, max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab/~01-", max_size=6), min_size=1, max_size=4))
def test_pointer_round_trips(segments):
    pointer = patch.pointer(segments)
    assert [patch.unescape(s) for s in pointer.split("/")[1:]] == segments
    assert jsonpatch.JsonPointer(pointer).parts == segments


# --- add ----------------------------------------------------------------------------------


def test_add_to_an_existing_parent():
    doc = {"metadata": {"annotations": {"a": "1"}}}
    ops = patch.add(doc, ("metadata", "annotations", "b/c"), "2")
    assert ops == [{"op": "add", "path": "/metadata/annotations/b~1c", "value": "2"}]
    assert apply_jsonpatch(doc, ops) == {"metadata": {"annotations": {"a": "1", "b/c": "2"}}}


def test_add_creates_missing_parents_at_the_deepest_existing_one():
    doc = {"metadata": {"name": "p"}, "spec": {}}
    ops = patch.add(doc, ("spec", "affinity", "nodeAffinity", "x"), [1])
    assert ops == [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {"x": [1]}}}]
    assert apply_jsonpatch(doc, ops)["spec"] == {"affinity": {"nodeAffinity": {"x": [1]}}}


def test_add_creates_a_missing_top_level_object():
    doc = {"spec": {}}
    ops = patch.add(doc, ("metadata", "annotations", "k"), "v")
    assert ops == [{"op": "add", "path": "/metadata", "value": {"annotations": {"k": "v"}}}]
    assert apply_jsonpatch(doc, ops) == {"spec": {}, "metadata": {"annotations": {"k": "v"}}}


@pytest.mark.parametrize("null_at", ["affinity", "nodeAffinity"])
def test_add_replaces_a_null_parent(null_at):
    doc = (
        {"spec": {"affinity": None}}
        if null_at == "affinity"
        else {"spec": {"affinity": {"nodeAffinity": None}}}
    )
    ops = patch.add(doc, ("spec", "affinity", "nodeAffinity", "x"), 1)
    assert len(ops) == 1
    assert ops[0]["path"] == "/spec/affinity" + ("/nodeAffinity" if null_at != "affinity" else "")
    assert apply_jsonpatch(doc, ops)["spec"]["affinity"] == {"nodeAffinity": {"x": 1}}


def test_add_replaces_an_existing_null_leaf():
    doc = {"metadata": {"annotations": None}}
    ops = patch.add(doc, ("metadata", "annotations"), {"k": "v"})
    assert ops == [{"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}]


def test_add_into_an_existing_list_item():
    doc = {"spec": {"containers": [{"name": "a", "env": []}]}}
    ops = patch.add(doc, ("spec", "containers", 0, "image"), "busybox")
    assert ops == [{"op": "add", "path": "/spec/containers/0/image", "value": "busybox"}]
    assert apply_jsonpatch(doc, ops)["spec"]["containers"] == [
        {"name": "a", "env": [], "image": "busybox"}
    ]


def test_add_creates_a_missing_field_inside_a_list_item():
    doc = {"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}
    ops = patch.add(doc, ("spec", "containers", 1, "env"), [{"name": "X", "value": "1"}])
    assert apply_jsonpatch(doc, ops)["spec"]["containers"] == [
        {"name": "a"},
        {"name": "b", "env": [{"name": "X", "value": "1"}]},
    ]


def test_add_creates_missing_parents_inside_a_list_item():
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]
    doc = {"terms": copy.deepcopy(terms)}
    ops = patch.add(doc, ("terms", 0, "matchExpressions"), [{"key": "k", "operator": "Exists"}])
    assert apply_jsonpatch(doc, ops)["terms"] == [
        {**terms[0], "matchExpressions": [{"key": "k", "operator": "Exists"}]}
    ]


@pytest.mark.parametrize(
    ("doc", "segments"),
    [
        ({"spec": {"tolerations": "oops"}}, ("spec", "tolerations", "x")),
        ({"spec": "oops"}, ("spec", "affinity", "nodeAffinity")),
        ({"spec": 3}, ("spec", "affinity")),
        pytest.param(
            {"spec": {"tolerations": []}},
            ("spec", "tolerations", "key"),
            id="name-into-empty-list",
        ),
        pytest.param(
            {"metadata": {"annotations": ["a"]}},
            ("metadata", "annotations", "k"),
            id="name-into-list",
        ),
        ({"spec": {"tolerations": [1]}}, ("spec", "tolerations", "key", "x")),
        ({"spec": {"c": []}}, ("spec", "c", 0, "env")),  # an index past the end
        ({"spec": True}, ("spec", "x", "y", "z")),
    ],
)
def test_add_refuses_to_write_through_a_non_object(doc, segments):
    before = copy.deepcopy(doc)
    assert patch.add(doc, segments, "v") is None
    assert doc == before


# --- append -------------------------------------------------------------------------------


def test_append_to_an_existing_list():
    doc = {"spec": {"tolerations": [{"operator": "Exists"}]}}
    items = [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]
    ops = patch.append(doc, ("spec", "tolerations"), items)
    assert ops == [{"op": "add", "path": "/spec/tolerations/-", "value": item} for item in items]
    assert apply_jsonpatch(doc, ops)["spec"]["tolerations"] == [{"operator": "Exists"}, *items]


def test_append_to_an_empty_list():
    doc = {"spec": {"tolerations": []}}
    ops = patch.append(doc, ("spec", "tolerations"), [1, 2])
    assert [op["path"] for op in ops] == ["/spec/tolerations/-"] * 2
    assert apply_jsonpatch(doc, ops)["spec"]["tolerations"] == [1, 2]


def test_append_creates_a_missing_list():
    doc = {"spec": {"containers": []}}
    ops = patch.append(doc, ("spec", "tolerations"), [1, 2])
    assert ops == [{"op": "add", "path": "/spec/tolerations", "value": [1, 2]}]


def test_append_creates_a_missing_list_and_its_parents():
    doc = {"spec": {}}
    path = ("spec", "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution")
    ops = patch.append(doc, path, [{"weight": 1}])
    assert ops == [
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {
                "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}
            },
        }
    ]


def test_append_replaces_a_null_list():
    doc = {"spec": {"tolerations": None}}
    ops = patch.append(doc, ("spec", "tolerations"), [1])
    assert ops == [{"op": "add", "path": "/spec/tolerations", "value": [1]}]
    assert apply_jsonpatch(doc, ops) == {"spec": {"tolerations": [1]}}


def test_append_below_a_null_parent():
    doc = {"spec": {"affinity": None}}
    ops = patch.append(doc, ("spec", "affinity", "nodeAffinity", "p"), [1])
    assert ops == [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {"p": [1]}}}]


def test_append_to_a_list_inside_a_list_item():
    doc = {"spec": {"containers": [{"name": "a", "env": [{"name": "A"}]}, {"name": "b"}]}}
    ops = patch.append(doc, ("spec", "containers", 0, "env"), [{"name": "B"}])
    assert ops == [{"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "B"}}]
    assert apply_jsonpatch(doc, ops)["spec"]["containers"][0]["env"] == [
        {"name": "A"},
        {"name": "B"},
    ]


@pytest.mark.parametrize("env", ["absent", None])
def test_append_creates_a_missing_list_inside_a_list_item(env):
    container = {"name": "b"} if env == "absent" else {"name": "b", "env": None}
    doc = {"spec": {"containers": [{"name": "a"}, container]}}
    ops = patch.append(doc, ("spec", "containers", 1, "env"), [{"name": "B"}])
    assert apply_jsonpatch(doc, ops)["spec"]["containers"] == [
        {"name": "a"},
        {"name": "b", "env": [{"name": "B"}]},
    ]


def test_append_nothing_plans_nothing():
    assert patch.append({"spec": {}}, ("spec", "tolerations"), []) == []
    assert patch.append({"spec": "oops"}, ("spec", "tolerations"), []) == []


@pytest.mark.parametrize(
    "doc",
    [
        {"spec": {"tolerations": {"key": "a"}}},
        {"spec": {"tolerations": "a"}},
        {"spec": {"tolerations": 0}},
        {"spec": {"tolerations": False}},
        {"spec": "oops"},
    ],
)
def test_append_refuses_a_non_list(doc):
    before = copy.deepcopy(doc)
    assert patch.append(doc, ("spec", "tolerations"), [1]) is None
    assert doc == before


def test_append_with_a_key_that_needs_escaping():
    doc = {"metadata": {"annotations": {}}, "data": {"a/b~c": []}}
    ops = patch.append(doc, ("data", "a/b~c"), ["x"])
    assert ops == [{"op": "add", "path": "/data/a~1b~0c/-", "value": "x"}]
    assert apply_jsonpatch(doc, ops)["data"] == {"a/b~c": ["x"]}


# --- apply_add (the planner's working copy) -----------------------------------------------


@pytest.mark.parametrize(
    ("doc", "op"),
    [
        ({"a": {}}, {"op": "add", "path": "/a/b~1c~0d", "value": 1}),
        ({"a": [1, 2]}, {"op": "add", "path": "/a/-", "value": 3}),
        ({"a": [1, 2]}, {"op": "add", "path": "/a/0", "value": 0}),
        ({"a": [{"b": []}]}, {"op": "add", "path": "/a/0/b/-", "value": "x"}),
        ({"a": None}, {"op": "add", "path": "/a", "value": {"b": 1}}),
        ({"a": {"b": 1}}, {"op": "add", "path": "/a/b", "value": 2}),
    ],
)
def test_apply_add_agrees_with_jsonpatch(doc, op):
    expected = jsonpatch.apply_patch(copy.deepcopy(doc), [op])
    original = copy.deepcopy(doc)
    assert patch.with_add(doc, op) == expected
    assert doc == original, "with_add changed its input"
    patch.apply_add(doc, op)
    assert doc == expected


def test_with_add_copies_only_the_path_it_changes():
    doc = {"spec": {"containers": [{"name": "a", "env": []}, {"name": "b"}]}, "metadata": {}}
    after = patch.with_add(doc, {"op": "add", "path": "/spec/containers/0/env/-", "value": 1})
    assert doc["spec"]["containers"][0]["env"] == []
    assert after["spec"]["containers"][0]["env"] == [1]
    assert after["metadata"] is doc["metadata"]  # off the path: shared
    assert after["spec"]["containers"][1] is doc["spec"]["containers"][1]


# --- Everything the builders emit applies with kubectl too --------------------------------

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "annotations": {"example.com/a~b": "1"}},
    "spec": {
        "containers": [{"name": "a", "image": "i", "env": [{"name": "A", "value": "1"}]}],
        "tolerations": None,
        "affinity": {"nodeAffinity": None},
    },
}


@pytest.mark.parametrize(
    "build",
    [
        lambda pod: patch.append(pod, ("spec", "tolerations"), [{"operator": "Exists"}]),
        lambda pod: patch.append(pod, ("spec", "containers", 0, "env"), [{"name": "B"}]),
        lambda pod: patch.add(pod, ("metadata", "annotations", "gpu-admission.io/x~y"), "v"),
        lambda pod: patch.append(
            pod,
            ("spec", "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution"),
            [
                {
                    "weight": 1,
                    "preference": {
                        "matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]
                    },
                }
            ],
        ),
    ],
    ids=["tolerations-null", "env-append", "annotation-escaped", "preferred-under-null"],
)
def test_operations_apply_identically_with_kubectl(build):
    ops = build(POD)
    assert ops
    apply_both(POD, ops)
