"""What ``serve`` runs with: the command line's options over the environment over the defaults.

Each option but ``--insecure`` has an environment variable (``--drain-seconds`` and
``GPU_ADMISSION_DRAIN_SECONDS``), so the manifests can configure the server without a command line;
an option given wins. Turning TLS off must be visible in the command, so it has none. The
connection deadlines are tuning knobs with an environment variable only
(``DEADLINE_VARIABLES``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.policy.load import default_policy_path

DEFAULT_BIND = "0.0.0.0:8443"
# One worker per container, scaled by replicas (webhook.server.gunicorn). Under the manifests'
# one-CPU limit (the server pinned to one CPU, make bench --server-cpus 0, 3 runs each), one
# worker served the typical review at 1,934-1,952 req/s with p99 3.3-3.7 ms, two at
# 1,715-1,855 req/s with p99 6.1-6.7 ms: a second worker adds no CPU, only switching between
# processes. --workers, which chose their number before, is accepted and ignored, with a
# warning, so that a Deployment that sets it keeps starting.
WORKERS_IGNORED = (
    "--workers (GPU_ADMISSION_WORKERS) is ignored: the server runs one worker per Pod; "
    "scale with replicas"
)
DEFAULT_DRAIN_SECONDS = 15.0
# After the drain, how long requests already written have to be answered. The API server
# waits for a webhook 30 s at most (10 s by default): a request still running this long after
# the drain has been given up by its caller.
GRACEFUL_TIMEOUT = 20
MUTATION_MODES = ("apply", "record")
# The API server sends at most 3 MiB objects (etcd's limit is 1.5 MiB by default), an
# AdmissionReview of an UPDATE carries two of them: 7 MiB leaves room and bounds memory.
MAX_BODY_BYTES = 7 * 1024 * 1024
# A body this large takes milliseconds to a second to decode and decide: the app has it
# decided in a child process, and a worker reads only a few such bodies at a time.
LONG_BODY_BYTES = 64 * 1024
# A decision's work grows with the items of the review (array elements, object members), not
# its bytes: a small body of thousands of empty containers ({}) or of resource names would
# hold the event loop. Items are counted by the commas between them; a body with this many
# is decided in a child too (a Pod as the API server sends it has a few hundred).
LONG_BODY_ITEMS = 2000
# A template costs several times what a container does to judge (an Argo Workflow of a
# thousand templates fits in 30 KB), and templates share parts (a Workflow's volumes are
# every template's, a TrainJob's trainer is paired with each override): a few kilobytes can
# make a million (template, volume) pairs. An object with more templates, or (of more than
# one template) more to judge in them all, is decided in a child too (see
# webhook.admission.engine.WorkLimits; a Workflow of 20 small templates holds about 1,000).
INLINE_TEMPLATES = 400
INLINE_JUDGED_ITEMS = 1200


@dataclass(frozen=True)
class Deadlines:
    """How long each phase of a connection may take before the connection is closed."""

    handshake: float = 5.0
    headers: float = 5.0
    body_floor: float = 5.0
    # The slowest upload accepted: a body must arrive at this rate, after the floor.
    body_bytes_per_second: float = 1024 * 1024
    # Longer than the API server's idle timeout (Go's IdleConnTimeout, 90 s). A connection's
    # first request must begin within ``headers`` instead: the API server sends it as soon
    # as the handshake is done.
    idle: float = 120.0
    # Writing a response: a client that does not read it is closed after this.
    write: float = 10.0
    # Open connections per worker; far above the API server's pool (100 per host by default),
    # and what bounds a worker's memory for connections (about 50 KiB each when stalled).
    max_connections: int = 1024

    def body(self, length: int) -> float:
        """The deadline of a body of ``length`` bytes (beyond the limit: the limit's)."""
        return self.body_floor + min(length, MAX_BODY_BYTES) / self.body_bytes_per_second


# Deadlines field -> the environment variable that sets it.
DEADLINE_VARIABLES = {
    "handshake": "GPU_ADMISSION_HANDSHAKE_TIMEOUT",
    "headers": "GPU_ADMISSION_HEADERS_TIMEOUT",
    "body_floor": "GPU_ADMISSION_BODY_TIMEOUT",
    "idle": "GPU_ADMISSION_IDLE_TIMEOUT",
    "write": "GPU_ADMISSION_WRITE_TIMEOUT",
    "max_connections": "GPU_ADMISSION_MAX_CONNECTIONS",
}


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the option and its variable."""


@dataclass(frozen=True)
class ServeSettings:
    """What ``serve`` runs with, after command line, environment and defaults are merged."""

    policy: str
    cert: str | None
    key: str | None
    bind: str
    insecure: bool
    drain_seconds: float
    mutation: str
    deadlines: Deadlines = field(default_factory=Deadlines)
    # Keep an inventory of the cluster's Nodes (webhook.server.inventory): opt-in.
    inventory: bool = False
    # Said in the log at start-up: settings accepted but no longer used.
    warnings: tuple[str, ...] = ()


def resolve_settings(options: Mapping[str, Any], environ: Mapping[str, str]) -> ServeSettings:
    """Merge the command line's ``options`` (``policy``, ``cert``, ``key``, ``bind``,
    ``drain_seconds``, ``mutation``, ``inventory``, ``workers`` (ignored): None when not
    given; ``insecure``) over the environment over the defaults, and check the result."""

    def pick(value: Any, variable: str) -> Any:
        if value is not None:
            return value
        from_env = environ.get(variable)
        return from_env if from_env not in (None, "") else None

    def number(
        value: Any, option: str, variable: str, convert: Callable[[str], Any], default: Any
    ) -> Any:
        raw = pick(value, variable)
        if raw is None:
            return default
        try:
            return convert(raw)
        except ValueError:
            raise SettingsError(f"{option} ({variable}): expected a number, got {raw!r}") from None

    warnings: tuple[str, ...] = ()
    if pick(options.get("workers"), "GPU_ADMISSION_WORKERS") is not None:
        warnings = (WORKERS_IGNORED,)
    drain = number(
        options.get("drain_seconds"),
        "--drain-seconds",
        "GPU_ADMISSION_DRAIN_SECONDS",
        float,
        DEFAULT_DRAIN_SECONDS,
    )
    if not 0 <= drain < float("inf"):
        raise SettingsError(
            f"--drain-seconds (GPU_ADMISSION_DRAIN_SECONDS) must be 0 or more, got {drain}"
        )
    mutation = (pick(options.get("mutation"), "GPU_ADMISSION_MUTATION") or "apply").lower()
    if mutation not in MUTATION_MODES:
        raise SettingsError(
            f"--mutation (GPU_ADMISSION_MUTATION) must be apply or record, got {mutation!r}"
        )

    defaults = Deadlines()
    deadlines = {}
    for name, variable in DEADLINE_VARIABLES.items():
        convert = int if name == "max_connections" else float
        value = number(None, variable, variable, convert, getattr(defaults, name))
        if not 0 < value < float("inf"):
            raise SettingsError(f"{variable} must be more than 0, got {value}")
        deadlines[name] = value

    inventory_raw = pick(options.get("inventory"), "GPU_ADMISSION_INVENTORY")
    if inventory_raw is None or isinstance(inventory_raw, bool):
        inventory = bool(inventory_raw)
    elif str(inventory_raw).lower() in ("true", "1", "yes"):
        inventory = True
    elif str(inventory_raw).lower() in ("false", "0", "no"):
        inventory = False
    else:
        raise SettingsError(
            f"--inventory (GPU_ADMISSION_INVENTORY) must be true or false, got {inventory_raw!r}"
        )

    insecure = bool(options.get("insecure"))
    cert = pick(options.get("cert"), "GPU_ADMISSION_CERT")
    key = pick(options.get("key"), "GPU_ADMISSION_KEY")
    if not insecure and not (cert and key):
        raise SettingsError("--cert and --key are required (or --insecure for plain HTTP)")

    return ServeSettings(
        policy=pick(options.get("policy"), "GPU_ADMISSION_POLICY") or str(default_policy_path()),
        cert=None if insecure else cert,
        key=None if insecure else key,
        bind=pick(options.get("bind"), "GPU_ADMISSION_BIND") or DEFAULT_BIND,
        insecure=insecure,
        drain_seconds=drain,
        mutation=mutation,
        deadlines=Deadlines(**deadlines),
        inventory=inventory,
        warnings=warnings,
    )
