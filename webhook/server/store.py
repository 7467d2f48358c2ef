"""The policy in force, reloaded when its file changes on disk.

A policy mounted from a ConfigMap changes by an atomic swap of the ``..data`` symlink: the
path the server was given stays the same, but ``os.stat`` (which follows symlinks) sees a
new inode, mtime and size. The store compares those three with what it saw last, and on a
change compares the content hash too, so a touched or re-mounted but identical file is not
a reload.

A new file that is missing or invalid is refused: the last good policy stays in force, the
refusal is logged once and counted. With no good policy at all (a bad file at start-up) the
store has no policy and the webhook is not ready.

Checks are rate-limited (one ``stat`` per ``check_interval`` at most), so the request path
can call :meth:`PolicyStore.reload_if_changed` on every request. The worker also runs
:meth:`PolicyStore.watch`: one that gets no traffic still moves to the new policy within
about a second, and its metrics and readiness say so.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable

from webhook.policy.load import PolicyError, load_policy
from webhook.policy.model import Policy
from webhook.server.logs import STORE_LOGGER
from webhook.server.metrics import Metrics
from webhook.server.watch import every

log = logging.getLogger(STORE_LOGGER)

# (st_ino, st_mtime_ns, st_size) of the resolved file, or None when it cannot be stat'ed.
_Signature = tuple[int, int, int] | None
_NOT_CHECKED = (-1, -1, -1)


class PolicyStore:
    """Holds the current :class:`Policy` and replaces it when the file changes.

    ``loader`` and ``clock`` are there for tests; ``metrics`` receives the reload counters
    and the policy-info gauge.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        metrics: Metrics | None = None,
        check_interval: float = 1.0,
        loader: Callable[[str], Policy] = load_policy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = os.fspath(path)
        self._metrics = metrics
        self._check_interval = check_interval
        self._loader = loader
        self._clock = clock
        self._lock = threading.Lock()
        self._policy: Policy | None = None
        self._problem: str | None = "no policy loaded yet"
        self._signature: _Signature = _NOT_CHECKED
        self._content_sha256: str | None = None
        self._next_check = float("-inf")
        self.reload_if_changed(force=True)

    @property
    def policy(self) -> Policy | None:
        """The policy in force, or None when no valid policy was ever loaded."""
        return self._policy

    @property
    def problem(self) -> str | None:
        """Why there is no policy in force, or None when there is one."""
        return None if self._policy is not None else self._problem

    def reload_if_changed(self, *, force: bool = False) -> bool:
        """Load the policy file again if it changed; True when a new policy took effect.

        Without ``force`` this returns at once until ``check_interval`` has passed since the
        last check. Concurrent callers do not wait for a reload in progress: they carry on
        with the policy in force.
        """
        now = self._clock()
        if not force and now < self._next_check:
            return False
        if not self._lock.acquire(blocking=force):
            return False
        try:
            self._next_check = now + self._check_interval
            return self._check()
        finally:
            self._lock.release()

    def watch(self) -> threading.Thread:
        """Check for changes every ``check_interval`` in a daemon thread, until exit."""
        return every(
            self._check_interval,
            self.reload_if_changed,
            name="policy-watch",
            log=log,
            failure="policy check failed",
        )

    def _check(self) -> bool:
        try:
            st = os.stat(self.path)
            signature: _Signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            signature = None
        if signature == self._signature:
            return False
        self._signature = signature

        try:
            with open(self.path, "rb") as handle:
                content = handle.read()
        except OSError as exc:
            self._content_sha256 = None
            return self._refuse(f"cannot read policy file {self.path}: {exc.strerror or exc}")
        content_sha256 = hashlib.sha256(content).hexdigest()
        if content_sha256 == self._content_sha256:
            return False
        self._content_sha256 = content_sha256

        try:
            policy = self._loader(self.path)
        except (PolicyError, OSError) as exc:
            return self._refuse(str(exc))
        except Exception as exc:  # a loader bug must not take the last good policy down
            log.exception("policy loader failed")
            return self._refuse(f"cannot load policy file {self.path}: {exc!r}")
        return self._install(policy)

    def _install(self, policy: Policy) -> bool:
        previous = self._policy
        if previous is not None and previous.sha256 == policy.sha256:
            return False
        self._policy = policy
        dropped = 0
        for warning in policy.warnings:
            if warning.level == "info":
                continue  # notes are for whoever reviews the policy, not for the server log
            dropped += warning.level == "error"
            (log.error if warning.level == "error" else log.warning)(
                "policy entry dropped" if warning.level == "error" else "policy lint warning",
                extra={
                    "fields": {
                        "source": policy.source,
                        "line": warning.line,
                        "path": warning.path,
                        "warning": warning.message,
                    }
                },
            )
        if self._metrics is not None:
            self._metrics.set_policy(policy.sha256)
            self._metrics.policy_dropped_entries.set(dropped)
            if previous is not None:
                self._metrics.policy_reloads.inc()
        log.info(
            "policy loaded" if previous is None else "policy reloaded",
            extra={
                "fields": {
                    "source": policy.source,
                    "sha256": policy.sha256,
                    "previous_sha256": previous.sha256 if previous is not None else None,
                }
            },
        )
        return True

    def _refuse(self, reason: str) -> bool:
        self._problem = reason
        if self._metrics is not None:
            self._metrics.policy_reload_errors.inc()
        in_force = self._policy
        log.error(
            "policy refused, keeping the policy in force"
            if in_force is not None
            else "policy refused, no policy in force: not ready",
            extra={
                "fields": {
                    "path": self.path,
                    "error": reason,
                    "sha256_in_force": in_force.sha256 if in_force is not None else None,
                }
            },
        )
        return False
