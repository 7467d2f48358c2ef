"""A connection to a cluster, from one resolution of the Kubernetes configuration.

The order is the one controllers use, the same for every command: ``kubeconfig`` when given,
then ``$KUBECONFIG`` (which may list several files, merged), then the in-cluster service
account (when running in a Pod, and no ``context`` is asked for: a context names a kubeconfig
entry), then ``~/.kube/config``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_TIMEOUT = 30.0  # seconds, per request
# What the kubernetes client raises for a file that is no kubeconfig (it reads without
# checking): the decoding of a binary file, its YAML parser, its lookups in a YAML list.
KUBECONFIG_ERRORS = (UnicodeDecodeError, yaml.YAMLError, AttributeError, TypeError)


class ClusterError(Exception):
    """The work against a cluster cannot go on: no usable configuration, the server
    unreachable or refusing the credentials. The message is one line naming the cause."""


@dataclass(slots=True)
class Cluster:
    """An open connection: the client, the namespace the configuration defaults to, and the
    timeout of every request. Close it (or use it in a ``with`` block) when done."""

    api_client: ApiClient
    namespace: str  # the context's namespace, or the service account's; "default" if none
    timeout: float = DEFAULT_TIMEOUT

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    def close(self) -> None:
        self.api_client.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def connect(
    kubeconfig: str | None = None, context: str | None = None, *, timeout: float = DEFAULT_TIMEOUT
) -> Cluster:
    """Open a connection as the module docstring orders it; :class:`ClusterError` when no
    configuration is found or the one found cannot be loaded."""
    from kubernetes import client as k8s
    from kubernetes import config

    if kubeconfig is not None and not Path(kubeconfig).is_file():
        raise ClusterError(f"kubeconfig {kubeconfig} does not exist")
    # Read at call time: the client reads $KUBECONFIG once, at import.
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None
    in_cluster = kubeconfig is None and context is None and _in_a_pod()
    if kubeconfig is None and not in_cluster:
        home = Path("~/.kube/config").expanduser()
        kubeconfig = str(home) if home.is_file() else None
    configuration = k8s.Configuration()
    try:
        if kubeconfig is None:
            if context is not None:
                raise ClusterError(f"--context {context}: no kubeconfig found")
            config.load_incluster_config(client_configuration=configuration)
            namespace = _service_account_namespace()
        else:
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
            namespace = _context_namespace(kubeconfig, context)
    except config.ConfigException as exc:
        where = kubeconfig or "in-cluster configuration (no kubeconfig found)"
        raise ClusterError(
            f"cannot load Kubernetes configuration from {where}: {one_line(exc)}"
        ) from None
    except KUBECONFIG_ERRORS as exc:
        raise ClusterError(_not_a_kubeconfig(kubeconfig, exc)) from None
    return Cluster(k8s.ApiClient(configuration), namespace, timeout)


def _in_a_pod() -> bool:
    """Whether this process runs in a Pod (the kubelet sets the service's address)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _not_a_kubeconfig(kubeconfig: str | None, exc: Exception) -> str:
    """One line for one of ``KUBECONFIG_ERRORS``, naming the file."""
    if isinstance(exc, UnicodeDecodeError):
        problem = "not UTF-8 text"
    elif isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = f"not valid YAML{line}: {getattr(exc, 'problem', None) or 'unreadable'}"
    else:
        problem = one_line(exc)
    return f"kubeconfig {kubeconfig or '(default)'}: not a kubeconfig ({problem})"


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def _context_namespace(kubeconfig: str, context: str | None) -> str:
    from kubernetes import config

    contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c["name"] == context), current) if context else current
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def _service_account_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text("utf-8").strip() or "default"
    except OSError:
        return "default"
