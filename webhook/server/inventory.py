"""The opt-in node inventory of a replica: what the worker knows of the cluster's Nodes (and,
where tenants select namespaces by label, of its Namespaces' labels), and of its DeviceClasses
and ResourceClaimTemplates (``webhook.core.dra_inventory``).

Off unless ``--inventory`` (``GPU_ADMISSION_INVENTORY=true``) is given, and then the
webhook's ServiceAccount needs list and watch on nodes, namespaces, and on deviceclasses and
resourceclaimtemplates of ``resource.k8s.io`` (the chart's ``inventory.enabled``, the
kustomize overlay ``manifests/overlays/inventory``). The worker owns it: it starts one
process of its own (``python -m webhook.cli.node_feed``, ``webhook.server.node_feed``) that
lists and watches the Nodes at a lower priority, and reads from it only what is kept of each
Node as it changes, in lines of at most 100 Nodes with a turn for the connections after each.
Reading, decoding and keeping a list of 5,000 Nodes (about 50 MB of JSON) is half a second of
CPU: never on the worker's event loop. The process ends with the worker (its standard input closes).

What is kept of a Node depends on the policy (its pools' label keys, its vendor domains): a
policy that changes them starts a new process, and readers keep the Nodes they had until it
has listed. A process that ends is started again, with a backoff. Readers get an immutable
snapshot (:class:`~webhook.core.inventory.NodeSnapshot`) and never wait on the API server;
there is none before the first list, while its process is replaced and once the API server
has not been heard from for two minutes: decisions are then what they are without an
inventory. The DRA objects never hold the Nodes up: a DRA kind not known (not listed yet,
refused, or its watch not heard from for two minutes) finds nothing in the snapshot
(``knows_device_classes``, ``knows_claim_templates``), and its failures are logged apart.
Readiness never depends on it. Metrics: ``gpu_admission_inventory_nodes``,
``gpu_admission_inventory_age_seconds`` (since the API server was last heard from, or since
start before the first list) and ``gpu_admission_inventory_watch_restarts_total`` (lists
after the first, watches started again after a failure, and processes started again).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import IO, Any

import orjson

from webhook.cluster.watching import Key
from webhook.core.dra_inventory import NO_DRA_OBJECTS, DeviceClassRecord, DraObjects
from webhook.core.inventory import NodeFields, NodeInfo, NodeSnapshot, SharedParts
from webhook.policy.model import Policy
from webhook.server.dra_feed import (
    STALE_SECONDS,
    SharedTemplates,
    claim_template_from_json,
    device_class_from_json,
)
from webhook.server.node_feed import fields_argument, node_from_record

INVENTORY_LOGGER = "webhook.inventory"
log = logging.getLogger(INVENTORY_LOGGER)

FEED_COMMAND = (sys.executable, "-m", "webhook.cli.node_feed")
# How often the inventory looks at the policy (for what it keeps) and at its process (for the
# log, and to replace one that ended).
LOOK_SECONDS = 1.0
RESTART_FIRST_SECONDS = 1.0
RESTART_MAX_SECONDS = 30.0
STOP_SECONDS = 5.0
# What was last logged: listed, and the errors of the Nodes (and Namespaces) and of DRA objects.
Reported = tuple[bool, str | None, str | None]


class _Feed:
    """One inventory process, and what the worker has read from it."""

    def __init__(self, fields: NodeFields, command: Sequence[str], clock: Callable[[], float]):
        self.fields = fields
        self._clock = clock
        self._nodes: dict[str, NodeInfo] = {}
        self._namespaces: dict[str, Mapping[str, str]] = {}  # name -> kept labels
        self._device_classes: dict[str, DeviceClassRecord] = {}
        self._claim_templates: dict[Key, Mapping[str, Any]] = {}  # (namespace, name)
        self._dra = NO_DRA_OBJECTS
        self._shared = SharedParts()
        self._shared_templates = SharedTemplates()
        # Published for readers, each replaced whole: the snapshot once listed, the figures.
        self.snapshot: NodeSnapshot | None = None
        self.listed = False
        self.heard_at: float | None = None
        self.restarts = 0
        self.last_error: str | None = None
        self.dra_error: str | None = None
        self.ended = False
        self._process: subprocess.Popen[bytes] | None = None
        try:
            self._process = subprocess.Popen(
                [*command, fields_argument(fields)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
        except OSError as exc:  # started again after a backoff, as one that ended
            self.last_error = f"cannot start the inventory process: {exc}"
            self.ended = True
            return
        threading.Thread(target=self._read, args=(self._process,), daemon=True).start()

    @property
    def count(self) -> int:
        return len(self._nodes)

    def stop(self) -> None:
        """End the process: its input closes, and it is killed if it lingers."""
        process = self._process
        if process is None:
            return
        try:
            if process.stdin is not None:
                process.stdin.close()
            process.wait(timeout=STOP_SECONDS)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        stdout: IO[bytes] | None = process.stdout
        garbled = ""
        try:
            for line in stdout or ():
                self._apply(orjson.loads(line))
                time.sleep(0)  # a turn for the connections (greenlets) after each line
        except (OSError, ValueError, TypeError, AttributeError) as exc:  # not its protocol
            garbled = f" after it wrote what is not its protocol ({type(exc).__name__}: {exc})"
            process.kill()  # nobody reads it any more: it is started again
        status = process.wait()
        self.last_error = f"the inventory process ended (exit status {status}){garbled}"
        self.ended = True

    def _apply(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        changed = False
        for record in message.get("put") or ():
            node = node_from_record(record, self._shared)
            if node is not None:
                self._nodes[node.name] = node
                changed = True
        for name in message.get("gone") or ():
            changed = self._nodes.pop(str(name), None) is not None or changed
        for record in message.get("namespaces") or ():
            if isinstance(record, list) and len(record) == 2 and isinstance(record[1], dict):
                labels = {str(k): str(v) for k, v in record[1].items()}
                self._namespaces[str(record[0])] = self._shared.mapping(labels)
                changed = True
        for name in message.get("namespacesGone") or ():
            changed = self._namespaces.pop(str(name), None) is not None or changed
        dra_changed = self._apply_dra(message)
        known = (self._dra.knows_device_classes, self._dra.knows_claim_templates)
        state = message.get("state")
        if isinstance(state, dict):
            ago = state.get("heard_ago")
            if isinstance(ago, (int, float)):
                self.heard_at = self._clock() - ago
            self.restarts = int(state.get("restarts") or 0)
            error = state.get("last_error")
            self.last_error = str(error) if error is not None else None
            dra_error = state.get("dra_error")
            self.dra_error = str(dra_error) if dra_error is not None else None
            if state.get("listed") and not self.listed:
                self.listed = changed = True
            was_known = known
            known = (
                state.get("device_classes_known") is True,
                state.get("claim_templates_known") is True,
            )
            dra_changed = dra_changed or known != was_known
        if dra_changed:
            self._dra = DraObjects(
                MappingProxyType(dict(self._device_classes)),
                MappingProxyType(dict(self._claim_templates)),
                *known,
            )
        if changed and self.listed:
            self.snapshot = NodeSnapshot(
                dict(self._nodes), self.fields, dict(self._namespaces), self._dra
            )
        elif dra_changed and self.snapshot is not None:
            self.snapshot = self.snapshot.with_dra(self._dra)

    def _apply_dra(self, message: dict[str, Any]) -> bool:
        """Apply a message's DRA objects; whether any changed."""
        changed = False
        for record in message.get("deviceClasses") or ():
            device_class = device_class_from_json(record)
            if device_class is not None:
                self._device_classes[device_class.name] = device_class
                changed = True
        for name in message.get("deviceClassesGone") or ():
            changed = self._device_classes.pop(str(name), None) is not None or changed
        for record in message.get("claimTemplates") or ():
            template = claim_template_from_json(record, self._shared_templates)
            if template is None:
                continue
            key, kept = template
            if kept is not None:
                self._claim_templates[key] = kept
                changed = True
            else:  # too deep to send: as a template not cached
                changed = self._claim_templates.pop(key, None) is not None or changed
        for key in message.get("claimTemplatesGone") or ():
            if isinstance(key, list) and len(key) == 2:
                gone = self._claim_templates.pop((str(key[0]), str(key[1])), None)
                changed = gone is not None or changed
        return changed


class NodeInventory:
    """The Nodes as the worker knows them (see the module's docstring)."""

    def __init__(
        self,
        policy: Callable[[], Policy | None],
        *,
        command: Sequence[str] = FEED_COMMAND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._command = tuple(command)
        self._clock = clock
        self._started_at = clock()
        # The process readers see, with the restarts of those it replaced: one attribute,
        # replaced whole, so a reader never sees one without the other.
        self._serving: tuple[_Feed | None, int] = (None, 0)
        self._closing = threading.Event()

    def start(self) -> threading.Thread:
        """Run the inventory in a daemon thread, until the process exits."""
        thread = threading.Thread(target=self._run, name="node-inventory", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Stop the inventory and its process (the server never does: they end with it)."""
        self._closing.set()

    def snapshot(self) -> NodeSnapshot | None:
        """What decisions read: the Nodes known now; None before the first list, once the API
        server has not been heard from for ``STALE_SECONDS`` and while the process that
        serves is replaced (a node renamed, relabelled or re-tainted meanwhile would not be
        seen)."""
        feed = self._serving[0]
        if feed is None or feed.ended or feed.heard_at is None:
            return None
        if self._clock() - feed.heard_at > STALE_SECONDS:
            return None
        return feed.snapshot

    def nodes(self) -> Mapping[str, NodeInfo]:
        """The Nodes known now, by name (empty before the first list), stale or not."""
        feed = self._serving[0]
        snapshot = feed.snapshot if feed is not None else None
        return snapshot.nodes if snapshot is not None else {}

    def figures(self) -> tuple[int, float, int]:
        """Nodes known, seconds since the API server was last heard from (since start before
        that), and how many times a list, a watch or the process was started again."""
        feed, restarts_before = self._serving
        if feed is None:
            return 0, self._clock() - self._started_at, restarts_before
        heard = feed.heard_at
        age = self._clock() - (heard if heard is not None else self._started_at)
        return (feed.count if feed.listed else 0), age, restarts_before + feed.restarts

    def _run(self) -> None:
        kept_for: NodeFields | None = None
        # A process started for a new policy, or in place of one that ended: serving once it
        # has listed (until then readers keep the Nodes they had).
        pending: _Feed | None = None
        backoff = RESTART_FIRST_SECONDS
        restart_at: float | None = None
        reported: Reported = (False, None, None)
        while not self._closing.is_set():
            policy = self._policy()
            serving, restarts_before = self._serving
            newest = pending or serving
            if policy is not None and NodeFields.of(policy) != kept_for:
                if pending is not None:
                    pending.stop()  # a newer policy: what that list would keep is stale
                if kept_for is not None:
                    log.info("the policy changed what is kept of a Node: listing Nodes again")
                kept_for = NodeFields.of(policy)
                pending = _Feed(kept_for, self._command, self._clock)
            elif kept_for is not None and newest is not None and newest.ended:
                # Started again after a backoff; readers keep what they have meanwhile.
                if restart_at is None:
                    restart_at = self._clock() + backoff
                elif self._clock() >= restart_at:
                    restart_at, backoff = None, min(backoff * 2, RESTART_MAX_SECONDS)
                    restarts_before += 1  # a process started again
                    self._serving = (serving, restarts_before)
                    pending = _Feed(kept_for, self._command, self._clock)
            if pending is not None and (serving is None or pending.listed):
                if serving is not None:
                    # Its watch's restarts, and the list made again for a new policy (one
                    # made again because it ended is counted already).
                    restarts_before += serving.restarts + (0 if serving.ended else 1)
                    serving.stop()
                self._serving = (pending, restarts_before)
                if pending.listed:
                    backoff = RESTART_FIRST_SECONDS
                pending = None
            reported = self._report(reported)
            self._closing.wait(LOOK_SECONDS)
        for feed in (pending, self._serving[0]):
            if feed is not None:
                feed.stop()

    def _report(self, reported: Reported) -> Reported:
        """Log the first list, and each failure as it starts and ends (not every retry): the
        Nodes' (and Namespaces'), and the DRA objects' apart."""
        feed = self._serving[0]
        if feed is None:
            return reported
        listed, error, dra_error = reported
        if feed.listed and not listed:
            log.info("node inventory listed", extra={"fields": {"nodes": feed.count}})
        if feed.last_error != error:
            if feed.last_error is not None:
                log.warning(
                    "node inventory cannot reach the API server; decisions go on without news",
                    extra={"fields": {"error": feed.last_error}},
                )
            else:
                log.info("node inventory is current again", extra={"fields": {}})
        if feed.dra_error != dra_error:
            if feed.dra_error is not None:
                log.warning(
                    "node inventory cannot list or watch DRA objects (DeviceClasses, "
                    "ResourceClaimTemplates); claims are judged as without an inventory",
                    extra={"fields": {"error": feed.dra_error}},
                )
            else:
                log.info("node inventory lists DRA objects again", extra={"fields": {}})
        return feed.listed, feed.last_error, feed.dra_error
