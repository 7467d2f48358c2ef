"""The layers of ``webhook`` as CONTRIBUTING.md draws them, checked on the source.

Every ``import`` of every module counts, at module level or inside a function: a lazy import
is still a dependency. Imports go down the rank table only; two layers of the same rank do not
import each other; nothing imports the package root (it only re-exports the public API); and
there is no cycle between modules, inside a layer either.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "webhook"

# Lowest first. A module may import its own layer and the layers of lower rank.
RANKS = {
    "policy": 0,  # model, load, lint, compile, names, MIG catalogue, quantities, data
    "core": 1,  # pod views, findings, scheduling semantics, pool selection
    "checks": 2,  # one module per rule and the registry
    "admission": 3,  # the decision: request, engine, mutation plan, JSON Patch, response
    "cluster": 4,  # the Kubernetes configuration, paged lists, ownership, the watch cache
    "server": 5,  # app, gunicorn, TLS, drain, policy store, metrics, logs, node inventory
    "certs": 5,  # pki, install, gitops
    "audit": 5,  # audits of files and clusters, reports, the pre-flight, the suites, drift
    "operations": 6,  # explain a Pending Pod, the daily inspection, a policy from a cluster
    "cli": 7,  # main, common, one module per command, output formats
}
# The layers a decision runs through: no web framework, server, YAML, schema or cluster client.
PURE_LAYERS = ("core", "checks", "admission")
HEAVY_LIBRARIES = (
    "yaml",
    "jsonschema",
    "flask",
    "werkzeug",
    "gunicorn",
    "kubernetes",
    "prometheus_client",
)
# The command modules: registered by webhook.cli.main alone.
COMMANDS = ("serve", "certs", "review", "audit", "policy")
MAX_LINES = 500

Modules = dict[str, Path]


def modules_of(package: Path) -> Modules:
    """Every module of a package, by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = modules_of(PACKAGE)


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports(modules: Modules, module: str, *, typing_only: bool = True) -> list[tuple[str, int]]:
    """Every (imported module, line) of a module; a ``from package import name`` whose name is
    a module of the package counts as an import of that module. ``typing_only`` false leaves
    out the imports under ``if TYPE_CHECKING:``, which never run."""
    path = modules[module]
    tree = ast.parse(path.read_text("utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    skipped = set() if typing_only else {id(n) for n in _typing_only_imports(tree)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((submodule if submodule in modules else base, node.lineno))
    return found


def _typing_only_imports(tree: ast.Module) -> list[ast.stmt]:
    return [
        statement
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
        for statement in node.body
        if isinstance(statement, ast.Import | ast.ImportFrom)
    ]


def internal_imports(
    modules: Modules, *, typing_only: bool = True
) -> dict[str, list[tuple[str, int]]]:
    return {
        m: [(t, n) for t, n in imports(modules, m, typing_only=typing_only) if t in modules]
        for m in modules
    }


def upward_imports(modules: Modules) -> list[str]:
    """Each import that goes up (or sideways to another layer), naming both modules."""
    root = next(m for m in modules if "." not in m)
    found = []
    for module, edges in internal_imports(modules).items():
        for target, line in edges:
            if target == root:
                if module != root:
                    found.append(f"{module}:{line} imports the package root {root}")
            elif module != root and layer(target) != layer(module):
                if RANKS.get(layer(target), -1) >= RANKS.get(layer(module), -1):
                    found.append(
                        f"{module}:{line} ({layer(module)}, rank {RANKS.get(layer(module))}) "
                        f"imports {target} ({layer(target)}, rank {RANKS.get(layer(target))})"
                    )
    return found


def import_cycles(modules: Modules) -> list[str]:
    """Each cycle found by a depth-first walk, as ``a -> b -> a``. An import for types only
    (under ``if TYPE_CHECKING:``) closes no cycle: it never runs. It still goes down the
    layers only."""
    edges = {
        m: sorted({t for t, _ in e})
        for m, e in internal_imports(modules, typing_only=False).items()
    }
    state: dict[str, str] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for target in edges[module]:
            if state.get(target) == "open":
                cycles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)
    return cycles


# --- the package -------------------------------------------------------------------------


def test_every_module_belongs_to_a_layer() -> None:
    unknown = sorted(m for m in MODULES if m != "webhook" and layer(m) not in RANKS)
    assert unknown == [], f"modules outside the rank table: {unknown}; add their layer to RANKS"


def test_imports_go_down_the_layers_only() -> None:
    assert upward_imports(MODULES) == []


def test_no_import_cycles() -> None:
    assert import_cycles(MODULES) == []


def test_subpackage_inits_import_nothing() -> None:
    # An import in a package's __init__ runs whenever any of its modules is imported: a
    # hidden edge that can close a cycle.
    noisy = {
        m: [t for t, _ in imports(MODULES, m)]
        for m, p in MODULES.items()
        if p.name == "__init__.py" and m != "webhook" and imports(MODULES, m)
    }
    assert noisy == {}


def test_the_request_path_needs_no_web_yaml_schema_or_cluster_library() -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    foreign = [
        f"{module}:{line} imports {target}"
        for module in MODULES
        if layer(module) in PURE_LAYERS
        for target, line in imports(MODULES, module)
        if target.split(".")[0] not in stdlib and target.split(".")[0] != "webhook"
    ]
    assert foreign == []


def test_the_request_path_loads_no_web_yaml_schema_or_cluster_library() -> None:
    # What the source says above, checked at run time: the package root re-exports lazily and
    # the subpackages' __init__ files are empty, so nothing is loaded behind the scenes.
    probe = (
        "import sys, webhook, webhook.admission.engine, webhook.checks.registry; "
        f"print(sorted(m for m in {HEAVY_LIBRARIES!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_the_public_api_resolves() -> None:
    import webhook

    assert webhook.__all__ == [
        "Audit",
        "Audited",
        "Cluster",
        "ClusterError",
        "Decision",
        "Policy",
        "PolicyError",
        "Preflight",
        "RequestError",
        "audit_cluster",
        "audit_files",
        "connect",
        "decide",
        "default_policy_path",
        "load_policy",
        "parse_policy",
        "preflight_cluster",
        "preflight_files",
        "review",
    ]
    for name in webhook.__all__:
        value = getattr(webhook, name)
        assert value.__name__ == name and value.__module__.startswith("webhook."), name
    with pytest.raises(AttributeError, match="no attribute 'engine_internals'"):
        _ = webhook.engine_internals


def test_only_main_imports_the_commands() -> None:
    commands = {f"webhook.cli.{name}" for name in COMMANDS}
    importers = sorted(
        f"{module}:{line} imports {target}"
        for module in MODULES
        for target, line in imports(MODULES, module)
        if target in commands and module != "webhook.cli.main"
    )
    assert importers == []
    imported = {t for t, _ in imports(MODULES, "webhook.cli.main")}
    assert commands <= imported


def test_library_code_neither_prints_nor_exits() -> None:
    # Messages and exit codes are the command line's: a library raises a typed error.
    found = []
    for module, path in MODULES.items():
        if layer(module) == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name in ("print", "exit", "quit", "sys.exit", "os._exit"):
                found.append(f"{module}:{node.lineno} calls {name}")
    # The one exception: the forked child of a long decision ends without running any of the
    # worker it was copied from (no message, no exit code anyone reads).
    child_exit = [f for f in found if f.startswith("webhook.server.child:") and "os._exit" in f]
    assert len(child_exit) == 1
    assert [f for f in found if f not in child_exit] == []


def test_library_code_reads_and_writes_no_standard_stream() -> None:
    # Standard input is the caller's to read (the audits take its text); output is the
    # command line's. The server's log handler writes to stderr, where a container's log is.
    found = [
        f"{module}:{node.lineno} uses {ast.unparse(node)}"
        for module, path in MODULES.items()
        if layer(module) != "cli"
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.Attribute)
        and ast.unparse(node) in ("sys.stdin", "sys.stdout", "sys.stderr")
    ]
    assert [f for f in found if not f.startswith("webhook.server.logs:")] == []


# The libraries the server is built on: their private names are theirs to change in any
# release, so the server uses none but these, each with why and what would replace it.
SERVER_LIBRARIES = ("gunicorn", "gevent", "werkzeug", "flask", "prometheus_client")
PRIVATE_NAMES_USED = {
    "webhook.server.child": {
        "os._exit": "the standard library's documented exit for a forked child, which must "
        "not run the worker's cleanup",
    },
}


def private_names(modules: Modules) -> dict[str, set[str]]:
    """``from <library> import _name`` of the server's libraries anywhere in the package, and
    ``<expression>._name`` (not ``self``'s or ``cls``') in ``webhook.server``."""
    found: dict[str, set[str]] = {}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and (node.module or "").split(".")[0] in SERVER_LIBRARIES
            ):
                for alias in node.names:
                    if alias.name.startswith("_"):
                        found.setdefault(module, set()).add(f"{node.module}.{alias.name}")
            elif (
                isinstance(node, ast.Attribute)
                and layer(module) == "server"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and ast.unparse(node.value) not in ("self", "cls")
            ):
                found.setdefault(module, set()).add(ast.unparse(node))
    return found


def test_the_server_uses_no_private_name_of_its_libraries_but_those_listed() -> None:
    assert private_names(MODULES) == {m: set(names) for m, names in PRIVATE_NAMES_USED.items()}


def test_a_private_import_or_attribute_is_found(tmp_path: Path) -> None:
    modules = _package(
        tmp_path,
        {
            "server/a.py": (
                "from gunicorn.util import _write\n"
                "def f(pool):\n    return pool._semaphore, self._own, os.__name__\n"
            ),
            "core/b.py": "from gevent.pool import _Pool\ndef g(x):\n    return x._y\n",
        },
    )
    assert private_names(modules) == {
        "webhook.server.a": {"gunicorn.util._write", "pool._semaphore"},
        "webhook.core.b": {"gevent.pool._Pool"},
    }


def test_only_the_command_line_parses_arguments() -> None:
    parsers = [
        f"{module}:{line}"
        for module in MODULES
        if layer(module) != "cli"
        for target, line in imports(MODULES, module)
        if target == "argparse"
    ]
    assert parsers == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_longer_than_the_limit(module: str) -> None:
    lines = len(MODULES[module].read_text("utf-8").splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines: split it by what its parts do"


# --- the checks themselves, on a package made for them -----------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Modules:
    for name, text in {"__init__.py": "", **files}.items():
        path = tmp_path / "webhook" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(text))
    return modules_of(tmp_path / "webhook")


def test_an_upward_import_inside_a_function_is_named_with_both_modules(tmp_path: Path) -> None:
    modules = _package(
        tmp_path,
        {
            "core/pods.py": "from webhook.policy import model\n",
            "policy/model.py": "def late():\n    from webhook.core.pods import x\n",
        },
    )
    assert upward_imports(modules) == [
        "webhook.policy.model:2 (policy, rank 0) imports webhook.core.pods (core, rank 1)"
    ]
    assert import_cycles(modules) == [
        "webhook.core.pods -> webhook.policy.model -> webhook.core.pods"
    ]


def test_an_import_for_types_only_closes_no_cycle_but_still_goes_down(tmp_path: Path) -> None:
    modules = _package(
        tmp_path,
        {
            "core/pods.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from webhook.core.pools import Selection\n"
                "    from webhook.checks.registry import CHECKS\n"
            ),
            "core/pools.py": "from webhook.core.pods import PodView\n",
            "checks/registry.py": "",
        },
    )
    assert import_cycles(modules) == []
    assert upward_imports(modules) == [
        "webhook.core.pods:4 (core, rank 1) imports webhook.checks.registry (checks, rank 2)"
    ]
    # The same import at run time is a cycle.
    (tmp_path / "webhook" / "core" / "pods.py").write_text(
        "from webhook.core.pools import Selection\n"
    )
    assert import_cycles(modules) == [
        "webhook.core.pods -> webhook.core.pools -> webhook.core.pods"
    ]


def test_layers_of_one_rank_and_the_root_are_out_of_bounds(tmp_path: Path) -> None:
    modules = _package(
        tmp_path,
        {
            "server/app.py": "from webhook.certs.pki import generate\n",
            "certs/pki.py": "",
            "checks/a.py": "import webhook\n",
            "cli/main.py": "from webhook.server import app\nfrom webhook.cli import common\n",
            "cli/common.py": "from . import main\n",
        },
    )
    assert sorted(upward_imports(modules)) == [
        "webhook.checks.a:1 imports the package root webhook",
        "webhook.server.app:1 (server, rank 5) imports webhook.certs.pki (certs, rank 5)",
    ]
    assert import_cycles(modules) == [
        "webhook.cli.common -> webhook.cli.main -> webhook.cli.common"
    ]


def test_the_docs_list_every_rule_and_every_policy_scope() -> None:
    from webhook.checks.registry import CHECKS

    readme = (PACKAGE.parent / "README.md").read_text("utf-8")
    for check in CHECKS:
        assert f"| `{check.rule}` |" in readme, check.rule
    security_model = (PACKAGE.parent / "docs" / "security-model.md").read_text("utf-8")
    for scope in ("gpuPods", "reachablePods", "otherPods", "gpuNodesTainted", "allowedPaths"):
        assert f"`{scope}" in security_model, scope


def test_contributing_draws_every_layer_at_its_rank() -> None:
    """The architecture table of CONTRIBUTING.md has one row per layer, with the rank this
    test enforces, and no layer that is not a package of ``webhook``."""
    contributing = (PACKAGE.parent / "CONTRIBUTING.md").read_text("utf-8")
    rows = {
        layer: int(rank)
        for rank, layer in re.findall(r"^\| (\d+) \| `webhook/(\w+)/` \|", contributing, re.M)
    }
    assert rows == RANKS
    assert set(RANKS) == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
