"""What changed since a previous inspection (``gpu-admission inspect --since FILE``): the
guide's "sudden changes in node GPU capacity" and "mixed hardware pools" over time.

Compared: the GPU nodes of both reports by name (gone: a GPU node of the previous report that
is no GPU node now, deleted or stripped of its GPUs; added: the other way round); for a node in
both, each resource whose allocatable went down (a GPU fallen off the bus, a device plugin
that stopped advertising, a MIG layout that gave fewer instances); and the products no node
carried before. The previous report is the JSON ``inspect -o json`` wrote, checked against its
schema first: a file that is not one is refused, not half compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.operations.inspect_report import Changes, GpusLost, InspectReport, report_schema
from webhook.policy.quantity import Quantity, parse_quantity


class NotAReport(ValueError):
    """The previous report is not one ``inspect -o json`` writes."""


def check_previous(document: Any, source: str) -> Mapping[str, Any]:
    """The previous report, checked against the schema; ``NotAReport`` names the first
    problem and where it is."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(report_schema())
    problem = next(iter(sorted(validator.iter_errors(document), key=lambda e: e.path)), None)
    if problem is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in problem.path)
        raise NotAReport(
            f"{source} is not a report of gpu-admission inspect -o json "
            f"({where.lstrip('.') or 'the document'}: {problem.message})"
        )
    return document  # type: ignore[no-any-return]


def compare(previous: Mapping[str, Any], current: InspectReport) -> Changes:
    """What changed from ``previous`` (a checked report document) to ``current``."""
    before = {node["name"]: node for node in previous["nodes"]}
    now = {node.name: node for node in current.gpu_nodes}
    lost: list[GpusLost] = []
    for name in sorted(before.keys() & now.keys()):
        had: dict[str, Quantity] = {
            r["name"]: parse_quantity(r["allocatable"]) or 0 for r in before[name]["resources"]
        }
        has = {r.name: r.allocatable for r in now[name].resources}
        lost += [
            GpusLost(name, resource, value, has.get(resource, 0))
            for resource, value in sorted(had.items())
            if has.get(resource, 0) < value
        ]
    products_before = {node["product"] for node in previous["nodes"] if node["product"]}
    products_now = {node.product for node in current.gpu_nodes if node.product}
    return Changes(
        since=str(previous["generatedAt"]),
        nodes_gone=tuple(sorted(before.keys() - now.keys())),
        nodes_added=tuple(sorted(now.keys() - before.keys())),
        gpus_lost=tuple(lost),
        new_products=tuple(sorted(products_now - products_before)),
    )
