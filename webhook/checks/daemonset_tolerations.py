"""GPU DaemonSets tolerate their nodes' taints in the template.

Restricted (a warning): a DaemonSet whose template requests a GPU resource but does not
tolerate the taints of its GPU nodes. The DaemonSet controller places Pods by the template's
tolerations, so the tolerations the mutating webhook injects into Pods never get them onto
tainted nodes: the DaemonSet silently runs nowhere. Allowed: templates that tolerate those
taints, and every other kind.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation
from webhook.core.pods import PodView
from webhook.core.pools import select_pool
from webhook.core.scheduling import tolerates
from webhook.policy.model import Policy

RULE = "daemonset-tolerations"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    if view.kind != "DaemonSet":
        return
    selection = select_pool(view, policy)
    tolerations = view.tolerations()
    for taint in selection.taints:
        if not any(tolerates(t, taint) for t in tolerations):
            shown = f"{taint['key']}={taint.get('value', '')}:{taint['effect']}"
            yield Violation(
                rule=RULE,
                path=view.field_path("tolerations"),
                value=shown,
                message=f"the DaemonSet requests {', '.join(selection.requested)} but does not "
                f"tolerate the GPU nodes' taint {shown}, so it runs on none of them",
                hint=f"add to the template: tolerations: [{{key: {taint['key']}, operator: "
                f"Exists, effect: {taint['effect']}}}]",
                error_type="Required value",
                subject="tolerations",
                field=f"tolerations[{taint['key']}]",
                advisory=True,
            )
