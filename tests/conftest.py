"""Fixtures every test module may ask for by name, and the helpers' assertion messages.

- ``kube_api``, ``kube_api_client``, ``kube_api_kubeconfig``: the project's fake API server
  (``tests/kubeapi.py``), which answers real API shapes, with the real kubernetes client on it
  and a kubeconfig file pointing at it.

Helpers are imported by name from ``tests.support`` (paths, kustomize, objects and
AdmissionReviews), ``tests.serving`` (the real server over TLS) and ``tests.kubeapi``.
"""

from __future__ import annotations

import pytest

# The helpers assert too: their failures read like the tests' own.
pytest.register_assert_rewrite("tests.support", "tests.serving")

from tests.kubeapi import kube_api, kube_api_client, kube_api_kubeconfig  # noqa: E402, F401
