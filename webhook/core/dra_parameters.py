"""TEMPORARY STUB (helper dra-params writes the real one)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ParameterProblem:
    path: str
    value: object
    message: str
    hint: str
    refused: bool


def check_parameters(
    parameters: object,
    path: str,
    *,
    gates: Mapping[str, bool],
    device_types: frozenset[str] | None = None,
) -> list[ParameterProblem]:
    problems = []
    if isinstance(parameters, dict):
        sharing = parameters.get("sharing")
        if (
            isinstance(sharing, dict)
            and sharing.get("strategy") == "MPS"
            and not gates.get("MPSSupport")
        ):
            problems.append(
                ParameterProblem(
                    f"{path}.sharing.strategy",
                    "MPS",
                    "MPS needs the driver's MPSSupport feature gate",
                    "enable it",
                    True,
                )
            )
    return problems


def sharing_strategy(parameters: object) -> str | None:
    if isinstance(parameters, dict):
        sharing = parameters.get("sharing")
        if isinstance(sharing, dict) and sharing.get("strategy") in ("TimeSlicing", "MPS"):
            return str(sharing["strategy"])
    return None
