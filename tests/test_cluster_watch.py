"""``webhook.cluster.watching``: a watch cache kept current against the fake API server, which
streams real watch events (a chunked stream, bookmarks, 410 Expired, watches that end), through
the real kubernetes client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import kubernetes
import pytest

from tests.kubeapi import FakeKubeAPI
from tests.serving import wait_until
from webhook.cluster.connection import Cluster
from webhook.cluster.listing import PAGE_SIZE
from webhook.cluster.watching import CacheState, WatchCache, WatchOptions

# Short enough for tests: watches end every 2 s, failures retried within a fraction of one.
OPTIONS = WatchOptions(watch_seconds=2, read_idle_seconds=5, backoff_first=0.05, backoff_max=0.2)
SEEN_WITHIN = 2.0  # seconds: a change is in the cache within this


def node(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "4"}},
    }


def kept(obj: dict[str, Any]) -> tuple[str, str]:
    """What the tests keep of a Node: its pool label and its allocatable GPUs."""
    labels = obj["metadata"].get("labels") or {}
    gpus = (obj.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", "")
    return labels.get("pool", ""), gpus


def node_lists(api: FakeKubeAPI, *, watch: bool = False) -> list[Any]:
    """The lists of Nodes received (or with ``watch``, the watches)."""
    return [r for r in api.requests_to("GET", "/api/v1/nodes") if ("watch" in r.query) == watch]


class Running:
    """A cache running in a thread of its own, stopped at the end of the test."""

    def __init__(self, api: FakeKubeAPI, options: WatchOptions = OPTIONS) -> None:
        self.client = api.api_client()
        cluster = Cluster(api_client=self.client, namespace="default", timeout=5)
        core = kubernetes.client.CoreV1Api(self.client)
        self.cache: WatchCache[tuple[str, str]] = WatchCache(
            cluster, core.list_node, kept, options=options
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.cache.run, args=(self.stop,), daemon=True)
        self.thread.start()

    @property
    def state(self) -> CacheState[tuple[str, str]]:
        return self.cache.state

    def converged(
        self, expected: dict[tuple[str, str], tuple[str, str]], within: float = SEEN_WITHIN
    ) -> None:
        wait_until(
            lambda: self.state.listed and dict(self.state.items) == expected,
            timeout=within,
            what=f"the cache to hold {len(expected)} nodes as the API server does",
        )

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the cache did not stop"
        self.client.close()


@pytest.fixture
def api(kube_api: FakeKubeAPI) -> FakeKubeAPI:
    kube_api.bookmark_seconds = 0.2
    return kube_api


@pytest.fixture
def running(api: FakeKubeAPI) -> Iterator[Running]:
    cache = Running(api)
    yield cache
    cache.close()


def test_the_first_list_is_paged_and_the_watch_starts_from_its_resource_version(
    api: FakeKubeAPI,
) -> None:
    for index in range(2 * PAGE_SIZE + 3):
        api.add(node(f"node-{index:04d}", pool="a100"))
    running = Running(api)
    try:
        expected = {("", f"node-{i:04d}"): ("a100", "4") for i in range(2 * PAGE_SIZE + 3)}
        running.converged(expected, within=15)  # a first list of 1,003 on a busy machine
        assert [r.query["limit"] for r in node_lists(api)] == [[str(PAGE_SIZE)]] * 3
        watches = wait_until(
            lambda: node_lists(api, watch=True), timeout=SEEN_WITHIN, what="a watch"
        )
        watch = watches[0]
        last = api.get(f"/api/v1/nodes/node-{2 * PAGE_SIZE + 2:04d}")
        assert last is not None  # the latest change: the resourceVersion of the list
        assert watch.query["resourceVersion"] == [last["metadata"]["resourceVersion"]]
        assert watch.query["allowWatchBookmarks"] == ["true"]
        assert watch.query["timeoutSeconds"] == [str(OPTIONS.watch_seconds)]
    finally:
        running.close()


def test_nodes_added_relabelled_and_deleted_are_seen_within_two_seconds(
    api: FakeKubeAPI, running: Running
) -> None:
    api.add(node("gpu-1", pool="h100"))
    running.converged({("", "gpu-1"): ("h100", "4")})
    api.add(node("gpu-2", pool="h100"))
    running.converged({("", "gpu-1"): ("h100", "4"), ("", "gpu-2"): ("h100", "4")})
    relabelled = node("gpu-2", pool="l4")
    relabelled["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    api.replace(relabelled)
    running.converged({("", "gpu-1"): ("h100", "4"), ("", "gpu-2"): ("l4", "8")})
    api.remove("/api/v1/nodes/gpu-1")
    running.converged({("", "gpu-2"): ("l4", "8")})
    assert running.state.restarts == 0 and running.state.last_error is None


def test_bookmarks_move_the_resource_version_without_changing_the_items(
    api: FakeKubeAPI, running: Running
) -> None:
    api.add(node("gpu-1"))
    running.converged({("", "gpu-1"): ("", "4")})
    items = running.state.items
    # Another resource type changes: only a bookmark tells this watch where things are.
    api.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    latest = api.get("/api/v1/namespaces/team-a")
    assert latest is not None
    wait_until(
        lambda: running.state.resource_version == latest["metadata"]["resourceVersion"],
        timeout=SEEN_WITHIN,
        what="a bookmark with the latest resourceVersion",
    )
    assert running.state.items is items  # nothing changed, nothing copied


def test_a_watch_from_a_compacted_resource_version_lists_again(
    api: FakeKubeAPI, running: Running
) -> None:
    api.add(node("gpu-1", pool="h100"))
    running.converged({("", "gpu-1"): ("h100", "4")})
    lists_before = len(node_lists(api))
    # While the watch is down (refused until the changes are compacted away), nodes change.
    api.bookmark_seconds = 60  # no bookmark brings the watch's resourceVersion forward
    api.fail("/api/v1/nodes", 503, times=None)
    api.close_watches()
    wait_until(
        lambda: "503" in (running.state.last_error or ""), timeout=5, what="the watch refused"
    )
    api.add(node("gpu-2", pool="l4"))
    api.remove("/api/v1/nodes/gpu-1")
    api.compact()
    api.clear_failures()
    running.converged({("", "gpu-2"): ("l4", "4")}, within=5)
    assert len(node_lists(api)) > lists_before
    assert running.state.last_error is None and running.state.restarts >= 2  # 503s, then 410


def test_a_watch_that_ends_is_started_again_from_where_it_was(
    api: FakeKubeAPI, running: Running
) -> None:
    api.add(node("gpu-1"))
    running.converged({("", "gpu-1"): ("", "4")})
    for index in (2, 3, 4):  # an API server that restarts: every watch ends
        api.close_watches()
        api.add(node(f"gpu-{index}"))
    running.converged({("", f"gpu-{i}"): ("", "4") for i in (1, 2, 3, 4)})
    assert len(node_lists(api)) == 1  # no relist: each watch resumed from the last resourceVersion
    assert running.state.restarts == 0


def test_while_the_api_server_fails_the_cache_keeps_its_items_and_its_age_grows(
    api: FakeKubeAPI, running: Running
) -> None:
    api.add(node("gpu-1", pool="h100"))
    running.converged({("", "gpu-1"): ("h100", "4")})
    api.fail("/api/v1/nodes", 503, times=None)
    api.close_watches()
    wait_until(
        lambda: running.state.last_error is not None and running.state.restarts >= 2,
        timeout=SEEN_WITHIN,
        what="failed watches retried",
    )
    assert "503" in (running.state.last_error or "")
    heard_at = running.state.heard_at
    assert dict(running.state.items) == {("", "gpu-1"): ("h100", "4")}
    wait_until(lambda: running.state.restarts >= 4, timeout=SEEN_WITHIN, what="more retries")
    assert running.state.heard_at == heard_at  # failures are not news from the API server
    api.clear_failures()
    api.add(node("gpu-2", pool="h100"))
    running.converged({("", "gpu-1"): ("h100", "4"), ("", "gpu-2"): ("h100", "4")})
    assert running.state.last_error is None
    assert (running.state.heard_at or 0) > (heard_at or 0)


def test_the_cache_stops_when_told_even_while_watching(api: FakeKubeAPI) -> None:
    running = Running(api, WatchOptions(watch_seconds=30, read_idle_seconds=5))
    api.add(node("gpu-1"))
    running.converged({("", "gpu-1"): ("", "4")})
    running.stop.set()
    api.add(node("gpu-2"))  # the next event ends the watch's wait
    running.thread.join(timeout=SEEN_WITHIN)
    assert not running.thread.is_alive()
    running.client.close()


def device_class_cache(api: FakeKubeAPI, options: WatchOptions) -> tuple[Any, Any, Any]:
    """A cache of DeviceClasses (their names) running in a thread: (cache, stop, client)."""
    client = api.api_client()
    cluster = Cluster(api_client=client, namespace="default", timeout=5)
    resources = kubernetes.client.ResourceV1Api(client)
    cache: WatchCache[str] = WatchCache(
        cluster, resources.list_device_class, lambda obj: obj["metadata"]["name"], options=options
    )
    stop = threading.Event()
    threading.Thread(target=cache.run, args=(stop,), daemon=True).start()
    return cache, stop, client


def test_a_resource_type_not_served_has_no_objects_with_the_option(api: FakeKubeAPI) -> None:
    """A 404 (resource.k8s.io/v1 before Kubernetes 1.34): listed and empty, not a failure;
    listed again later, served; a watch whose type stops being served empties it."""
    api.add(
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"}}
    )
    api.set_served("resource.k8s.io", "v1", False)
    options = replace(OPTIONS, unserved_relist_seconds=0.5)
    cache, stop, client = device_class_cache(api, options)
    try:
        wait_until(lambda: cache.state.listed, timeout=SEEN_WITHIN, what="the 404")
        state = cache.state
        assert (dict(state.items), state.served, state.last_error) == ({}, False, None)
        api.set_served("resource.k8s.io", "v1", True)
        wait_until(
            lambda: dict(cache.state.items) == {("", "gpu"): "gpu"} and cache.state.served,
            timeout=SEEN_WITHIN,
            what="listed again, served",
        )
        listed_at = cache.state.heard_at
        wait_until(
            lambda: cache.state.heard_at != listed_at, timeout=SEEN_WITHIN, what="a bookmark"
        )
        api.set_served("resource.k8s.io", "v1", False)
        api.close_watches()  # an API server restarted without it
        wait_until(
            lambda: not cache.state.served and not cache.state.items,
            timeout=SEEN_WITHIN,
            what="the watch's 404",
        )
        assert cache.state.listed and cache.state.restarts == 0
    finally:
        stop.set()
        client.close()


def test_without_the_option_a_404_is_a_failure(api: FakeKubeAPI) -> None:
    api.set_served("resource.k8s.io", "v1", False)
    cache, stop, client = device_class_cache(api, OPTIONS)
    try:
        wait_until(lambda: cache.state.restarts >= 2, timeout=SEEN_WITHIN, what="retries")
        state = cache.state
        assert not state.listed and state.served
        assert state.last_error == "HTTP 404: Not Found"
    finally:
        stop.set()
        client.close()
