"""What changed since a previous inspection (``gpu-admission inspect --since FILE``): the guide's
"sudden changes in node GPU capacity" and "mixed hardware pools" over time.

Compared: the GPU nodes of both reports by name (gone: a GPU node of the previous report that
is no GPU node now, deleted or stripped of its GPUs; added: the other way round); for a node in
both, every resource: one whose allocatable went down with nothing gained beside it is lost (a
GPU fallen off the bus, a device plugin that stopped advertising), one that went up is gained,
and a node that lost some and gained others is re-shaped, one change (a MIG re-partition, a
time-slicing rename); a node whose product changed (re-boarded); the products no node carried
before; and the net allocatable per pool, product and resource, so that an autoscaler's churn
(nodes gone, others added) reads as what it nets to. The previous report is the JSON ``inspect
-o json`` wrote, checked against its schema first: a file that is not one is refused, not half
compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.operations.inspect_report import (
    Changes,
    GpusLost,
    InspectReport,
    NetChange,
    ProductChange,
    Reshaped,
    report_schema,
)
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
    gained: list[GpusLost] = []
    reshaped: list[Reshaped] = []
    products: list[ProductChange] = []
    for name in sorted(before.keys() & now.keys()):
        had = _allocatable(before[name])
        has = {r.name: r.allocatable for r in now[name].resources}
        down = {r: q for r, q in had.items() if has.get(r, 0) < q}
        up = {r: q for r, q in has.items() if had.get(r, 0) < q}
        if down and up:
            reshaped.append(
                Reshaped(
                    name,
                    tuple((r, had[r]) for r in sorted({*down, *up}) if had.get(r, 0)),
                    tuple((r, has[r]) for r in sorted({*down, *up}) if has.get(r, 0)),
                )
            )
        else:
            lost += [GpusLost(name, r, q, has.get(r, 0)) for r, q in sorted(down.items())]
            gained += [GpusLost(name, r, had.get(r, 0), q) for r, q in sorted(up.items())]
        if before[name]["product"] != now[name].product:
            products.append(ProductChange(name, before[name]["product"], now[name].product))
    products_before = {node["product"] for node in previous["nodes"] if node["product"]}
    products_now = {node.product for node in current.gpu_nodes if node.product}
    return Changes(
        since=str(previous["generatedAt"]),
        nodes_gone=tuple(sorted(before.keys() - now.keys())),
        nodes_added=tuple(sorted(now.keys() - before.keys())),
        gpus_lost=tuple(lost),
        new_products=tuple(sorted(products_now - products_before)),
        gpus_gained=tuple(gained),
        reshaped=tuple(reshaped),
        products_changed=tuple(products),
        net=_net(previous["nodes"], current),
    )


def _allocatable(node: Mapping[str, Any]) -> dict[str, Quantity]:
    return {r["name"]: parse_quantity(r["allocatable"]) or 0 for r in node["resources"]}


def _net(previous: list[Mapping[str, Any]], current: InspectReport) -> tuple[NetChange, ...]:
    """Per pool, product and resource, the allocatable over the nodes before and now, where
    it changed: autoscaler churn (50 nodes gone, 50 added) nets to nothing."""
    Key = tuple[str | None, str | None, str]
    totals: dict[Key, list[Quantity]] = {}
    for node in previous:
        for pool in node["pools"] or [None]:
            for resource, quantity in _allocatable(node).items():
                totals.setdefault((pool, node["product"], resource), [0, 0])[0] += quantity
    for inspected in current.gpu_nodes:
        for pool in inspected.pools or (None,):
            for r in inspected.resources:
                totals.setdefault((pool, inspected.product, r.name), [0, 0])[1] += r.allocatable
    return tuple(
        NetChange(pool, product, resource, was, now)
        for (pool, product, resource), (was, now) in sorted(
            totals.items(), key=lambda item: tuple(str(part) for part in item[0])
        )
        if was != now
    )
