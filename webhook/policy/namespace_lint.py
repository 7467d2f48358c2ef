"""The lint of what a policy says per namespace, where one setting contradicts another: rule
modes that an earlier match or an exemption from every rule keeps from ever applying,
exemptions that another already makes, pools reserved only for namespaces exempt from
pool-access. Each names the settings where they are written: a ``tenants`` entry's
(``tenants[2].exemptions[0]``) or the fields before them (``exemptions[0]``,
``namespaceOverrides[1]``, ``pools[0].namespaces``)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from typing import Any

from webhook.policy.lines import LineFinder, render_path
from webhook.policy.model import Exemption, NamespaceOverride, Path, Policy, PolicyWarning

Report = Callable[[list[Any], str], None]

_GLOB = re.compile(r"[*?\[]")


# The spec fields whose settings moved into ``tenants`` entries (spec field -> tenants field);
# ``pools[].namespaces`` moved into ``reservedPools``. They work for one more release.
MOVED_FIELDS = {
    "binderNamespaces": "binder",
    "exemptions": "exemptions",
    "namespaceOverrides": "rules",
}


def namespace_warnings(policy: Policy, lines: LineFinder, warn: Report) -> None:
    """The three lints, as ``webhook.policy.lint.warnings`` reports them."""
    _lint_overrides(policy, warn)
    _lint_exemptions(policy, warn)
    _lint_pool_namespaces(policy, lines, warn)


def moved_field_warnings(policy: Policy, lines: LineFinder) -> list[PolicyWarning]:
    """Each field the policy still writes where the tenants block has taken it, once, at the
    line of its key."""
    moved: list[tuple[list[Any], str]] = [(["spec", old], new) for old, new in MOVED_FIELDS.items()]
    moved += [
        (["spec", "pools", i, "namespaces"], "reservedPools") for i in range(len(policy.pools))
    ]
    return [
        PolicyWarning(
            lines.key_line(path),
            render_path(path),
            f"{render_path(path)} moves into tenants[].{new} in this release; "
            "`gpu-admission policy migrate` rewrites it",
        )
        for path, new in moved
        if lines.has(path)
    ]


def exemption_notes(policy: Policy, inform: Report) -> None:
    """What each exemption trusts (information, never a failure)."""
    for exemption in policy.exemptions:
        rules = "every rule" if exemption.rules is None else ", ".join(sorted(exemption.rules))
        who = (
            "everyone who may create Pods there"
            if exemption.service_accounts is None
            else "everyone who may create Pods there that run as "
            + ", ".join(sorted(exemption.service_accounts))
        )
        inform(
            list(exemption.path),
            f"exempts namespaces {', '.join(exemption.namespaces.patterns)} from {rules}: it "
            f"trusts {who}; delete the names you do not use and keep tenants from creating "
            "namespaces with these names",
        )


def setting(path: Path) -> str:
    """A setting as messages name it: ``tenants[2].exemptions[0]``."""
    return render_path(list(path[1:]))


def covers(broad: str, narrow: str) -> bool:
    """Whether namespace pattern ``broad`` matches every name ``narrow`` matches.

    Only the cases that are certain: equal patterns, ``*``, an exact name that ``broad``
    matches, and a prefix glob (``ml-*``) over a pattern that starts with its prefix.
    """
    if broad in (narrow, "*"):
        return True
    if not _GLOB.search(narrow):
        return fnmatch.fnmatchcase(narrow, broad)
    prefix = broad[:-1]
    return broad.endswith("*") and not _GLOB.search(prefix) and narrow.startswith(prefix)


def _covering(patterns: Sequence[str], narrow: str) -> str | None:
    return next((p for p in patterns if covers(p, narrow)), None)


def _exempt_from(exemption: Exemption, rule: str | None) -> bool:
    """Exempts every service account from ``rule`` (None: from every rule)."""
    return exemption.service_accounts is None and (
        exemption.rules is None or (rule is not None and rule in exemption.rules)
    )


def _rules_path(override: NamespaceOverride) -> list[Any]:
    """Where an override's rule modes are written: a tenants entry's ``rules``, or a whole
    ``namespaceOverrides`` entry."""
    path = list(override.path)
    return [*path, "rules"] if path[1] == "tenants" else path


def _lint_overrides(policy: Policy, warn: Report) -> None:
    all_rules = [e for e in policy.exemptions if _exempt_from(e, rule=None)]
    overrides = policy.namespace_overrides
    for j, override in enumerate(overrides):
        reasons: dict[int, str] = {}
        for k, pattern in enumerate(override.namespaces.patterns):
            for earlier in overrides[:j]:
                if (by := _covering(earlier.namespaces.patterns, pattern)) is not None:
                    reasons[k] = (
                        f"{setting(earlier.path)} ({by!r}) matches {pattern!r} first, and the "
                        "first match wins"
                    )
                    break
            else:
                for exemption in all_rules:
                    if (by := _covering(exemption.namespaces.patterns, pattern)) is not None:
                        reasons[k] = (
                            f"{setting(exemption.path)} ({by!r}) exempts {pattern!r} from every "
                            "rule"
                        )
                        break
        if len(reasons) == len(override.namespaces.patterns):
            warn(
                _rules_path(override),
                "unreachable override, its rule modes never apply: " + "; ".join(reasons.values()),
            )
        else:
            for k, reason in reasons.items():
                warn(
                    [*override.path, "namespaces", k],
                    f"this pattern never reaches the override: {reason}",
                )


def _lint_exemptions(policy: Policy, warn: Report) -> None:
    exemptions = policy.exemptions

    def within(narrow: Exemption, broad: Exemption) -> bool:
        return _exempt_from(broad, rule=None) and all(
            _covering(broad.namespaces.patterns, p) is not None for p in narrow.namespaces.patterns
        )

    for j, exemption in enumerate(exemptions):
        for i, other in enumerate(exemptions):
            # Of two exemptions that cover each other, only the later one is redundant.
            if i == j or not within(exemption, other) or (i > j and within(other, exemption)):
                continue
            warn(
                list(exemption.path),
                f"redundant exemption: {setting(other.path)} already exempts every namespace it "
                f"names ({', '.join(exemption.namespaces.patterns)}) from every rule, for every "
                "service account",
            )
            break


def _lint_pool_namespaces(policy: Policy, lines: LineFinder, warn: Report) -> None:
    exempt = [e for e in policy.exemptions if _exempt_from(e, rule="pool-access")]
    for i, pool in enumerate(policy.pools):
        if pool.namespaces is None:
            continue
        patterns = pool.namespaces.patterns
        if all(any(_covering(e.namespaces.patterns, p) for e in exempt) for p in patterns):
            warn(
                _reservation_path(policy, lines, i),
                f"pool {pool.name!r} is reserved only for namespaces exempt from pool-access "
                f"anyway ({', '.join(patterns)}), so the reservation grants nothing and every "
                "namespace the policy checks is refused the pool; reserve it for the namespaces "
                "that should use it",
            )


def _reservation_path(policy: Policy, lines: LineFinder, index: int) -> list[Any]:
    """Where pool ``index`` is first reserved: its own ``namespaces``, else the first tenants
    entry that names it in ``reservedPools``."""
    own = ["spec", "pools", index, "namespaces"]
    if lines.has(own):
        return own
    name = policy.pools[index].name
    tenant = next(t for t in policy.tenants if name in t.reserved_pools)
    return ["spec", "tenants", tenant.index, "reservedPools", tenant.reserved_pools.index(name)]
