"""Loading a policy: YAML with line numbers, the JSON Schema, lint, then compilation.

All of this happens once, at load time. Every error names the source, the field path and the
line, and all errors are reported together, so an admin fixes a policy in one pass. The
compiled policy carries the lint warnings, for ``policy validate`` to print and the server to
log.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from webhook.policy import lint, schemas
from webhook.policy.compile import compile_policy
from webhook.policy.files import unreadable_file
from webhook.policy.grant_lint import host_path_findings
from webhook.policy.lines import LineFinder, duplicate_keys, render_path
from webhook.policy.model import Policy


class PolicyError(ValueError):
    """A policy that cannot be used. ``errors`` holds one ``source:line: path: message`` each."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        head = f"policy {source} is invalid"
        super().__init__(head + ":\n  " + "\n  ".join(errors) if errors else head)


def schema() -> dict[str, Any]:
    """The policy's JSON Schema, shipped as package data (one source of truth)."""
    return schemas.load("policy.schema.json")


def default_policy_path() -> Path:
    """The packaged default policy, so an installed wheel works without a checkout."""
    return Path(str(resources.files("webhook.policy").joinpath("data/default.yaml")))


def load_policy(path: str | Path) -> Policy:
    """Read, validate and compile a policy file."""
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise PolicyError(str(path), [unreadable_file(path, exc)]) from None
    except UnicodeDecodeError:
        raise PolicyError(str(path), [f"{path}: not UTF-8 text"]) from None
    return parse_policy(text, source=str(path))


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate and compile policy YAML text."""
    try:
        return _parse_policy(text, source)
    except RecursionError:
        # A YAML alias that contains itself (``x: &a [*a]``) has no JSON meaning.
        raise PolicyError(source, [f"{source}: a YAML alias refers to itself"]) from None


def _parse_policy(text: str, source: str) -> Policy:
    node, document = _parse_yaml(text, source)
    lines = LineFinder(source, node)
    errors = lint.pre_schema_errors(document, lines)
    if not errors:
        validator = schemas.validator("policy.schema.json")
        for err in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path)):
            path = list(err.absolute_path)
            if err.validator == "additionalProperties" and isinstance(err.instance, dict):
                # Point at the unknown key itself, not at the object that holds it.
                extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
                path.append(extra[0])
            errors.append(lines.error(path, _schema_message(err)))
    if not errors:
        errors = lint.semantic_errors(document, lines)
    if errors:
        raise PolicyError(source, errors)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    policy = compile_policy(document, source, digest)
    found = lint.warnings(policy, lines) + tuple(host_path_findings(document, lines))
    exceptions = tuple(
        dataclasses.replace(e, line=lines.line(["spec", "exceptions", i]))
        for i, e in enumerate(policy.exceptions)
    )
    return dataclasses.replace(
        policy, warnings=tuple(sorted(found, key=lambda w: w.line)), exceptions=exceptions
    )


# --- YAML with line numbers -------------------------------------------------------------


def _parse_yaml(text: str, source: str) -> tuple[yaml.Node, Any]:
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise PolicyError(source, [_yaml_error(source, exc, str(exc))]) from None
    nodes = [n for n in nodes if n is not None]
    if len(nodes) != 1:
        raise PolicyError(source, [f"{source}: expected one YAML document, found {len(nodes)}"])
    node = nodes[0]
    duplicates = list(duplicate_keys(node))
    if duplicates:
        raise PolicyError(
            source,
            [f"{source}:{line}: {render_path(path)}: duplicate key" for path, line in duplicates],
        )
    try:
        document = yaml.SafeLoader(text).get_single_data()
    except yaml.YAMLError as exc:  # e.g. a !!python/object tag, which safe loading refuses
        raise PolicyError(source, [_yaml_error(source, exc, str(exc).splitlines()[0])]) from None
    return node, document


def _yaml_error(source: str, exc: yaml.YAMLError, fallback: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"{source}:{mark.line + 1}" if mark else source
    return f"{where}: not valid YAML: {getattr(exc, 'problem', None) or fallback}"


def _schema_message(err: jsonschema.ValidationError) -> str:
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        known = sorted(err.schema.get("properties", {}))
        hints = [
            f"{name!r} (did you mean {close[0]!r}?)"
            if (close := difflib.get_close_matches(name, known, 1))
            else repr(name)
            for name in extra
        ]
        return f"unknown field {', '.join(hints)}; allowed: {', '.join(known)}"
    if err.validator == "enum":
        message = f"{err.instance!r} is not one of {', '.join(map(str, err.validator_value))}"
        if err.instance is False and "Off" in err.validator_value:
            message += ' (YAML reads an unquoted Off as false: write "Off")'
        return message
    return str(err.message)
