"""The work a review decided on the event loop can cost.

A review under ``LONG_BODY_BYTES`` with fewer than ``LONG_BODY_ITEMS`` items is decoded and
decided inline, and the worker's other connections wait meanwhile. The limit was set on the
review that costs most per byte that a tenant might think of first: thousands of empty
containers. Every other list or map a tenant can fill (resource names, env entries,
tolerations, volumes, affinity terms...) is filled here to the largest review still kept
inline, on CREATE and UPDATE, validated and mutated, and its decision must cost at most a
small multiple of that one; so must an Argo Workflow, whose templates each inherit the
Workflow's pod-level fields, at the most templates and inherited items judged inline (and
one more, handed over once that is found). Work is counted in Python function calls
(cProfile), not timed: the count is the same on every run and every machine.

A resource map of a thousand names used to cost 80 times the container flood (a difflib and
edit-distance search against every declared name, for each name, three times on UPDATE):
about a second of a worker's event loop for one 64 KiB request.
"""

from __future__ import annotations

import copy
import cProfile
import json
import pstats
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import webhook
from tests.patching import review
from tests.serving import fixture_bytes
from webhook.admission.engine import TooMuchWork
from webhook.server.app import INLINE_LIMITS, _decide_body, _is_long
from webhook.server.settings import LONG_BODY_BYTES, LONG_BODY_ITEMS

POLICY = webhook.load_policy(webhook.default_policy_path())
BASE = json.loads(fixture_bytes("admission-review-gpu-pod.json"))
# Measured: the costliest shape below (a Workflow of 400 templates) makes 2.1 times the calls
# of the container flood.
WORK_MULTIPLE = 2.5

Fill = Callable[[dict, int], None]


def _container(obj: dict) -> dict:
    return obj["spec"]["containers"][0]


def _affinity(terms: Any) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}


def _in_spec(field: str, item: Any) -> Fill:
    return lambda obj, n: obj["spec"].__setitem__(field, [item] * n)


def _in_container(field: str, item: Any) -> Fill:
    return lambda obj, n: _container(obj).__setitem__(field, [item] * n)


def _resources(part: str, name: Callable[[int], str]) -> Fill:
    return lambda obj, n: _container(obj)["resources"].__setitem__(
        part, {name(i): "1" for i in range(n)}
    )


def _mapping(where: Callable[[dict], dict], field: str) -> Fill:
    return lambda obj, n: where(obj).__setitem__(field, {f"k{i}": "v" for i in range(n)})


SHAPES: dict[str, Fill] = {
    "containers": lambda obj, n: obj["spec"]["containers"].extend([{}] * n),
    "initContainers": _in_spec("initContainers", {}),
    "ephemeralContainers": _in_spec("ephemeralContainers", {}),
    "env": _in_container("env", {}),
    "env of scalars": _in_container("env", 0),
    "envFrom": _in_container("envFrom", {}),
    "volumeMounts": _in_container("volumeMounts", {}),
    "volumeDevices": _in_container("volumeDevices", {}),
    "ports": _in_container("ports", {}),
    "args": _in_container("args", ""),
    "capabilities": lambda obj, n: _container(obj).__setitem__(
        "securityContext", {"capabilities": {"add": ["SYS_ADMIN"] * n}}
    ),
    "volumes": _in_spec("volumes", {}),
    "hostPath volumes": _in_spec("volumes", {"name": "d", "hostPath": {"path": "/dev"}}),
    "tolerations": _in_spec("tolerations", {}),
    "resourceClaims": _in_spec("resourceClaims", {}),
    "topologySpreadConstraints": _in_spec("topologySpreadConstraints", {}),
    "nodeSelectorTerms": lambda obj, n: obj["spec"].__setitem__(
        "affinity", _affinity({"nodeSelectorTerms": [{}] * n})
    ),
    "matchExpressions": lambda obj, n: obj["spec"].__setitem__(
        "affinity", _affinity({"nodeSelectorTerms": [{"matchExpressions": [{}] * n}]})
    ),
    "expression values": lambda obj, n: obj["spec"].__setitem__(
        "affinity",
        _affinity(
            {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "a", "operator": "In", "values": ["v"] * n}]}
                ]
            }
        ),
    ),
    "nodeSelector": _mapping(lambda obj: obj["spec"], "nodeSelector"),
    "labels": _mapping(lambda obj: obj["metadata"], "labels"),
    "annotations": _mapping(lambda obj: obj["metadata"], "annotations"),
    "uncatalogued MIG limits": _resources(
        "limits", lambda i: f"nvidia.com/mig-{1 + i % 99}g.{1 + i // 99}gb"
    ),
    "malformed MIG limits": _resources("limits", lambda i: f"nvidia.com/mig-{i}g.5gb"),
    "near-miss limits": _resources("limits", lambda i: f"nvidia.com/gpu{i}x"),
    "undeclared vendor limits": _resources("limits", lambda i: f"nvidia.com/rail{i}"),
    "undeclared vendor requests": _resources("requests", lambda i: f"nvidia.com/rail{i}"),
}


def _body(fill: Fill, n: int, update: bool) -> bytes:
    review = copy.deepcopy(BASE)
    fill(review["request"]["object"], n)
    if update:
        review["request"]["operation"] = "UPDATE"
        review["request"]["oldObject"] = review["request"]["object"]
    return json.dumps(review, separators=(",", ":")).encode()


def _largest_inline(fill: Fill, update: bool) -> bytes:
    """The body with the most items that is still decided inline."""
    low, high = 0, LONG_BODY_BYTES
    while low < high:
        middle = (low + high + 1) // 2
        body = _body(fill, middle, update)
        if len(body) < LONG_BODY_BYTES and not _is_long(body):
            low = middle
        else:
            high = middle - 1
    assert low > 100, "the shape is no flood"
    return _body(fill, low, update)


def _calls(body: bytes, mutate: bool) -> int:
    """The Python calls of deciding ``body`` as the server does inline, up to the point where
    it would hand the review to a child (that work is done on the event loop too)."""
    profile = cProfile.Profile()
    try:
        profile.runcall(_decide_body, body, POLICY, None, mutate, INLINE_LIMITS)
    except Exception:  # a refusal (4xx) or a hand-over is work too, and counted
        pass
    return pstats.Stats(profile).total_calls


@pytest.fixture(scope="module")
def budget() -> int:
    flood = _largest_inline(SHAPES["containers"], update=False)
    return int(WORK_MULTIPLE * max(_calls(flood, mutate) for mutate in (False, True)))


@pytest.mark.parametrize("update", [False, True], ids=["create", "update"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_no_review_kept_inline_costs_much_more_than_the_container_flood(
    shape: str, update: bool, budget: int
) -> None:
    body = _largest_inline(SHAPES[shape], update)
    for mutate in (False, True):
        assert _calls(body, mutate) <= budget, (shape, update, mutate)


def test_a_resource_map_past_the_item_limit_is_not_kept_inline() -> None:
    """Members of a map are items: a thousand resource names cannot hide in one object."""
    body = _body(SHAPES["undeclared vendor limits"], 2500, update=False)
    assert len(body) < LONG_BODY_BYTES
    assert _is_long(body)


# --- what templates inherit: an Argo Workflow's pod-level fields are every template's ------

INHERITED: dict[str, Callable[[int], tuple[str, Any]]] = {
    "nothing": lambda n: ("arguments", {}),  # not a pod-level field: templates alone
    "hostPath volumes": lambda n: ("volumes", [{"name": "d", "hostPath": {"path": "/d"}}] * n),
    "tolerations": lambda n: ("tolerations", [{"key": "k", "operator": "Exists"}] * n),
    "affinity terms": lambda n: ("affinity", _affinity({"nodeSelectorTerms": [{}] * n})),
    "hostAliases": lambda n: ("hostAliases", [{"ip": "1.2.3.4", "hostnames": ["a"]}] * n),
    "nodeSelector": lambda n: ("nodeSelector", {f"k{i}": "v" for i in range(n)}),
    # Work by the byte: each template normalises the path, or records the patch, again.
    "a long host path": lambda n: ("volumes", [{"name": "d", "hostPath": {"path": "/x" * 9000}}]),
    "a long podSpecPatch": lambda n: ("podSpecPatch", "é" * 18000),
}


def _workflow(templates: int, inherited: Callable[[int], tuple[str, Any]], n: int) -> dict:
    field, value = inherited(n)
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "w", "namespace": "team-a"},
        "spec": {
            field: value,
            "templates": [{"name": f"t{i}", "container": {}} for i in range(templates)],
        },
    }


def _workflow_review(new: dict, old: dict | None = None) -> bytes:
    operation = "CREATE" if old is None else "UPDATE"
    built = review(new, kind="Workflow", namespace="team-a", operation=operation, old=old)
    return json.dumps(built, separators=(",", ":")).encode()


def _workflow_body(
    templates: int, inherited: Callable[[int], tuple[str, Any]], items: int, as_old: bool
) -> bytes:
    big = _workflow(templates, inherited, items)
    if not as_old:
        return _workflow_review(big)
    # The old object is judged only for the rules of the new one's denials: bring some.
    new = copy.deepcopy(big)
    new["spec"]["templates"][0]["container"]["securityContext"] = {"privileged": True}
    new["spec"]["hostPID"] = True
    return _workflow_review(new, big)


def _judged_inline(body: bytes) -> bool:
    if len(body) >= LONG_BODY_BYTES or _is_long(body):
        return False
    try:
        _decide_body(body, POLICY, None, False, INLINE_LIMITS)
    except TooMuchWork:
        return False
    return True


def _inline_workflows(inherited: Callable[[int], tuple[str, Any]]) -> Iterator[bytes]:
    """For several numbers of inherited items, as a new object and as the old object of an
    UPDATE: the most templates a review judged inline can have, and one more (handed over,
    after the work of finding that out)."""
    for items in (1, 10, 30, 300):
        for as_old in (False, True):
            low, high = 1, LONG_BODY_ITEMS
            while low < high:
                middle = (low + high + 1) // 2
                if _judged_inline(_workflow_body(middle, inherited, items, as_old)):
                    low = middle
                else:
                    high = middle - 1
            yield _workflow_body(low, inherited, items, as_old)
            yield _workflow_body(low + 1, inherited, items, as_old)


@pytest.mark.parametrize("inherited", list(INHERITED))
def test_no_workflow_kept_inline_costs_much_more_than_the_container_flood(
    inherited: str, budget: int
) -> None:
    for body in _inline_workflows(INHERITED[inherited]):
        if len(body) >= LONG_BODY_BYTES or _is_long(body):
            continue  # decided in a child
        for mutate in (False, True):
            assert _calls(body, mutate) <= budget, (inherited, len(body), mutate)


def test_a_workflow_whose_templates_inherit_too_much_is_not_judged_inline() -> None:
    """980 templates inheriting 980 host path volumes: a million (template, volume) pairs
    in 44 KB, which took half a minute to judge inline."""
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "spec": {
            "volumes": [{"hostPath": {"path": "/d"}}] * 980,
            "templates": [{"container": {}}] * 980,
        },
    }
    body = _workflow_review(workflow)
    assert len(body) < LONG_BODY_BYTES and not _is_long(body)
    with pytest.raises(TooMuchWork):
        _decide_body(body, POLICY, None, False, INLINE_LIMITS)


def test_a_workflow_of_a_thousand_templates_is_not_judged_inline() -> None:
    """A template costs four times what an empty container does: 980 of them, in 31 KB,
    took 34 ms to judge inline."""
    workflow = _workflow(980, INHERITED["tolerations"], 0)
    del workflow["spec"]["tolerations"]
    body = _workflow_review(workflow)
    assert len(body) < LONG_BODY_BYTES and not _is_long(body)
    with pytest.raises(TooMuchWork):
        _decide_body(body, POLICY, None, False, INLINE_LIMITS)


# --- what templates share: a TrainJob's trainer is judged with each of its overrides -------


def _trainjob(overrides: int, names: int) -> bytes:
    limits = {f"nvidia.com/rail{i}": "1" for i in range(names)}
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "j", "namespace": "team-a"},
        "spec": {
            "trainer": {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "1", **limits}}},
            "podSpecOverrides": [{}] * overrides,
        },
    }
    built = review(job, kind="TrainJob", namespace="team-a")
    return json.dumps(built, separators=(",", ":")).encode()


@pytest.mark.parametrize("names", [1, 10, 100, 1000])
def test_no_trainjob_kept_inline_costs_much_more_than_the_container_flood(
    names: int, budget: int
) -> None:
    """499 overrides of a trainer naming 1,000 resources took 7 s to judge inline."""
    low, high = 1, LONG_BODY_ITEMS
    while low < high:
        middle = (low + high + 1) // 2
        if _judged_inline(_trainjob(middle, names)):
            low = middle
        else:
            high = middle - 1
    for overrides in (low, low + 1):
        body = _trainjob(overrides, names)
        if len(body) >= LONG_BODY_BYTES or _is_long(body):
            continue
        for mutate in (False, True):
            assert _calls(body, mutate) <= budget, (names, overrides, mutate)


# --- work by the byte: one long name quoted in every finding --------------------------------


def test_a_long_name_in_many_findings_is_written_a_bounded_number_of_times(monkeypatch) -> None:
    """A container named with 40 KB (a direct client; a custom resource whose schema does not
    bound names) adding SYS_ADMIN 1,950 times: each audited finding quoted the whole name,
    and the audit annotation was written out whole (76 MB) and halved, for about a second of
    the event loop in 62 KB and fewer calls than the container flood."""
    import webhook.admission.response as response_module
    import webhook.core.findings as findings_module

    written = [0]

    def counting(dumps: Callable[..., str]) -> Callable[..., str]:
        def dumps_and_count(*args: Any, **kwargs: Any) -> str:
            text = dumps(*args, **kwargs)
            written[0] += len(text)
            return text

        return dumps_and_count

    assert findings_module.json is response_module.json  # one module to count through
    monkeypatch.setattr(findings_module.json, "dumps", counting(json.dumps))
    review = copy.deepcopy(BASE)
    container = {
        "name": "c" * 40_000,
        "image": "registry.example.com/app:1",
        "securityContext": {"capabilities": {"add": ["SYS_ADMIN"] * 1950}},
    }
    review["request"]["object"]["spec"]["containers"] = [container]
    body = json.dumps(review, separators=(",", ":")).encode()
    assert len(body) < LONG_BODY_BYTES and not _is_long(body)
    outcome = _decide_body(body, POLICY, None, False, INLINE_LIMITS)
    assert len(outcome.body) < 64 * 1024
    assert written[0] < 32 * len(body), written[0]
