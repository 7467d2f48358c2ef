"""The JSON Schemas shipped as package data (policy files, policy test suites), loaded and
checked once."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema


@cache
def load(name: str) -> dict[str, Any]:
    """A schema from ``webhook/policy/data``, e.g. ``policy.schema.json``."""
    text = resources.files("webhook.policy").joinpath(f"data/{name}").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    """A validator for a packaged schema, the schema itself checked once."""
    schema = load(name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)
