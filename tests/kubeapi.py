"""A small fake Kubernetes API server for tests, speaking real API shapes over HTTPS.

Tests of code that uses the real ``kubernetes`` client (``certs install``, the audit
commands) point the client at this server instead of mocking the client: requests go
through the client's serialization, content types, TLS verification and error handling.

Only the standard library serves (``ThreadingHTTPServer`` on 127.0.0.1, port 0); TLS uses
a certificate made by ``webhook.certs.pki.generate`` for 127.0.0.1 and localhost.

Use it from a test module by importing the fixtures (pytest finds them by name)::

    from kubeapi import kube_api, kube_api_client  # noqa: F401

    def test_something(kube_api, kube_api_client):
        kube_api.add({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": "p", "namespace": "ns"}})
        pods = kubernetes.client.CoreV1Api(kube_api_client).list_pod_for_all_namespaces()

Or without pytest: ``with FakeKubeAPI() as api: client = api.api_client()``.

What it serves, for any resource type (built-in ones are known; others are registered by
``add`` or ``register``):

- ``GET`` a list, cluster-wide or per namespace, with ``limit``/``continue`` pagination,
  ``labelSelector`` and ``fieldSelector`` (equality and set-based forms);
- ``GET`` a list with ``watch=true``: a chunked stream of JSON events, one per line, as
  kube-apiserver sends them (below: Watches);
- ``GET``/``POST``/``PUT``/``PATCH``/``DELETE`` of one object; PATCH understands JSON patch
  (``application/json-patch+json``), JSON merge patch, and strategic merge patch (applied
  as a merge patch, which is exact for the objects the tests use), and server-side apply;
- ``Status`` objects for 400/403/404/409/410/415/422 as the real API server words them;
- a resource type that is neither built in nor registered answers 404 as kube-apiserver
  does for a CRD that is not installed (below), and so does a group/version that
  ``set_served`` stops serving (``resource.k8s.io/v1`` before Kubernetes 1.34);
- injected failures: ``forbid(path)`` answers 403, ``fail(path, status)`` answers any status
  (``expire_continue()`` gives the 410 ``Expired`` of a stale continue token);
- ``requests``: every request received, in order, with its parsed body.

Watches. Every change to an object (the verbs above, and ``add``, ``replace``, ``remove``)
is an event with the object's new resourceVersion (a deletion gets one too, as in etcd). A
watch from ``resourceVersion`` R sends the resource type's events after R, in order, then
waits for more; from ``0`` or none it first sends every object as ``ADDED``. Objects in
events carry ``apiVersion`` and ``kind``. With ``allowWatchBookmarks=true`` it sends a
``BOOKMARK`` (an object with only ``kind``, ``apiVersion`` and
``metadata.resourceVersion``: the latest) every ``bookmark_seconds``. It ends after
``timeoutSeconds`` (the chunked stream's end, as a server-side timeout does), when
``close_watches()`` is called (an API server restart), or at once with an ``ERROR`` event
holding a 410 ``Expired`` Status when R is older than what ``compact()`` kept (etcd's
compaction: the client must list again). Label and field selectors filter the events'
objects (simplification: the real server turns an object that stops matching into
``DELETED``).

Server-side apply (``PATCH`` with ``Content-Type: application/apply-patch+yaml``, a YAML or
JSON body; ``fieldManager`` is required, ``force`` optional). With the ``kubernetes`` client
(37.x takes a dict body, not text, and sends it as JSON, which is YAML)::

    response = kubernetes.client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        "wgpolicyk8s.io", "v1alpha2", namespace, "policyreports", name, report,
        field_manager="gpu-admission", force=True,
        _content_type="application/apply-patch+yaml", _preload_content=False,
    )  # patch_cluster_custom_object(group, version, plural, name, body, ...) likewise
    stored = json.loads(response.data)  # response.status: 201 created, 200 otherwise

``_preload_content=False`` matters: the client maps only a 200 answer of these methods to a
body, so an apply that creates the object (201, as the real server answers) returns None.
Without ``_content_type`` the client sends a JSON merge patch, and ``force`` is then refused
with 422 as the real server does. What apply does here, as kube-apiserver does it
(k8s.io/apiserver pkg/endpoints/handlers/patch.go, k8s.io/apimachinery
pkg/util/managedfields):

- a missing object is created, answering 201 Created (an update answers 200);
- 422 ``Invalid`` without ``fieldManager``; 400 when apiVersion/kind of the body are not those
  of the URL (``invalid object type: <group>/<version>, Kind=<kind>``), when
  ``metadata.name`` is not the URL's, or when the body carries ``metadata.managedFields``;
- an existing object becomes: itself, less the fields this manager applied last time and
  applies no more (unless another apply manager owns them; a parent map left empty goes
  too), with the applied configuration merged in: maps are merged key by key, lists and
  scalars replaced whole. Simplification: the real server merges by the type's schema
  (lists with ``x-kubernetes-list-type: map``/``set`` item by item, ``x-kubernetes-map-type:
  atomic`` maps replaced whole); CRD lists are atomic unless marked, so report objects merge
  the same way, except Kyverno's ``scope`` (an atomic map) which is merged here. Null
  values in the configuration are dropped;
- ``metadata.managedFields`` holds one ``operation: Apply`` entry per manager (``fieldsV1``
  of the applied leaves; a list is one leaf). A field another apply manager owns with a
  different value is a 409 conflict, worded as the real one, unless ``force=true`` takes it
  over. PUT and the other patches record no managers (the real server records ``Update``
  entries);
- an apply that changes nothing keeps the resourceVersion (and the entry's time), as the
  real storage skips a write of identical bytes; anything else bumps it.

Unserved resources: for a path under a built-in group/version (``/api/v1/things``) the
server's router answers a 404 ``Status`` ("the server could not find the requested
resource", ``details: {}``, k8s.io/apiserver pkg/server/handler.go). A group/version/resource
no CRD serves falls through to the end of the handler chain (k8s.io/apiextensions-apiserver
pkg/apiserver/customresource_handler.go -> k8s.io/apiserver
pkg/util/notfoundhandler/not_found_handler.go), which in every release through 1.36 and in
1.37.0-beta.0 is ``http.NotFound``: status 404, ``text/plain; charset=utf-8``, body ``404 page
not found``; the client raises ``ApiException(status=404, reason="Not Found")`` with that
body, which is not JSON. kubernetes/kubernetes#138219 (merged later) makes it a ``Status``
with reason ``NotFound``, message "the server could not find the requested resource" and no
details; ``FakeKubeAPI(json_not_found=True)`` answers so. DELETE of a custom resource answers
the generic registry's ``Status`` (``status: Success``, details name/group/kind=plural/uid).
"""

from __future__ import annotations

import base64
import bisect
import copy
import fnmatch
import http.server
import json
import re
import secrets
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonpatch
import pytest
import yaml

from webhook.certs import pki

ADMISSION = "admissionregistration.k8s.io"

# (group, version, plural) -> (Kind, namespaced). Items of lists of these built-in types
# carry no apiVersion/kind, as with the real API server; custom resources keep them.
BUILTIN: dict[tuple[str, str, str], tuple[str, bool]] = {
    ("", "v1", "pods"): ("Pod", True),
    ("", "v1", "secrets"): ("Secret", True),
    ("", "v1", "configmaps"): ("ConfigMap", True),
    ("", "v1", "services"): ("Service", True),
    ("", "v1", "serviceaccounts"): ("ServiceAccount", True),
    ("", "v1", "resourcequotas"): ("ResourceQuota", True),
    ("", "v1", "limitranges"): ("LimitRange", True),
    ("", "v1", "namespaces"): ("Namespace", False),
    ("", "v1", "nodes"): ("Node", False),
    ("apps", "v1", "deployments"): ("Deployment", True),
    ("apps", "v1", "statefulsets"): ("StatefulSet", True),
    ("apps", "v1", "daemonsets"): ("DaemonSet", True),
    ("apps", "v1", "replicasets"): ("ReplicaSet", True),
    ("batch", "v1", "jobs"): ("Job", True),
    ("batch", "v1", "cronjobs"): ("CronJob", True),
    (ADMISSION, "v1", "validatingwebhookconfigurations"): ("ValidatingWebhookConfiguration", False),
    (ADMISSION, "v1", "mutatingwebhookconfigurations"): ("MutatingWebhookConfiguration", False),
    ("scheduling.k8s.io", "v1", "priorityclasses"): ("PriorityClass", False),
    ("node.k8s.io", "v1", "runtimeclasses"): ("RuntimeClass", False),
    # Dynamic Resource Allocation, GA in Kubernetes 1.34 (``set_served`` takes it away, as a
    # cluster before 1.34, or one that switched it off, has it).
    ("resource.k8s.io", "v1", "deviceclasses"): ("DeviceClass", False),
    ("resource.k8s.io", "v1", "resourceclaimtemplates"): ("ResourceClaimTemplate", True),
    ("resource.k8s.io", "v1", "resourceclaims"): ("ResourceClaim", True),
    ("resource.k8s.io", "v1", "resourceslices"): ("ResourceSlice", False),
}

BUILTIN_GROUP_VERSIONS = {(group, version) for group, version, _ in BUILTIN}
APPLY = "application/apply-patch+yaml"
JSON_TYPE = "application/json"
NOT_FOUND_TEXT = "404 page not found\n"  # Go's http.NotFound
UNSERVED = "the server could not find the requested resource"
# What the field manager strips from an applied configuration before it owns its fields.
_NOT_OWNED = {("apiVersion",), ("kind",), ("metadata",)} | {
    ("metadata", key)
    for key in "name namespace uid resourceVersion generation creationTimestamp".split()
    + ["managedFields", "selfLink"]
}

_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "AlreadyExists",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}
EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter, or use the continue token "
    "in this response to retrieve the remainder of the results."
)


def status(
    code: int, message: str, *, reason: str | None = None, details: dict | None = None
) -> dict:
    """A ``Status`` object as the API server sends with every error."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "code": code,
    }
    if code >= 400 or reason:
        body["reason"] = reason or _REASONS.get(code, "Unknown")
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    """Raised inside the server to answer with a Status object."""

    def __init__(self, code: int, message: str, *, reason: str | None = None, **details: Any):
        super().__init__(message)
        details = {k: v for k, v in details.items() if v}  # the API omits empty fields
        self.body = status(code, message, reason=reason, details=details or None)
        self.code = code


@dataclass
class RecordedRequest:
    """One request the fake server received."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text when it was not JSON, or None

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()


@dataclass
class _Rule:
    pattern: str
    method: str | None
    code: int
    reason: str | None
    message: str | None
    remaining: int | None  # None: forever
    only_with_continue: bool = False

    def matches(self, method: str, path: str, query: dict[str, list[str]]) -> bool:
        if self.method is not None and self.method != method:
            return False
        if self.only_with_continue and not query.get("continue"):
            return False
        return fnmatch.fnmatchcase(path, self.pattern)


@dataclass
class _Resource:
    kind: str
    namespaced: bool
    builtin: bool
    objects: dict[tuple[str, str], dict] = field(default_factory=dict)  # (ns, name) -> obj
    # (resourceVersion, type, object) of every change since the last compact(), in order.
    events: list[tuple[int, str, dict]] = field(default_factory=list)
    compacted: int = 0  # events at or before this resourceVersion are gone
    # The keys of ``objects`` in the order lists give them, kept until a key comes or goes:
    # a page of 500 is then a slice, not a sort of every object (150,000 Pods, 300 pages).
    sorted_keys: list[tuple[str, str]] | None = None

    def keys_in_order(self) -> list[tuple[str, str]]:
        if self.sorted_keys is None:
            self.sorted_keys = sorted(self.objects)
        return self.sorted_keys


@dataclass(frozen=True)
class _Serialized:
    """An answer already written as JSON (a list page served again: ``_list``)."""

    body: bytes


@dataclass(frozen=True)
class _Watch:
    """A watch request, answered by streaming (``_Handler``)."""

    target: _Target
    resource: _Resource
    query: dict


@dataclass(frozen=True)
class _Target:
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


class FakeKubeAPI:
    """The fake API server; start it with ``with FakeKubeAPI() as api:`` or ``start()``."""

    def __init__(
        self, *, tls: bool = True, cert_dir: str | Path | None = None, json_not_found: bool = False
    ) -> None:
        self.tls = tls
        self.json_not_found = json_not_found  # see the module docstring: Unserved resources
        self.requests: list[RecordedRequest] = []
        self._lock = threading.RLock()
        self._resources: dict[tuple[str, str, str], _Resource] = {
            key: _Resource(kind, namespaced, builtin=True)
            for key, (kind, namespaced) in BUILTIN.items()
        }
        self._rules: list[_Rule] = []
        self._unserved_versions: set[tuple[str, str]] = set()  # (group, version): set_served
        self._resource_version = 1000
        # Wakes watches when an event is recorded, the watches are closed or the server stops.
        self._changed = threading.Condition(self._lock)
        self._watch_generation = 0
        self._stopping = False
        self.bookmark_seconds = 1.0
        # List pages as written, by request and by the resourceVersion they were read at: a
        # client that lists thousands of objects again (a relist) costs the fake server what
        # it costs kube-apiserver, which answers from its watch cache, not a re-serialisation.
        self._pages: dict[tuple[Any, ...], _Serialized] = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._cert_dir = Path(cert_dir) if cert_dir is not None else None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeKubeAPI:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.api = self
        if self.tls:
            if self._cert_dir is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="fake-kube-api-")
                self._cert_dir = Path(self._tmp.name)
            if not (self._cert_dir / pki.TLS_CERT).exists():
                pki.generate(
                    self._cert_dir,
                    service="kubernetes",
                    namespace="default",
                    hosts=["127.0.0.1", "localhost"],
                )
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self._cert_dir / pki.TLS_CERT, self._cert_dir / pki.TLS_KEY)
            server.ssl_context = context
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self._cert_dir = None

    def __enter__(self) -> FakeKubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "the fake API server is not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def ca_cert(self) -> Path | None:
        """The CA that signed the server certificate (None without TLS)."""
        return self._cert_dir / pki.CA_CERT if self.tls and self._cert_dir else None

    # ------------------------------------------------------------------ clients

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this server, verifying its certificate."""
        from kubernetes import client as k8s

        configuration = k8s.Configuration(
            host=self.url,
            ssl_ca_cert=str(self.ca_cert) if self.ca_cert else None,
            api_key={"BearerToken": "fake-token"},
            api_key_prefix={"BearerToken": "Bearer"},
            retries=0,
        )
        return k8s.ApiClient(configuration)

    def write_kubeconfig(
        self,
        path: str | Path,
        *,
        context: str = "fake",
        namespace: str = "default",
        token: str = "fake-token",
    ) -> Path:
        """Write a kubeconfig whose current context is this server; return its path."""
        cluster: dict[str, Any] = {"server": self.url}
        if self.ca_cert:
            cluster["certificate-authority"] = str(self.ca_cert)
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": cluster}],
            "users": [{"name": context, "user": {"token": token}}],
            "contexts": [
                {
                    "name": context,
                    "context": {"cluster": context, "user": context, "namespace": namespace},
                }
            ],
            "current-context": context,
        }
        target = Path(path)
        target.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        target.chmod(0o600)
        return target

    # ------------------------------------------------------------------ state

    def register(
        self, group: str, version: str, plural: str, kind: str, *, namespaced: bool = True
    ) -> None:
        """Make a resource type known (listing it then answers an empty list, not 404)."""
        with self._lock:
            self._resources.setdefault(
                (group, version, plural), _Resource(kind, namespaced, builtin=False)
            )

    def add(self, obj: dict, *, plural: str | None = None) -> dict:
        """Seed an object (apiVersion, kind, metadata.name required); return the stored copy.

        The plural is inferred for built-in kinds and by English rules otherwise; pass it for
        custom resources whose plural is irregular. Cluster-scoped unless the object has a
        metadata.namespace (or the type is a known namespaced one).
        """
        api_version = obj["apiVersion"]
        group, _, version = api_version.rpartition("/")
        kind = obj["kind"]
        plural = plural or _plural_of(group, version, kind)
        namespace = obj.get("metadata", {}).get("namespace")
        with self._lock:
            resource = self._resources.get((group, version, plural))
            if resource is None:
                resource = _Resource(kind, namespaced=namespace is not None, builtin=False)
                self._resources[(group, version, plural)] = resource
            if resource.namespaced and not namespace:
                raise ValueError(f"{kind} {obj['metadata']['name']} needs a namespace")
            stored = self._prepare_new(copy.deepcopy(obj), resource, namespace)
            key = (stored["metadata"].get("namespace", ""), stored["metadata"]["name"])
            self._put(resource, key, stored, "ADDED")
            return copy.deepcopy(stored)

    def add_all(self, objects: Iterable[dict]) -> None:
        for obj in objects:
            self.add(obj)

    def get(self, path: str) -> dict | None:
        """The stored object at an API path (e.g. ``/api/v1/namespaces/ns/secrets/x``)."""
        target = _parse_path(path)
        if target is None or target.name is None:
            raise ValueError(f"{path} is not the path of one object")
        with self._lock:
            resource = self._resources.get((target.group, target.version, target.plural))
            if resource is None:
                return None
            obj = resource.objects.get((target.namespace or "", target.name))
            return copy.deepcopy(obj) if obj is not None else None

    def items(self, path: str) -> list[dict]:
        """Every stored object of a resource type, at its collection path across namespaces
        (``/apis/wgpolicyk8s.io/v1alpha2/policyreports``)."""
        target = _parse_path(path)
        if target is None or target.name is not None:
            raise ValueError(f"{path} is not the path of a collection")
        with self._lock:
            resource = self._resources.get((target.group, target.version, target.plural))
            objects = resource.objects.values() if resource is not None else ()
            return [copy.deepcopy(o) for o in objects]

    def replace(self, obj: dict, *, plural: str | None = None) -> dict:
        """Store a new version of an object that exists (a controller's or a user's update),
        with a new resourceVersion."""
        group, _, version = obj["apiVersion"].rpartition("/")
        plural = plural or _plural_of(group, version, obj["kind"])
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        with self._lock:
            resource = self._resources[(group, version, plural)]
            existing = resource.objects[key]
            stored = copy.deepcopy(obj)
            stored["metadata"] = {**existing["metadata"], **stored["metadata"]}
            stored["metadata"]["resourceVersion"] = self._next_resource_version()
            self._put(resource, key, stored, "MODIFIED")
            return copy.deepcopy(stored)

    def remove(self, path: str) -> None:
        """Delete the object at an API path, as if someone deleted it."""
        target = _parse_path(path)
        if target is None or target.name is None:
            raise ValueError(f"{path} is not the path of one object")
        with self._lock:
            resource = self._resources[(target.group, target.version, target.plural)]
            self._delete(resource, (target.namespace or "", target.name))

    def serve_discovery(self, groups: dict[str, list[str]]) -> None:
        """Answer ``GET /apis`` (API group discovery, not served by default) with these
        groups and their versions, the first one preferred."""
        dispatch = self._dispatch

        def with_discovery(method, path, query, headers, body, raw):  # noqa: ANN001, ANN202
            if method == "GET" and path == "/apis":
                return {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": name,
                            "versions": [
                                {"groupVersion": f"{name}/{v}", "version": v} for v in versions
                            ],
                            "preferredVersion": {
                                "groupVersion": f"{name}/{versions[0]}",
                                "version": versions[0],
                            },
                        }
                        for name, versions in groups.items()
                    ],
                }
            return dispatch(method, path, query, headers, body, raw)

        self._dispatch = with_discovery  # type: ignore[method-assign]

    def set_served(self, group: str, version: str, served: bool) -> None:
        """Serve a group/version, or not: not served, every path under it answers the 404 of
        one that is not installed (module docstring: Unserved resources), as
        ``resource.k8s.io/v1`` does before Kubernetes 1.34 or switched off with the API
        server's ``--runtime-config``. Its objects are kept for when it is served again."""
        with self._lock:
            if served:
                self._unserved_versions.discard((group, version))
            else:
                self._unserved_versions.add((group, version))

    def forbid(self, path: str, *, method: str | None = None) -> None:
        """Answer 403 Forbidden to requests whose path matches the glob (``*`` spans ``/``)."""
        self._add_rule(_Rule(path, method, 403, None, None, remaining=None))

    def fail(
        self,
        path: str,
        code: int,
        *,
        method: str | None = None,
        reason: str | None = None,
        message: str | None = None,
        times: int | None = 1,
        only_with_continue: bool = False,
    ) -> None:
        """Answer the next ``times`` matching requests (None: all) with a Status of ``code``."""
        self._add_rule(_Rule(path, method, code, reason, message, times, only_with_continue))

    def clear_failures(self) -> None:
        """Forget every injected failure (``forbid``, ``fail``, ``expire_continue``)."""
        with self._lock:
            self._rules.clear()

    def expire_continue(self, path: str = "*", *, times: int | None = 1) -> None:
        """Make list requests that carry a continue token answer 410 Expired."""
        self.fail(
            path,
            410,
            method="GET",
            reason="Expired",
            message=EXPIRED_MESSAGE,
            times=times,
            only_with_continue=True,
        )

    def requests_to(self, method: str | None = None, path: str = "*") -> list[RecordedRequest]:
        """Recorded requests filtered by method and path glob."""
        with self._lock:
            return [
                r
                for r in self.requests
                if (method is None or r.method == method) and fnmatch.fnmatchcase(r.path, path)
            ]

    def _add_rule(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _next_resource_version(self) -> str:
        self._resource_version += 1
        return str(self._resource_version)

    def _prepare_new(self, obj: dict, resource: _Resource, namespace: str | None) -> dict:
        metadata = obj.setdefault("metadata", {})
        if not metadata.get("name"):
            if not metadata.get("generateName"):
                raise ApiError(400, "name or generateName is required", reason="Invalid")
            metadata["name"] = metadata["generateName"] + secrets.token_hex(3)[:5]
        if resource.namespaced:
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        metadata.setdefault("generation", 1)
        metadata["resourceVersion"] = self._next_resource_version()
        _normalize(obj, resource.kind)
        return obj

    # ------------------------------------------------------------------ serving

    def _handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> tuple:
        parts = urlsplit(raw_path)
        path = parts.path.rstrip("/") or "/"
        query = parse_qs(parts.query)
        parsed_body: Any = None
        if body:
            try:
                parsed_body = json.loads(body)
            except ValueError:
                parsed_body = body.decode("utf-8", "replace")
                if headers.get("content-type", "").split(";")[0].strip() == APPLY:
                    try:
                        parsed_body = yaml.load(parsed_body, Loader=_YamlLoader)
                    except yaml.YAMLError:
                        pass
        with self._lock:
            self.requests.append(RecordedRequest(method, path, query, headers, parsed_body))
            try:
                answer = self._dispatch(method, path, query, headers, parsed_body, body)
            except ApiError as exc:
                return exc.code, exc.body
            return answer if isinstance(answer, tuple) else (200, answer)

    # ------------------------------------------------------------------ watches

    def compact(self) -> None:
        """Forget the events recorded so far, as etcd's compaction does: a watch from an
        older resourceVersion then gets 410 Expired."""
        with self._lock:
            for resource in self._resources.values():
                resource.events.clear()
                resource.compacted = self._resource_version

    def close_watches(self) -> None:
        """End every open watch, as an API server that restarts does."""
        with self._lock:
            self._watch_generation += 1
            self._changed.notify_all()

    def _put(self, resource: _Resource, key: tuple[str, str], obj: dict, kind: str) -> None:
        if key not in resource.objects:
            resource.sorted_keys = None
        resource.objects[key] = obj
        resource.events.append((int(obj["metadata"]["resourceVersion"]), kind, copy.deepcopy(obj)))
        self._changed.notify_all()

    def _delete(self, resource: _Resource, key: tuple[str, str]) -> None:
        gone = copy.deepcopy(resource.objects.pop(key))
        resource.sorted_keys = None
        gone["metadata"]["resourceVersion"] = self._next_resource_version()
        resource.events.append((int(gone["metadata"]["resourceVersion"]), "DELETED", gone))
        self._changed.notify_all()

    def _watch_events(self, watch: _Watch) -> Iterator[dict]:
        """The events of one watch request as they come (see Watches in the docstring)."""
        query = watch.query
        since_raw = query.get("resourceVersion", ["0"])[0] or "0"
        timeout = float(query.get("timeoutSeconds", ["1800"])[0])
        bookmarks = query.get("allowWatchBookmarks", [""])[0] in ("true", "1")
        matches = _event_filter(watch.target, query)
        resource = watch.resource
        deadline = time.monotonic() + timeout
        with self._lock:
            generation = self._watch_generation
            since = int(since_raw)
            if since == 0:
                initial = [o for _, o in sorted(resource.objects.items()) if matches(o)]
                since = self._resource_version
                pending = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in initial]
            elif since < resource.compacted:
                message = f"too old resource version: {since} ({resource.compacted + 1})"
                yield {"type": "ERROR", "object": status(410, message, reason="Expired")}
                return
            else:
                pending = []
            next_bookmark = time.monotonic() + self.bookmark_seconds
        for event in pending:
            yield _with_type(event, watch)
        while True:
            with self._lock:
                events = [
                    {"type": kind, "object": copy.deepcopy(obj)}
                    for rv, kind, obj in resource.events
                    if rv > since and matches(obj)
                ]
                since = max([since, *(rv for rv, _, _ in resource.events if rv > since)])
                now = time.monotonic()
                bookmark = None
                if not events and bookmarks and now >= next_bookmark:
                    next_bookmark = now + self.bookmark_seconds
                    bookmark = {"resourceVersion": str(self._resource_version)}
                    since = max(since, self._resource_version)
                if (
                    not events
                    and bookmark is None
                    and not self._stopping
                    and generation == self._watch_generation
                    and now < deadline
                ):
                    self._changed.wait(min(deadline, next_bookmark) - now)
                    continue
                ended = self._stopping or generation != self._watch_generation
            for event in events:
                yield _with_type(event, watch)
            if bookmark is not None:
                yield {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": watch.resource.kind,
                        "apiVersion": watch.target.api_version,
                        "metadata": bookmark,
                    },
                }
            if ended or time.monotonic() >= deadline:
                return

    def _dispatch(
        self, method: str, path: str, query: dict, headers: dict, body: Any, raw: bytes
    ) -> dict | tuple[int, dict] | _Serialized | _Watch:
        target = _parse_path(path)
        for rule in self._rules:
            if rule.matches(method, path, query) and rule.remaining != 0:
                if rule.remaining is not None:
                    rule.remaining -= 1
                raise self._rule_error(rule, method, target)
        if path == "/version" and method == "GET":
            return {"major": "1", "minor": "34", "gitVersion": "v1.34.0", "platform": "fake"}
        if target is None or (target.group, target.version) in self._unserved_versions:
            raise self._unserved(path)
        resource = self._resources.get((target.group, target.version, target.plural))
        if resource is None or (target.namespace is not None and not resource.namespaced):
            raise self._unserved(path)
        if target.name is None:
            if method == "GET":
                if query.get("watch", [""])[0] in ("true", "1"):
                    return _Watch(target, resource, query)
                return self._list(target, resource, query)
            if method == "POST":
                if resource.namespaced and target.namespace is None:
                    raise ApiError(405, "create needs a namespace in the path")
                return self._create(target, resource, body)
            raise ApiError(405, f"{method} is not supported on a collection")
        if resource.namespaced and target.namespace is None:
            raise self._unserved(path)
        key = (target.namespace or "", target.name)
        existing = resource.objects.get(key)
        content_type = headers.get("content-type", "").split(";")[0].strip()
        if method == "PATCH":
            _check_patch_options(content_type, query)
            if content_type == APPLY:
                return self._apply(target, resource, existing, body, query)
        if existing is None:
            raise ApiError(
                404,
                f'{_qualified(target)} "{target.name}" not found',
                name=target.name,
                group=target.group,
                kind=target.plural,
            )
        if method == "GET":
            return copy.deepcopy(existing)
        if method == "PUT":
            return self._replace(target, resource, existing, body)
        if method == "PATCH":
            return self._patch(target, resource, existing, content_type, body, raw)
        if method == "DELETE":
            self._delete(resource, key)
            if resource.builtin:
                return status(200, "", details={"name": target.name, "kind": target.plural})
            # Custom resources: the generic registry's answer (finalizeDelete), no code/message.
            details = {"name": target.name, "group": target.group, "kind": target.plural}
            details["uid"] = existing["metadata"]["uid"]
            deleted = {k: v for k, v in status(200, "").items() if k not in ("code", "message")}
            return {**deleted, "details": details}
        raise ApiError(405, f"{method} is not supported")

    def _unserved(self, path: str) -> ApiError:
        """The 404 of a path nothing serves (module docstring: Unserved resources)."""
        error = ApiError(404, UNSERVED)
        match = _PATH.match(path)  # served by the router of a built-in group/version?
        group_version = (
            (match["group"] or "", match["version"] or match["core_version"]) if match else None
        )
        if group_version in BUILTIN_GROUP_VERSIONS and group_version not in self._unserved_versions:
            error.body["details"] = {}
        elif not self.json_not_found:
            error.body = NOT_FOUND_TEXT
        return error

    def _rule_error(self, rule: _Rule, method: str, target: _Target | None) -> ApiError:
        if rule.code == 403 and rule.message is None and target is not None:
            verb = _VERBS.get(method, method.lower())
            if method == "GET" and target.name is None:
                verb = "list"
            subject = f'{_qualified(target)} "{target.name}"' if target.name else target.plural
            scope = (
                f' in the namespace "{target.namespace}"'
                if target.namespace
                else " at the cluster scope"
            )
            message = (
                f'{subject} is forbidden: User "system:serviceaccount:test:fake" cannot {verb} '
                f'resource "{target.plural}" in API group "{target.group}"{scope}'
            )
            details = {"group": target.group, "kind": target.plural}
            if target.name:
                details["name"] = target.name
            return ApiError(403, message, reason=rule.reason, **details)
        message = rule.message or f"injected failure ({rule.code})"
        return ApiError(rule.code, message, reason=rule.reason)

    def _list(self, target: _Target, resource: _Resource, query: dict) -> _Serialized:
        key = (
            target,
            tuple(sorted((k, tuple(v)) for k, v in query.items())),
            self._resource_version,
        )
        page = self._pages.get(key)
        if page is None:
            if len(self._pages) > 512:
                self._pages.clear()
            page = self._pages[key] = _Serialized(
                json.dumps(self._list_page(target, resource, query)).encode("utf-8")
            )
        return page

    def _list_page(self, target: _Target, resource: _Resource, query: dict) -> dict:
        keys = resource.keys_in_order()
        low, high = 0, len(keys)
        if target.namespace is not None:  # a namespace's keys are one run of the sorted keys
            low = bisect.bisect_left(keys, (target.namespace,))
            high = bisect.bisect_left(keys, (target.namespace + "\0",))
        token = query.get("continue", [""])[0]
        if token:
            try:
                start = tuple(json.loads(base64.urlsafe_b64decode(token.encode()))["start"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "continue key is not valid", reason="BadRequest") from None
            low = max(low, bisect.bisect_right(keys, start, low, high))
        metadata: dict[str, Any] = {"resourceVersion": str(self._resource_version)}
        limit_raw = query.get("limit", ["0"])[0]
        try:
            limit = int(limit_raw)
        except ValueError:
            raise ApiError(400, f"invalid limit {limit_raw!r}") from None
        if not query.get("labelSelector", [""])[0] and not query.get("fieldSelector", [""])[0]:
            remaining = high - low
            window = keys[low : min(high, low + limit)] if limit > 0 else keys[low:high]
            items = [(key, resource.objects[key]) for key in window]
        else:
            matches = _event_filter(target, query)
            items = [(k, o) for k in keys[low:high] if matches(o := resource.objects[k])]
            remaining = len(items)
        if limit > 0 and remaining > limit:
            items = items[:limit]
            last_key = items[-1][0]
            metadata["remainingItemCount"] = remaining - limit
            next_token = {"v": "meta.k8s.io/v1", "rv": self._resource_version, "start": last_key}
            metadata["continue"] = base64.urlsafe_b64encode(
                json.dumps(next_token).encode()
            ).decode()
        # The page is written as JSON at once (``_list``): its items need not be copies.
        if resource.builtin:
            out_items = [
                {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
                for _, obj in items
            ]
        else:
            out_items = [obj for _, obj in items]
        return {
            "kind": f"{resource.kind}List",
            "apiVersion": target.api_version,
            "metadata": metadata,
            "items": out_items,
        }

    def _create(self, target: _Target, resource: _Resource, body: Any) -> dict:
        obj = self._check_body(target, resource, body)
        name = (obj.get("metadata") or {}).get("name")
        if name and (target.namespace or "", name) in resource.objects:
            raise ApiError(
                409,
                f'{_qualified(target)} "{name}" already exists',
                reason="AlreadyExists",
                name=name,
                group=target.group,
                kind=target.plural,
            )
        for drop in ("uid", "resourceVersion", "creationTimestamp", "generation"):
            obj.get("metadata", {}).pop(drop, None)
        stored = self._prepare_new(obj, resource, target.namespace)
        self._put(resource, (target.namespace or "", stored["metadata"]["name"]), stored, "ADDED")
        return copy.deepcopy(stored)

    def _replace(self, target: _Target, resource: _Resource, existing: dict, body: Any) -> dict:
        obj = self._check_body(target, resource, body)
        if obj.get("metadata", {}).get("name") != target.name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        sent_version = obj["metadata"].get("resourceVersion")
        if sent_version and sent_version != existing["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on {_qualified(target)} "{target.name}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again",
                reason="Conflict",
                name=target.name,
                group=target.group,
                kind=target.plural,
            )
        return self._store_update(target, resource, existing, obj)

    def _patch(
        self,
        target: _Target,
        resource: _Resource,
        existing: dict,
        content_type: str,
        body: Any,
        raw: bytes,
    ) -> dict:
        if isinstance(body, str):
            raise ApiError(400, "the patch is not valid JSON")
        if content_type == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "a JSON patch must be a list of operations")
            try:
                patched = jsonpatch.apply_patch(existing, body)
            except jsonpatch.JsonPatchTestFailed as exc:
                raise ApiError(422, f"the server rejected our request: {exc}") from None
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, f"the server rejected our request: {exc}") from None
        elif content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            if not isinstance(body, dict):
                raise ApiError(400, "a merge patch must be a JSON object")
            patched = _merge_patch(existing, body)
        else:
            raise ApiError(
                415, f"the body of the request was in an unknown format - {content_type}"
            )
        return self._store_update(target, resource, existing, patched)

    def _apply(
        self, target: _Target, resource: _Resource, existing: dict | None, body: Any, query: dict
    ) -> dict | tuple[int, dict]:
        """Server-side apply (module docstring)."""
        if not isinstance(body, dict):
            raise ApiError(400, "error decoding patch: the body is not a YAML or JSON object")
        if (body.get("apiVersion"), body.get("kind")) != (target.api_version, resource.kind):
            group, _, version = str(body.get("apiVersion") or "").rpartition("/")
            kind = body.get("kind") or ""
            raise ApiError(400, f"invalid object type: {group}/{version}, Kind={kind}")
        body = _without_nulls(body)
        metadata = body.get("metadata") or {}
        if metadata.get("managedFields") is not None:
            raise ApiError(400, "metadata.managedFields must be nil")
        if resource.namespaced and metadata.get("namespace", target.namespace) != target.namespace:
            raise ApiError(
                400,
                "the namespace of the provided object does not match the namespace sent on "
                "the request",
            )
        if metadata.get("name", "") != target.name:
            raise ApiError(
                400,
                f"the name of the object ({metadata.get('name', '')}) does not match the name "
                f"on the URL ({target.name})",
            )
        manager, force = query["fieldManager"][0], query.get("force", [""])[0] == "true"
        live = existing or {}
        entries = copy.deepcopy(live.get("metadata", {}).get("managedFields") or [])
        sets = {
            e["manager"]: _paths_of(e.get("fieldsV1") or {})
            for e in entries
            if e.get("operation") == "Apply"
        }
        before = sets.pop(manager, set())
        applied = {p for p in _leaves(body) if p[:2] not in _NOT_OWNED}
        conflicts = sorted(
            (other, path)
            for other, paths in sets.items()
            for path in applied & paths
            if _at(live, path) != _at(body, path)
        )
        if conflicts and not force:
            raise _conflict_error(conflicts)
        for other, path in conflicts:
            sets[other].discard(path)
        obj = copy.deepcopy(live) or {"metadata": {"name": target.name}}
        still_owned = applied.union(*sets.values())
        for path in sorted(before - still_owned, key=len, reverse=True):
            _remove(obj, path)
        _merge_applied(obj, body)
        obj["apiVersion"], obj["kind"] = target.api_version, resource.kind
        unchanged = _unmanaged(obj) == _unmanaged(live)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        managed: list[dict] = []
        mine = {
            "manager": manager,
            "operation": "Apply",
            "apiVersion": target.api_version,
            "time": now,
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields_v1(applied),
        }
        for entry in entries:
            if entry.get("operation") == "Apply":
                if entry["manager"] == manager:
                    mine["time"] = entry.get("time", now) if unchanged else now
                    entry = mine
                elif sets[entry["manager"]]:
                    entry["fieldsV1"] = _fields_v1(sets[entry["manager"]])
                else:
                    continue  # forced out of every field it had
            managed.append(entry)
        if mine not in managed:
            managed.append(mine)
        # A manager that owns nothing has no entry, and an empty list is left out.
        managed = [entry for entry in managed if entry is not mine or applied]
        obj["metadata"]["managedFields"] = managed
        if not managed:
            del obj["metadata"]["managedFields"]
        if existing is None:
            stored = self._prepare_new(obj, resource, target.namespace)
            self._put(resource, (target.namespace or "", target.name or ""), stored, "ADDED")
            return 201, copy.deepcopy(stored)
        if obj == existing:
            return copy.deepcopy(existing)
        return self._store_update(target, resource, existing, obj)

    def _check_body(self, target: _Target, resource: _Resource, body: Any) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        obj = copy.deepcopy(body)
        if obj.get("kind", resource.kind) != resource.kind:
            raise ApiError(400, f"kind {obj.get('kind')!r} does not match {resource.kind!r}")
        obj["kind"] = resource.kind
        obj["apiVersion"] = target.api_version
        body_namespace = (obj.get("metadata") or {}).get("namespace")
        if resource.namespaced and body_namespace and body_namespace != target.namespace:
            raise ApiError(
                400,
                "the namespace of the provided object does not match the namespace sent on "
                "the request",
            )
        return obj

    def _store_update(
        self, target: _Target, resource: _Resource, existing: dict, obj: dict
    ) -> dict:
        metadata = obj.setdefault("metadata", {})
        for immutable in ("name", "uid", "creationTimestamp"):
            metadata[immutable] = existing["metadata"][immutable]
        if resource.namespaced:
            metadata["namespace"] = existing["metadata"]["namespace"]
        obj["kind"] = resource.kind
        obj["apiVersion"] = target.api_version
        _normalize(obj, resource.kind)
        if {k: v for k, v in obj.items() if k != "metadata"} != {
            k: v for k, v in existing.items() if k != "metadata"
        }:
            metadata["generation"] = int(existing["metadata"].get("generation", 1)) + 1
        metadata["resourceVersion"] = self._next_resource_version()
        self._put(resource, (target.namespace or "", target.name or ""), obj, "MODIFIED")
        return copy.deepcopy(obj)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False
    api: FakeKubeAPI
    ssl_context: ssl.SSLContext | None = None

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        # An answer is two writes (head, then body): with Nagle's algorithm the body waits for
        # the client's delayed ACK of the head, 40 ms an answer. Go's servers (kube-apiserver)
        # set TCP_NODELAY on every connection.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            # The handshake runs in the request's thread (finish_request), so a client
            # that never completes it cannot block the accepting thread.
            sock = self.ssl_context.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
        return sock, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            request.settimeout(10)
            try:
                request.do_handshake()
            except OSError:
                return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients closing keep-alive connections are normal; anything else is a bug here.
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError | ssl.SSLError | TimeoutError):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver"
    timeout = 10
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        code, payload = self.server.api._handle(self.command, self.path, headers, body)
        if isinstance(payload, _Watch):
            self._stream(payload)
            return
        text = isinstance(payload, str)  # Go's http.Error: a plain-text 404
        if isinstance(payload, _Serialized):
            data = payload.body
        else:
            data = payload.encode("utf-8") if text else json.dumps(payload).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if text else JSON_TYPE)
        if text:
            self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, watch: _Watch) -> None:
        """A watch: a chunked stream of JSON events, a line each, ended by the last chunk."""
        self.send_response(200)
        self.send_header("Content-Type", JSON_TYPE)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        for event in self.server.api._watch_events(watch):
            line = json.dumps(event).encode("utf-8") + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


# ---------------------------------------------------------------------- helpers

_PATH = re.compile(
    r"^/(?:api/(?P<core_version>[^/]+)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))(?P<rest>/.*)?$"
)


def _with_type(event: dict, watch: _Watch) -> dict:
    """An event's object as a watch sends it: with apiVersion and kind, built-ins too."""
    event["object"].setdefault("apiVersion", watch.target.api_version)
    event["object"].setdefault("kind", watch.resource.kind)
    return event


def _event_filter(target: _Target, query: dict) -> Any:
    label_selector = query.get("labelSelector", [""])[0]
    field_selector = query.get("fieldSelector", [""])[0]
    labels = _label_matcher(label_selector) if label_selector else None
    fields = _field_matcher(field_selector) if field_selector else None

    def matches(obj: dict) -> bool:
        metadata = obj.get("metadata") or {}
        if target.namespace is not None and metadata.get("namespace") != target.namespace:
            return False
        if labels is not None and not labels(metadata.get("labels") or {}):
            return False
        return fields is None or fields(obj)

    return matches


def _parse_path(path: str) -> _Target | None:
    match = _PATH.match(path.rstrip("/"))
    if match is None:
        return None
    group = match["group"] or ""
    version = match["version"] or match["core_version"]
    rest = [p for p in (match["rest"] or "").split("/") if p]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 2:
        return None  # discovery documents and subresources are not served
    return _Target(group, version, rest[0], namespace, rest[1] if len(rest) == 2 else None)


def _qualified(target: _Target) -> str:
    return f"{target.plural}.{target.group}" if target.group else target.plural


def _plural_of(group: str, version: str, kind: str) -> str:
    for (g, v, plural), (known_kind, _) in BUILTIN.items():
        if g == group and v == version and known_kind == kind:
            return plural
    lower = kind.lower()
    if lower.endswith("y") and lower[-2:-1] not in ("a", "e", "i", "o", "u"):
        return lower[:-1] + "ies"
    if lower.endswith(("s", "x", "z", "ch", "sh")):
        return lower + "es"
    return lower + "s"


def _normalize(obj: dict, kind: str) -> None:
    # Secrets: stringData is write-only and lands in data, base64-encoded.
    if kind == "Secret" and "stringData" in obj:
        data = obj.setdefault("data", {}) or {}
        for key, value in (obj.pop("stringData") or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        obj["data"] = data


class _YamlLoader(yaml.SafeLoader):
    """YAML as the API server reads it (sigs.k8s.io/yaml): timestamps stay strings."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _check_patch_options(content_type: str, query: dict) -> None:
    """ValidatePatchOptions (k8s.io/apimachinery pkg/apis/meta/v1/validation)."""
    if content_type == APPLY and not query.get("fieldManager", [""])[0]:
        field, detail = "fieldManager", "Required value: is required for apply patch"
        cause = "FieldValueRequired"
    elif content_type != APPLY and "force" in query:
        field, detail = "force", "Forbidden: may not be specified for non-apply patch"
        cause = "FieldValueForbidden"
    else:
        return
    raise ApiError(
        422,
        f'PatchOptions.meta.k8s.io "" is invalid: {field}: {detail}',
        reason="Invalid",
        group="meta.k8s.io",
        kind="PatchOptions",
        causes=[{"reason": cause, "message": detail, "field": field}],
    )


def _conflict_error(conflicts: list[tuple[str, tuple[str, ...]]]) -> ApiError:
    """An apply conflict as k8s.io/apimachinery pkg/util/managedfields/internal/conflict.go
    words it."""

    def dotted(path: tuple[str, ...]) -> str:
        return "".join(f".{key}" for key in path)

    if len(conflicts) == 1:
        manager, path = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {json.dumps(manager)}: "
        message += dotted(path)
    else:
        lines = []
        for manager in sorted({m for m, _ in conflicts}):
            lines.append(f"conflicts with {json.dumps(manager)}:")
            lines += [f"- {dotted(p)}" for m, p in conflicts if m == manager]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    causes = [
        {"reason": "FieldManagerConflict", "message": f"conflict with {json.dumps(m)}"}
        | {"field": dotted(p)}
        for m, p in conflicts
    ]
    return ApiError(409, message, reason="Conflict", causes=causes)


def _unmanaged(obj: dict) -> dict:
    """The object without metadata.managedFields."""
    metadata = {k: v for k, v in obj.get("metadata", {}).items() if k != "managedFields"}
    return {**obj, "metadata": metadata}


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The paths an applied configuration sets: a map's keys, down to a non-map or {}."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif path:
        yield path


def _fields_v1(paths: Iterable[tuple[str, ...]]) -> dict:
    """FieldsV1 of a set of leaf paths: ``{"f:spec": {"f:x": {}}}``."""
    root: dict = {}
    for path in sorted(paths):
        node = root
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return root


def _paths_of(fields: dict, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The paths of FieldsV1: its leaves, and nodes marked ``"."`` (owned themselves)."""
    found = {path} if path and (not fields or "." in fields) else set()
    for key, child in fields.items():
        if key.startswith("f:"):
            found |= _paths_of(child, (*path, key[2:]))
    return found


_MISSING = object()


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key, _MISSING) if isinstance(obj, dict) else _MISSING
    return obj


def _remove(obj: dict, path: tuple[str, ...]) -> None:
    """Remove the field at ``path`` and the parent maps that it leaves empty."""
    parents = [obj]
    for key in path[:-1]:
        child = parents[-1].get(key)
        if not isinstance(child, dict):
            return
        parents.append(child)
    parents[-1].pop(path[-1], None)
    for depth in range(len(parents) - 1, 0, -1):
        if parents[depth] or path[:depth] == ("metadata",):
            break
        parents[depth - 1].pop(path[depth - 1], None)


def _merge_applied(obj: dict, config: dict, path: tuple[str, ...] = ()) -> None:
    """Merge an applied configuration: maps key by key, anything else replaced whole."""
    for key, value in config.items():
        if (*path, key)[:2] in _NOT_OWNED and (*path, key) != ("metadata",):
            continue  # apiVersion, kind, name, namespace...: the server's or the URL's
        if isinstance(value, dict) and value and isinstance(obj.get(key), dict):
            _merge_applied(obj[key], value, (*path, key))
        else:
            obj[key] = copy.deepcopy(value)


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _split_selector(selector: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


_SET_TERM = re.compile(r"^(?P<key>[^\s!=]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)$")


def _label_matcher(selector: str) -> Any:
    checks = []
    for term in _split_selector(selector):
        set_match = _SET_TERM.match(term)
        if set_match:
            values = {v.strip() for v in set_match["values"].split(",") if v.strip()}
            key, negate = set_match["key"], set_match["op"] == "notin"
            checks.append(
                lambda labels, k=key, vs=values, n=negate: (
                    (labels.get(k) in vs) != n if k in labels else n
                )
            )
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (s.strip() for s in re.split(r"==?", term, maxsplit=1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            absent = term[1:].strip()
            checks.append(lambda labels, k=absent: k not in labels)
        else:
            checks.append(lambda labels, k=term: k in labels)
    return lambda labels: all(check(labels) for check in checks)


def _field_matcher(selector: str) -> Any:
    checks = []
    for term in _split_selector(selector):
        negate = "!=" in term
        key, value = (s.strip() for s in re.split(r"!=|==?", term, maxsplit=1))
        checks.append((key.split("."), value, negate))

    def lookup(obj: Any, dotted: list[str]) -> str:
        for part in dotted:
            obj = obj.get(part) if isinstance(obj, dict) else None
        return "" if obj is None else str(obj)

    return lambda obj: all((lookup(obj, k) == v) != n for k, v, n in checks)


# ---------------------------------------------------------------------- pytest fixtures


@pytest.fixture
def kube_api() -> Iterator[FakeKubeAPI]:
    """A started HTTPS FakeKubeAPI on 127.0.0.1, stopped after the test."""
    with FakeKubeAPI() as api:
        yield api


@pytest.fixture
def kube_api_client(kube_api: FakeKubeAPI) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` for ``kube_api``, closed after the test."""
    api_client = kube_api.api_client()
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture
def kube_api_kubeconfig(kube_api: FakeKubeAPI, tmp_path: Path) -> Path:
    """A kubeconfig file (context ``fake``) pointing at ``kube_api``."""
    return kube_api.write_kubeconfig(tmp_path / "kubeconfig")


@contextmanager
def web_server() -> Iterator[str]:
    """A plain web server, no Kubernetes API server: 200 and a sign-in page to every GET."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body>Please sign in</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
