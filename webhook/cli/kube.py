"""Reaching a cluster from the command line: a kubernetes client from a kubeconfig or from the
in-cluster service account, and one clear line for a file that is no kubeconfig."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

# What the kubernetes client raises for a file that is no kubeconfig (it reads without
# checking): the decoding of a binary file, its YAML parser, its lookups in a YAML list.
KUBECONFIG_ERRORS = (UnicodeDecodeError, yaml.YAMLError, AttributeError, TypeError)


class KubeconfigError(ValueError):
    """No usable Kubernetes configuration; the message names the file."""


def not_a_kubeconfig(kubeconfig: str | None, exc: Exception) -> str:
    """One line for one of ``KUBECONFIG_ERRORS``, naming the file."""
    if isinstance(exc, UnicodeDecodeError):
        problem = "not UTF-8 text"
    elif isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = f"not valid YAML{line}: {getattr(exc, 'problem', None) or 'unreadable'}"
    else:
        problem = " ".join(str(exc).split())
    return f"kubeconfig {kubeconfig or '(default)'}: not a kubeconfig ({problem})"


def api_client(kubeconfig: str | None, context: str | None) -> Any:
    """A client from --kubeconfig/--context, else in-cluster, else the usual kubeconfig."""
    from kubernetes import client as k8s
    from kubernetes import config

    if kubeconfig is not None and not Path(kubeconfig).is_file():
        raise KubeconfigError(f"kubeconfig {kubeconfig} does not exist")
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            return k8s.ApiClient()
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except config.ConfigException as exc:
        message = " ".join(str(exc).split())
        raise KubeconfigError(f"cannot load Kubernetes configuration: {message}") from None
    except KUBECONFIG_ERRORS as exc:
        raise KubeconfigError(not_a_kubeconfig(kubeconfig, exc)) from None
