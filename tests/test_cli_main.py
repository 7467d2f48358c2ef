"""The command line as a whole: the version, the help texts' paths, what a clone ignores."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib

import pytest
import yaml

from tests.support.paths import REPO
from webhook.cli.common import KUBECTL_PLUGIN_PROG, PROG
from webhook.cli.main import build_parser, main


def project_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_version_and_dash_dash_version_print_the_one_version(capsys) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"gpu-admission {project_version()}\n"
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"gpu-admission {project_version()}\n"


def test_the_installed_command_prints_it_too() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "version"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0 and done.stdout.strip() == f"gpu-admission {project_version()}"


def _parsers(prog: str = PROG) -> dict[str, argparse.ArgumentParser]:
    """Every command's and sub-command's parser, the command named ``prog``."""
    parsers = {}
    pending = [(prog, build_parser(prog))]
    while pending:
        name, parser = pending.pop()
        parsers[name] = parser
        for action in parser._actions:
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):
                pending += [(f"{name} {sub}", p) for sub, p in choices.items()]
    return parsers


def _help_texts() -> dict[str, str]:
    """Every command's and sub-command's help, as printed."""
    return {name: parser.format_help() for name, parser in _parsers().items()}


def test_every_path_in_a_help_text_exists_in_the_repository() -> None:
    texts = _help_texts()
    assert len(texts) > 10
    paths = {
        (command, found)
        for command, text in texts.items()
        for found in re.findall(r"\b((?:policies|manifests|tests)/[\w./-]*\w)", text)
    }
    assert paths, "the help texts name no repository path: the test would check nothing"
    missing = sorted((c, p) for c, p in paths if not (REPO / p).exists())
    assert missing == []


def test_every_command_that_reads_a_cluster_takes_the_same_cluster_options() -> None:
    """--kubeconfig and --context come from one place (add_cluster_arguments): the same
    metavar and defaults in every command, a condition (audit's "with --cluster") first."""
    options = {
        name: {
            flag: action
            for action in parser._actions
            for flag in action.option_strings
            if flag in ("--kubeconfig", "--context")
        }
        for name, parser in _parsers().items()
    }
    readers = {name for name, found in options.items() if found}
    assert readers >= {
        "gpu-admission audit",
        "gpu-admission explain",
        "gpu-admission inspect",
        "gpu-admission certs install",
        "gpu-admission cluster check",
        "gpu-admission policy init",
        "gpu-admission webhooks bootstrap",
        "gpu-admission webhooks activate",
        "gpu-admission webhooks deactivate",
    }
    for name in readers:
        kubeconfig, context = options[name]["--kubeconfig"], options[name]["--context"]
        assert kubeconfig.metavar == "PATH", name
        assert str(kubeconfig.help).endswith(
            "the kubeconfig file (default: $KUBECONFIG, then in-cluster, then ~/.kube/config)"
        ), name
        assert str(context.help).endswith("the kubeconfig context (default: its current one)")
    assert str(options["gpu-admission audit"]["--context"].help).startswith("with --cluster: ")


def test_as_the_kubectl_plugin_the_examples_name_kubectl_gpu_admission() -> None:
    # Before: `kubectl gpu-admission review --help` ended with examples of `gpu-admission ...`.
    command_line = re.compile(
        r"^\s*(?:[A-Z_]+=\S*\s+)*gpu-admission |\| gpu-admission |`gpu-admission "
    )
    plugin = {name: p.format_help() for name, p in _parsers(KUBECTL_PLUGIN_PROG).items()}
    plain = _help_texts()
    assert len(plugin) == len(plain)
    as_typed = 0
    for name, text in plugin.items():
        assert not [line for line in text.splitlines() if command_line.search(line)], name
        assert "kubectl kubectl" not in text, name
        as_typed += text.count("kubectl gpu-admission ") - text.count(
            "usage: kubectl gpu-admission "
        )
    assert as_typed > 100
    # Run as gpu-admission, the examples are as written; names that are no command stay.
    assert "\n  gpu-admission review -f pod.yaml " in plain["gpu-admission"]
    assert "\n  kubectl gpu-admission review -f pod.yaml " in plugin["kubectl gpu-admission"]
    bootstrap = plugin["kubectl gpu-admission webhooks bootstrap"]
    assert "  kubectl gpu-admission webhooks bootstrap --namespace gpu-admission " in bootstrap
    serve = plugin["kubectl gpu-admission serve"]
    assert "GPU_ADMISSION_KEY=/tls/tls.key kubectl gpu-admission serve" in serve


@pytest.mark.parametrize(
    "generated",
    ["certs/ca.key", "certs/tls.crt", "certs/prod/ca.key", "certs/prod/tls.key", "certs/x/y.pem"],
)
def test_every_generated_certificate_and_key_is_ignored_by_git(generated: str) -> None:
    done = subprocess.run(["git", "check-ignore", "-q", generated], cwd=REPO)
    assert done.returncode == 0, f"{generated} would show up as untracked"


def test_the_manifests_run_the_image_of_this_version() -> None:
    kustomization = yaml.safe_load((REPO / "manifests" / "base" / "kustomization.yaml").read_text())
    [image] = kustomization["images"]
    assert image["newTag"] == project_version()
