"""How ``gpu-admission inspect`` prints its report: aligned tables for a terminal, or Markdown
for a ticket. Both are the same sections (:func:`sections`), each a title, a table and the
sentences that go with it; only the typesetting differs. A table prints at most ``max_rows``
rows (None: all) and says how many it left out: a cluster of thousands of GPU nodes reads in
the per-pool summary, not in a ticket of thousands of lines. JSON is the report's document
(``webhook.operations.inspect_report.report_document``), always complete."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from webhook.cli.inspect_changes_output import change_lines, lost_rows
from webhook.core.wording import count, names, number, plain_number
from webhook.operations.inspect_report import InspectedNode, InspectReport, PendingPod, timestamp
from webhook.policy.quantity import Quantity

NONE = "-"
# Rows of a table printed for a terminal or a ticket, unless --max-rows says otherwise.
MAX_ROWS = 50


@dataclass(slots=True)
class Section:
    """One part of the report: a table (``header`` and ``rows``; none when empty) and
    sentences after it."""

    title: str
    header: tuple[str, ...] = ()
    rows: list[tuple[str, ...]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def sections(report: InspectReport, every_node: bool = False) -> list[Section]:
    """The report's sections, in the guide's checklist order; the GPU nodes that need
    attention, or with ``every_node`` all of them."""
    found = [
        _pools(report),
        _nodes(report, every_node),
        _pending(report),
        _gated(report),
        _device_plugins(report),
        _quotas(report),
        _drift(report),
        _mixed(report),
    ]
    if report.changes is not None:
        found.append(_changes(report))
    return found


def headline(report: InspectReport) -> str:
    return (
        f"GPU inspection at {timestamp(report.generated)}, policy: {report.policy}; "
        f"{number(report.nodes_read, 'node')} read, "
        f"{count(report.gpu_nodes, 'GPU node')}"
    )


def summary(report: InspectReport) -> str:
    """One line: the findings, or that there are none."""
    findings = report.findings()
    parts = [
        number(findings["pendingGpuPods"], "GPU Pod")
        + f" Pending over {duration(report.pending_after)} with a cause",
        number(findings["uncoveredGpuNodes"], "GPU node") + " without a Ready device plugin Pod",
        number(findings["exhaustedQuotas"], "GPU quota") + " used up",
        number(findings["drift"], "drift finding"),
    ]
    verdict = "nothing to act on" if report.clean() else "to act on"
    return f"{verdict}: {', '.join(parts)}"


def render_table(
    report: InspectReport, max_rows: int | None = MAX_ROWS, every_node: bool = False
) -> str:
    out = [headline(report), ""]
    for section in sections(report, every_node):
        out.append(section.title.upper())
        rows, left_out = _shown(section.rows, max_rows)
        if rows:
            out += _aligned(section.header, rows)
        if left_out:
            out.append(left_out)
        out += section.lines
        out.append("")
    out += [f"note: {note}" for note in report.notes]
    out.append(summary(report))
    return "\n".join(out) + "\n"


def render_markdown(
    report: InspectReport, max_rows: int | None = MAX_ROWS, every_node: bool = False
) -> str:
    out = [f"# {headline(report)}", "", f"**{summary(report)}**", ""]
    for section in sections(report, every_node):
        out += [f"## {section.title}", ""]
        rows, left_out = _shown(section.rows, max_rows)
        if rows:
            out += _markdown_table(section.header, rows)
            out.append("")
        lines = [left_out, *section.lines] if left_out else section.lines
        if lines:
            out += [f"- {line}" for line in lines]
            out.append("")
    if report.notes:
        out += ["## Notes", "", *[f"- {note}" for note in report.notes], ""]
    return "\n".join(out)


def _shown(rows: list[tuple[str, ...]], max_rows: int | None) -> tuple[list[tuple[str, ...]], str]:
    """The rows to print, and a line that says how many were left out ("" for none)."""
    if max_rows is None or len(rows) <= max_rows:
        return rows, ""
    left_out = len(rows) - max_rows
    return rows[:max_rows], (
        f"... {number(left_out, 'more row')} left out (of {len(rows)}): see them all with "
        "--max-rows 0, or -o json"
    )


def _pools(report: InspectReport) -> Section:
    """Per pool (a GPU node in several counts in each; "-": the GPU nodes in none), product,
    resource and sharing (whole GPUs, MIG instances and time-sliced replicas are not added
    together): the usable nodes and their GPUs allocatable, allocated and free; the nodes
    out of use (NotReady, cordoned, being removed) apart, with their allocatable."""
    section = Section(
        "GPU pools",
        (
            "POOL",
            "PRODUCT",
            "RESOURCE",
            "SHARING",
            "NODES",
            "ALLOCATABLE",
            "ALLOCATED",
            "FREE",
            "OUT OF USE",
        ),
    )
    groups: dict[tuple[str, str, str, str], list[InspectedNode]] = {}
    for node in report.gpu_nodes:
        for pool in node.pools or (NONE,):
            for resource in node.resources or ():
                key = (pool, node.product or NONE, resource.name, node.sharing)
                groups.setdefault(key, []).append(node)
    for key, nodes in sorted(groups.items(), key=lambda item: (item[0][0] == NONE, item[0])):
        name = key[2]
        usable = [n for n in nodes if not n.state]
        out = [n for n in nodes if n.state]
        allocatable, allocated = _totals(usable).get(name, (0, 0))
        out_allocatable = _totals(out).get(name, (0, 0))[0]
        section.rows.append(
            (
                *key,
                str(len(usable)),
                _plain(allocatable),
                _plain(allocated),
                _plain(max(allocatable - allocated, 0)),
                f"{number(len(out), 'node')}, {_plain(out_allocatable)}" if out else NONE,
            )
        )
    if not report.gpu_nodes:
        section.lines.append("no GPU node")
    return section


def _offers(node: InspectedNode, name: str) -> bool:
    return any(resource.name == name for resource in node.resources)


def _totals(nodes: Iterable[InspectedNode]) -> dict[str, tuple[Quantity, Quantity]]:
    """Per resource, the nodes' allocatable and allocated GPUs added up."""
    totals: dict[str, tuple[Quantity, Quantity]] = {}
    for node in nodes:
        for resource in node.resources:
            allocatable, allocated = totals.get(resource.name, (0, 0))
            totals[resource.name] = (
                allocatable + resource.allocatable,
                allocated + resource.allocated,
            )
    return totals


def _nodes(report: InspectReport, every_node: bool) -> Section:
    """The GPU nodes that need attention (out of use, capacity above allocatable, a failed MIG
    configuration, no Ready device plugin Pod), or with ``every_node`` all of them; then the
    totals per resource and sharing, usable nodes only."""
    listed = report.gpu_nodes if every_node else [n for n in report.gpu_nodes if n.attention]
    title = (
        f"GPU nodes ({len(report.gpu_nodes)})"
        if every_node
        else f"GPU nodes needing attention ({len(listed)} of {len(report.gpu_nodes)})"
    )
    section = Section(
        title,
        (
            "NODE",
            "POOLS",
            "PRODUCT",
            "MIG CONFIG",
            "MIG PROFILES",
            "REPLICAS",
            "RESOURCE",
            "ALLOCATABLE",
            "ALLOCATED",
            "ATTENTION",
        ),
    )
    for node in listed:
        described = (
            node.name,
            ",".join(node.pools) or NONE,
            node.product or NONE,
            node.mig_config or NONE,
            ",".join(node.mig_profiles) or NONE,
            str(node.replicas) if node.replicas is not None else NONE,
        )
        attention = "; ".join(node.attention) or NONE
        for index, resource in enumerate(node.resources or ()):
            first = described if index == 0 else ("",) * len(described)
            section.rows.append(
                (
                    *first,
                    resource.name,
                    _plain(resource.allocatable)
                    + (
                        ""
                        if resource.allocatable == resource.capacity
                        else f" of {_plain(resource.capacity)}"
                    ),
                    _plain(resource.allocated),
                    attention if index == 0 else "",
                )
            )
        if not node.resources:
            section.rows.append((*described, NONE, "0", "0", attention))
    by_sharing: dict[str, list[InspectedNode]] = {}
    for node in report.gpu_nodes:
        by_sharing.setdefault("out of use" if node.state else node.sharing, []).append(node)
    for sharing, nodes in sorted(by_sharing.items()):
        section.lines += [
            f"{name} ({sharing}): {_plain(allocatable)} allocatable, {_plain(allocated)} "
            f"allocated ({number(sum(1 for n in nodes if _offers(n, name)), 'node')})"
            for name, (allocatable, allocated) in sorted(_totals(nodes).items())
        ]
    if not every_node:
        section.lines.append(
            f"{number(len(report.gpu_nodes) - len(listed), 'GPU node')} with nothing to look "
            "at not listed: see them all with --nodes, or -o json"
        )
    if not report.gpu_nodes:
        section.lines.append(
            "no GPU node (no vendor resource advertised, no nvidia.com/gpu.present)"
        )
    return section


def _pending(report: InspectReport) -> Section:
    section = Section(
        f"Pending GPU Pods ({len(report.pending)})",
        ("NAMESPACE", "POD", "AGE", "REQUESTS", "FINDING", "FIRST CAUSE"),
    )
    for pod in report.pending:
        cause = (
            f"{pod.cause.kind}: {pod.cause.summary}"
            if pod.cause is not None
            else "nothing blocks it (not yet tried by the scheduler)"
        )
        finding = "yes" if report.overdue(pod) else "no"
        section.rows.append(
            (pod.namespace, pod.name, age(pod.age_seconds), _requests(pod), finding, cause)
        )
    if report.pending:
        counted = sum(1 for pod in report.pending if report.overdue(pod))
        section.lines.append(
            f"{counted} of {len(report.pending)} counted as findings: Pending over "
            f"{duration(report.pending_after)} (--pending-after) with a cause; the others are the "
            "scheduler's churn (younger, or not yet tried)"
        )
        section.lines.append("each in full: gpu-admission explain pod NAME -n NAMESPACE")
    else:
        section.lines.append("no GPU Pod waits for a node")
    return section


def _gated(report: InspectReport) -> Section:
    section = Section(
        f"Gated GPU Pods ({len(report.gated)})",
        ("NAMESPACE", "POD", "AGE", "REQUESTS", "GATES"),
    )
    for pod in report.gated:
        section.rows.append(
            (pod.namespace, pod.name, age(pod.age_seconds), _requests(pod), ",".join(pod.gates))
        )
    if report.gated:
        section.lines.append(
            "waiting for their queue (the controller that set each gate, such as Kueue, "
            "removes it when it admits the workload): no finding; see the queue's status"
        )
    else:
        section.lines.append("no GPU Pod is held by scheduling gates")
    return section


def _requests(pod: PendingPod) -> str:
    return ",".join(f"{n}={_plain(q)}" for n, q in pod.requests.items()) or "claims"


def _device_plugins(report: InspectReport) -> Section:
    plugins = report.device_plugins
    section = Section(
        f"Device plugins ({number(plugins.gpu_nodes, 'GPU node')} to cover)",
        ("DAEMONSET", "DESIRED", "READY", "ON GPU NODES"),
    )
    if not plugins.compared:
        section.lines.append(
            "the policy names no devicePluginDaemonSets and none was found by name or image: "
            "device plugins not compared (name yours, e.g. "
            "gpu-operator/nvidia-device-plugin-daemonset)"
        )
        return section
    if plugins.discovered:
        section.lines.append(
            "the policy names no devicePluginDaemonSets: these were found by name or image ("
            + "; ".join(f"{ds.namespace}/{ds.name}: {ds.found_by}" for ds in plugins.daemonsets)
            + "); name them in the policy"
        )
    for ds in plugins.daemonsets:
        if not ds.found:
            section.rows.append((f"{ds.namespace}/{ds.name}", "not found", NONE, NONE))
            continue
        ready = str(ds.ready) + (" (not all ready)" if ds.ready < ds.desired else "")
        section.rows.append(
            (f"{ds.namespace}/{ds.name}", str(ds.desired), ready, str(ds.on_gpu_nodes))
        )
    if plugins.uncovered:
        section.lines.append(
            f"{count(plugins.uncovered, 'GPU node')} without a Ready device plugin Pod, whose "
            f"GPUs no Pod can be given: {names(plugins.uncovered)}; see why with kubectl "
            "describe daemonset, and the drift below"
        )
        if plugins.not_ready:
            has = "has" if len(plugins.not_ready) == 1 else "have"
            section.lines.append(
                f"of these, {count(plugins.not_ready, 'node')} {has} a plugin Pod that is not "
                f"Ready (crash-looping?): {names(plugins.not_ready)}; kubectl logs it"
            )
    else:
        section.lines.append("every GPU node has a Ready device plugin Pod")
    return section


def _quotas(report: InspectReport) -> Section:
    section = Section(
        f"GPU quotas ({len(report.quotas)})",
        ("NAMESPACE", "QUOTA", "RESOURCE", "USED", "HARD", "STATE"),
    )
    for quota in report.quotas:
        state = "USED UP" if quota.exhausted else "forbids (hard 0)" if quota.forbids else "ok"
        section.rows.append(
            (
                quota.namespace,
                quota.quota,
                quota.resource,
                _plain(quota.used),
                _plain(quota.hard),
                state,
            )
        )
    used_up = [f"{q.namespace}/{q.quota} ({q.resource})" for q in report.quotas if q.exhausted]
    if used_up:
        section.lines.append(
            f"{count(used_up, 'GPU quota')} used up, the API server refuses the next GPU Pod "
            f"there: {names(used_up)}; raise hard or free GPUs"
        )
    forbidding = [f"{q.namespace}/{q.quota} ({q.resource})" for q in report.quotas if q.forbids]
    if forbidding:
        section.lines.append(
            f"{count(forbidding, 'GPU quota')} of hard 0, the namespace's tenant not entitled "
            f"to the resource (no finding): {names(forbidding)}"
        )
    elif not report.quotas:
        section.lines.append("no ResourceQuota limits GPUs")
    return section


def _drift(report: InspectReport) -> Section:
    section = Section(f"Policy drift ({sum(1 for d in report.drift if d.level == 'drift')})")
    section.lines += [
        f"{found.kind}{' (info)' if found.level == 'info' else ''}: {found.message}"
        for found in report.drift
    ]
    if not report.drift:
        section.lines.append("the policy and the cluster agree (gpu-admission cluster check)")
    return section


def _mixed(report: InspectReport) -> Section:
    section = Section(f"Mixed hardware pools ({len(report.mixed_pools)})")
    for mixed in report.mixed_pools:
        where = f"pool {mixed.pool}" if mixed.pool is not None else "GPU nodes in no pool"
        products = "; ".join(
            f"{product}: {names(nodes)}" for product, nodes in mixed.products.items()
        )
        section.lines.append(
            f"{where} mixes {number(len(mixed.products), 'product')} offering "
            f"{names(mixed.resources)} ({products}); a Pod asking for "
            f"{'it' if len(mixed.resources) == 1 else 'one of them'} there gets either: pin it "
            "with nvidia.com/gpu.product, or split the pool"
        )
    if not report.mixed_pools:
        section.lines.append("in each pool, each GPU resource is offered by one product")
    return section


def _changes(report: InspectReport) -> Section:
    changes = report.changes
    assert changes is not None  # sections() asks for it only then
    section = Section(f"Changes since {changes.since}", ("NODE", "RESOURCE", "BEFORE", "NOW"))
    section.rows += lost_rows(changes)
    section.lines += change_lines(changes)
    if not section.rows and not section.lines:
        section.lines.append("no GPU node lost, gained or changed GPUs")
    return section


def age(seconds: int) -> str:
    """An age as kubectl prints one: ``45s``, ``12m``, ``3h5m``, ``2d4h``."""
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if days:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{minutes}m" if minutes else f"{seconds}s"


def duration(seconds: int) -> str:
    """A duration to the second, as --pending-after takes one: ``90s`` is ``1m30s``."""
    hours, minutes, rest = seconds // 3600, seconds // 60 % 60, seconds % 60
    parts = [
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
        f"{rest}s" if rest else "",
    ]
    return "".join(parts) or "0s"


def _plain(quantity: Quantity) -> str:
    return str(plain_number(quantity))


def _aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return [line(header), line(["---"] * len(header)), *(line(row) for row in rows)]
