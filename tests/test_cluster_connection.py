"""``webhook.cluster.connection``: one resolution of the Kubernetes configuration for every
command, in the order controllers use: the given kubeconfig, then ``$KUBECONFIG``, then the
in-cluster service account, then ``~/.kube/config``. Each kubeconfig here names its own
default namespace, so the connection says which one was loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kubeapi import FakeKubeAPI
from webhook.cluster.connection import ClusterError, connect


@pytest.fixture
def kubeconfigs(
    kube_api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Path]:
    """Three kubeconfigs for the fake API server (given, $KUBECONFIG, ~/.kube/config), with
    the environment cleared of every source."""
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return {
        name: kube_api.write_kubeconfig(path, namespace=name)
        for name, path in (
            ("given", tmp_path / "given"),
            ("env", tmp_path / "env"),
            ("home", home / ".kube" / "config"),
        )
    }


def namespace_of(kubeconfig: str | None = None, context: str | None = None) -> str:
    with connect(kubeconfig, context, timeout=5) as cluster:
        assert cluster.timeout == 5
        return cluster.namespace


def test_the_given_kubeconfig_comes_first(kubeconfigs, monkeypatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfigs["env"]))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert namespace_of(str(kubeconfigs["given"])) == "given"


def test_kubeconfig_from_the_environment_comes_before_in_cluster(kubeconfigs, monkeypatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfigs["env"]))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert namespace_of() == "env"


def test_in_cluster_comes_before_the_home_kubeconfig(kubeconfigs, monkeypatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    # No service account token is mounted here: the in-cluster load is tried, and fails.
    with pytest.raises(ClusterError, match="from in-cluster configuration"):
        connect()


def test_a_context_names_a_kubeconfig_entry_so_in_cluster_is_passed_over(
    kubeconfigs, monkeypatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert namespace_of(context="fake") == "home"


def test_the_home_kubeconfig_comes_last(kubeconfigs) -> None:
    assert namespace_of() == "home"


def test_no_configuration_at_all_is_one_clear_error(kubeconfigs) -> None:
    kubeconfigs["home"].unlink()
    with pytest.raises(ClusterError, match="cannot load Kubernetes configuration"):
        connect()
    with pytest.raises(ClusterError, match="--context prod: no kubeconfig found"):
        connect(context="prod")


def test_a_given_kubeconfig_that_is_missing_or_no_kubeconfig(kubeconfigs, tmp_path) -> None:
    with pytest.raises(ClusterError, match=r"^kubeconfig .*/missing does not exist$"):
        connect(str(tmp_path / "missing"))
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ClusterError, match=r"not a kubeconfig \(not UTF-8 text\)"):
        connect(str(binary))
