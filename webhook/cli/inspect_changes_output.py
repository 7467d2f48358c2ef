"""How ``gpu-admission inspect --since`` prints what changed: the GPUs lost, one row per node
and resource (what needs a look), then sentences: GPUs gained, nodes re-shaped (a MIG
re-partition or a rename, told once per kind of change with its nodes), products changed per
node, nodes gone and added, new products, and the net per pool and product."""

from __future__ import annotations

from collections.abc import Iterable

from webhook.core.wording import count, names, number, plain_number
from webhook.operations.inspect_report import Changes
from webhook.policy.quantity import Quantity

NONE = "-"


def lost_rows(changes: Changes) -> list[tuple[str, ...]]:
    """One row per node and resource whose allocatable went down, nothing gained beside it."""
    return [
        (lost.node, lost.resource, _plain(lost.before), _plain(lost.after))
        for lost in changes.gpus_lost
    ]


def change_lines(changes: Changes) -> list[str]:
    lines = []
    if changes.gpus_lost:
        lines.append(
            f"{count({lost.node for lost in changes.gpus_lost}, 'node')} lost GPUs (allocatable "
            "went down): check nvidia-smi and the kernel log for Xid errors there"
        )
    if changes.gpus_gained:
        gained = [
            f"{g.node} {g.resource} {_plain(g.before)} -> {_plain(g.after)}"
            for g in changes.gpus_gained
        ]
        lines.append(f"GPUs gained ({len(gained)}): {names(gained)}")
    by_kind: dict[tuple[str, str], list[str]] = {}
    for reshaped in changes.reshaped:
        kind = (_resources(reshaped.before), _resources(reshaped.after))
        by_kind.setdefault(kind, []).append(reshaped.node)
    for (was, now), nodes in by_kind.items():
        lines.append(
            f"re-shaped, not lost (a MIG re-partition or a rename), {number(len(nodes), 'node')}:"
            f" {was} -> {now}: {names(nodes)}"
        )
    by_product: dict[tuple[str, str], list[str]] = {}
    for changed in changes.products_changed:
        key = (changed.before or "no product", changed.after or "no product")
        by_product.setdefault(key, []).append(changed.node)
    for (was, now), nodes in by_product.items():
        lines.append(
            f"product changed (re-boarded), {number(len(nodes), 'node')}: {was} -> {now}: "
            f"{names(nodes)}"
        )
    for what, listed in (
        ("GPU nodes gone", changes.nodes_gone),
        ("GPU nodes added", changes.nodes_added),
        ("new products", changes.new_products),
    ):
        if listed:
            lines.append(f"{what} ({len(listed)}): {names(listed)}")
    if changes.net:
        nets = [
            f"{net.pool or 'in no pool'}/{net.product or 'no product'} {net.resource} "
            f"{_plain(net.before)} -> {_plain(net.after)}"
            for net in changes.net
        ]
        lines.append(f"net allocatable per pool and product: {names(nets)}")
    elif changes.nodes_gone or changes.nodes_added:
        lines.append("net allocatable per pool and product: unchanged (nodes replaced)")
    return lines


def _resources(quantities: Iterable[tuple[str, Quantity]]) -> str:
    return ", ".join(f"{name} {_plain(q)}" for name, q in quantities) or NONE


def _plain(quantity: Quantity) -> str:
    return str(plain_number(quantity))
