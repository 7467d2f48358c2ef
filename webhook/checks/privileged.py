"""No privileged containers.

Restricted: ``securityContext.privileged: true`` in any container, init container or
ephemeral container. A privileged container sees every GPU device of the node and bypasses
the device plugin's allocation, so it breaks the isolation between GPU Pods. Allowed:
``privileged: false`` or unset.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core.findings import Violation, quote
from webhook.core.pods import PodView
from webhook.policy.model import Policy

RULE = "privileged"


def check(view: PodView, policy: Policy) -> Iterator[Violation]:
    for container in view.containers:
        context = container.spec.get("securityContext")
        if isinstance(context, dict) and context.get("privileged") is True:
            yield Violation(
                rule=RULE,
                path=f"{container.path}.securityContext.privileged",
                value=True,
                message=f"container {quote(container.name)} must not be privileged: a privileged "
                "container sees every GPU on the node and bypasses the device plugin",
                hint="remove securityContext.privileged and request GPUs in resources.limits "
                "(e.g. nvidia.com/gpu: 1)",
                subject=container.name,
                field=f"{container.list_name}.securityContext.privileged",
            )
