"""Paged lists of the workload kinds a policy judges, from a connected cluster.

Lists go through the kubernetes client, their JSON bodies read as sent (no model round trip
that drops fields). Failing to list one resource is a :class:`Problem` and the caller goes on;
an unreachable server or refused credentials are a :class:`ClusterError` that ends the work,
and so is a refused list or read the work cannot do without (:class:`RequestRefused`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import orjson

from webhook.cluster.connection import Cluster, ClusterError, one_line
from webhook.policy.model import WorkloadKind
from webhook.policy.workloads import DRA_GROUP

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException

PAGE_SIZE = 500
AUDITOR_ROLE = "the gpu-admission-auditor ClusterRole (manifests/base/auditor-clusterrole.yaml)"
# The typed client of each built-in workload kind: (API class, the snake_case kind in its
# method names). Everything else is a custom resource, listed through CustomObjectsApi.
BUILTIN_LISTS: dict[tuple[str, str], tuple[str, str]] = {
    ("", "Pod"): ("CoreV1Api", "pod"),
    ("", "ReplicationController"): ("CoreV1Api", "replication_controller"),
    ("apps", "Deployment"): ("AppsV1Api", "deployment"),
    ("apps", "ReplicaSet"): ("AppsV1Api", "replica_set"),
    ("apps", "StatefulSet"): ("AppsV1Api", "stateful_set"),
    ("apps", "DaemonSet"): ("AppsV1Api", "daemon_set"),
    ("batch", "Job"): ("BatchV1Api", "job"),
    ("batch", "CronJob"): ("BatchV1Api", "cron_job"),
    # Served from Kubernetes 1.34 on: a 404 before that means no claim can exist.
    (DRA_GROUP, "ResourceClaimTemplate"): ("ResourceV1Api", "resource_claim_template"),
    (DRA_GROUP, "ResourceClaim"): ("ResourceV1Api", "resource_claim"),
}


class RequestRefused(ClusterError):
    """The API server refused a list or read the work needs: one line that names what was
    asked, with its HTTP status and the server's words and, for a 403, ``grant``: what the
    caller's users need (the audits' role by default; ``explain`` and ``inspect`` name the
    permission and their own role). A ``ClusterError``: the work cannot go on, unless its
    caller makes it a problem. ``granted_by`` is the same refusal for a caller that runs
    another command's readers and whose users hold another role."""

    def __init__(self, what: str, exc: ApiException, grant: str = f"bind {AUDITOR_ROLE}") -> None:
        self.what = what
        self.exc = exc
        self.grant = grant
        hint = f": {grant}" if exc.status == 403 else ""
        super().__init__(f"{what} (HTTP {exc.status}): {status_message(exc)}{hint}")

    def granted_by(self, grant: str) -> RequestRefused:
        return RequestRefused(self.what, self.exc, grant)


@dataclass(frozen=True, slots=True)
class Problem:
    """Something that could not be read (a resource that could not be listed; for the audits,
    a file too) or judged (an object the engine failed on); the work goes on without it."""

    source: str
    message: str  # one line that names the source
    stage: Literal["read", "judge"] = "read"


class Listing(NamedTuple):
    """Every item of a paged list, with the list's apiVersion and the resourceVersion of the
    snapshot its pages were read from (where a watch of it starts)."""

    items: list[dict[str, Any]]
    api_version: str
    resource_version: str


class Lister:
    """Paginated lists of one namespace (or all, with None). Failures to list one resource
    are collected in ``problems`` and the caller goes on; an unreachable server or refused
    credentials raise :class:`ClusterError`."""

    def __init__(self, cluster: Cluster, namespace: str | None) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.problems: list[Problem] = []
        # Custom resources whose CRD is not installed, and whether they are catalogued kinds.
        self.not_served: list[tuple[str, bool]] = []
        self._groups: dict[str, list[str]] | None = None  # discovered API group -> versions
        self._discovery_failed = False

    def object_pages(self, workload: WorkloadKind) -> Iterator[list[dict[str, Any]]]:
        """The objects of a workload kind a page at a time, as they arrive, each with its
        apiVersion and kind, and each once (by uid), when a list starts over. A list that
        fails is a problem and ends the kind: the pages before it have been given."""
        from kubernetes.client.exceptions import ApiException

        resource = f"{workload.resource}.{workload.group}" if workload.group else workload.resource
        builtin = (workload.group, workload.kind) in BUILTIN_LISTS
        given: set[str] = set()
        for list_page in self._list_functions(workload):
            try:
                for api_version, items in self._pages_once_more(list_page, given):
                    for item in items:
                        # Lists of built-in kinds leave apiVersion and kind out of their items.
                        item.setdefault("apiVersion", api_version)
                        item.setdefault("kind", workload.kind)
                    yield items
            except ApiException as exc:
                if exc.status == 404 and (not builtin or workload.group == DRA_GROUP):
                    continue  # this version does not serve the kind; try the group's next
                self.problems.append(Problem(resource, self._failure(exc, workload, resource)))
            return
        if not self._discovery_failed:  # that is reported once, as a problem
            self.not_served.append((resource, workload.catalogued))

    def _pages_once_more(
        self, list_page: Callable[..., Any], given: set[str]
    ) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        """(apiVersion, items) of each page, less the objects already ``given`` (by uid: the
        caller has judged them) before the list started, and their uids added to it. A
        continue token that outlived the API server's snapshot (410 Expired) starts the list
        over once, from a new snapshot; so does a version that stops serving the kind midway
        (404: the caller tries the next)."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(2):
            # Only what an earlier list gave: two objects of one list are never the same one.
            before = frozenset(given)
            try:
                for page in self.pages(list_page):
                    items = page.get("items") or []
                    if before:
                        items = [item for item in items if _uid(item) not in before]
                    given.update(uid for item in items if (uid := _uid(item)))
                    yield page.get("apiVersion", ""), items
                return
            except ApiException as exc:
                if exc.status != 410 or attempt:
                    raise

    def _list_functions(self, workload: WorkloadKind) -> Iterator[Callable[..., Any]]:
        from kubernetes import client as k8s

        builtin = BUILTIN_LISTS.get((workload.group, workload.kind))
        if builtin is not None:
            api_class, name = builtin
            api = getattr(k8s, api_class)(self.cluster.api_client)
            if self.namespace:
                yield partial(getattr(api, f"list_namespaced_{name}"), self.namespace)
            else:
                yield getattr(api, f"list_{name}_for_all_namespaces")
            return
        custom = k8s.CustomObjectsApi(self.cluster.api_client)
        for version in self._versions(workload.group):
            if self.namespace and workload.scope == "Namespaced":
                yield partial(
                    custom.list_namespaced_custom_object,
                    workload.group,
                    version,
                    self.namespace,
                    workload.resource,
                )
            else:
                yield partial(
                    custom.list_cluster_custom_object, workload.group, version, workload.resource
                )

    def _versions(self, group: str) -> list[str]:
        """The versions the cluster serves of an API group, the preferred one first: the
        policy names custom kinds without a version, and CRDs move from v1alpha1 to v1."""
        from kubernetes import client as k8s
        from kubernetes.client.exceptions import ApiException

        if self._groups is None:
            self._groups = {}
            try:
                discovery = self.call(k8s.ApisApi(self.cluster.api_client).get_api_versions)
            except ApiException as exc:
                self._discovery_failed = True
                self.problems.append(
                    Problem(
                        "/apis",
                        f"cannot discover the API groups (HTTP {exc.status}): "
                        f"{status_message(exc)}; custom workload kinds not audited",
                    )
                )
                return []
            for entry in discovery.get("groups") or []:
                preferred = (entry.get("preferredVersion") or {}).get("version")
                versions = [v["version"] for v in entry.get("versions") or []]
                self._groups[entry["name"]] = sorted(versions, key=lambda v: v != preferred)
        return self._groups.get(group, [])

    def paginate(self, list_page: Callable[..., Any]) -> Listing:
        """Every page of a list, ``PAGE_SIZE`` items at a time, from one snapshot."""
        from kubernetes.client.exceptions import ApiException

        try:
            return _listing(self.pages(list_page))
        except ApiException as exc:
            if exc.status != 410:
                raise
            # The continue token outlived the API server's snapshot (410 Expired). Start
            # over once for a consistent list rather than mixing snapshots.
            return _listing(self.pages(list_page))

    def pages(
        self, list_page: Callable[..., Any], limit: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """The pages of a list as they arrive, ``limit`` items each (``PAGE_SIZE``), all from
        one snapshot (a continue token that outlived it raises the client's ``ApiException``
        410)."""
        token: str | None = None
        while True:
            page = self.call(list_page, limit=limit or PAGE_SIZE, _continue=token)
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    def call(self, function: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
        """One request, its JSON body as sent (no model round trip that drops fields)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        host = self.cluster.host
        try:
            response = function(
                _request_timeout=(self.cluster.timeout, self.cluster.timeout),  # (connect, read)
                _preload_content=False,
                **kwargs,
            )
        except HTTPError as exc:  # refused, unresolvable, timed out
            reason = getattr(exc, "reason", None) or exc
            raise ClusterError(
                f"cannot reach the Kubernetes API server at {host}: {one_line(reason)}"
            ) from None
        except ApiException as exc:
            if not exc.status:  # the client reports TLS failures as status 0
                raise ClusterError(
                    f"cannot reach the Kubernetes API server at {host}: {one_line(exc.reason)}"
                ) from None
            if exc.status == 401:
                raise ClusterError(
                    f"the Kubernetes API server at {host} refused the credentials (HTTP 401): "
                    f"{status_message(exc)}"
                ) from None
            raise
        try:
            body = _loads(response.data)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            # A proxy or a web server at the kubeconfig's address answers 200 with HTML.
            raise ClusterError(
                f"the server at {host} did not answer as a Kubernetes API server (the body "
                f"of a {response.status} answer is not a JSON object): check the kubeconfig's "
                "server address"
            ) from None
        return body

    def _failure(self, exc: ApiException, workload: WorkloadKind, resource: str) -> str:
        scope = f'in namespace "{self.namespace}"' if self.namespace else "in all namespaces"
        message = status_message(exc)
        if exc.status == 403:
            return (
                f"cannot list {resource} {scope}: forbidden (HTTP 403): {message}; the audit "
                f'needs the "list" permission on {workload.resource} in API group '
                f'"{workload.group}": bind {AUDITOR_ROLE}'
            )
        return f"cannot list {resource} {scope}: HTTP {exc.status} {exc.reason}: {message}"


def selector_text(selector: Any) -> str:
    """A LabelSelector (``matchLabels``, ``matchExpressions``) as a list request's
    ``labelSelector``: ``app=x,tier in (a,b),!gone`` ("" selects everything)."""
    selector = selector if isinstance(selector, dict) else {}
    labels = selector.get("matchLabels")
    parts = [f"{k}={v}" for k, v in (labels.items() if isinstance(labels, dict) else ())]
    for expr in selector.get("matchExpressions") or ():
        if not isinstance(expr, dict):
            continue
        key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values") or ()
        if operator in ("In", "NotIn"):
            parts.append(f"{key} {operator.lower()} ({','.join(map(str, values))})")
        elif operator in ("Exists", "DoesNotExist"):
            parts.append(f"{'' if operator == 'Exists' else '!'}{key}")
    return ",".join(parts)


def _uid(item: dict[str, Any]) -> str:
    return str((item.get("metadata") or {}).get("uid") or "")


def _listing(pages: Iterator[dict[str, Any]]) -> Listing:
    items: list[dict[str, Any]] = []
    page: dict[str, Any] = {}
    for page in pages:
        items.extend(page.get("items") or [])
    version = (page.get("metadata") or {}).get("resourceVersion")
    return Listing(items, page.get("apiVersion", ""), str(version or ""))


# The API server stores objects nested far deeper than Python's recursion limit lets json
# decode (a custom resource's preserved fields): one such object must not hide a whole list.
DEEP_JSON_RECURSION = 25_000


def _loads(data: bytes) -> Any:
    # orjson decodes a page of 50 Nodes (450 KB) in 0.77 ms where the standard library takes
    # 1.19: time a server's event loop is held. It refuses what the standard library reads
    # (nesting past 1,024 levels, integers past 64 bits), and those go to the standard library.
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)
    except RecursionError:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, DEEP_JSON_RECURSION))
        try:
            return json.loads(data)
        finally:
            sys.setrecursionlimit(limit)


def status_message(exc: ApiException) -> str:
    """The API server's own words from the Status body, else the HTTP reason."""
    try:
        status = json.loads(exc.body) if exc.body else None
    except ValueError:
        status = None
    message = status.get("message") if isinstance(status, dict) else None
    return one_line(message or exc.reason)
