"""No privileged containers in Pods that can reach a GPU node.

Restricted: ``securityContext.privileged: true`` in any container, init container or
ephemeral container. A privileged container sees every device of its node, every GPU
included, past the device plugin's allocation. Allowed: ``privileged: false`` or unset. Which
Pods this binds, and in which mode, is decided by ``webhook.core.scope``.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.core import advice
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
                message=f"container {quote(container.name)} must not be privileged: "
                + advice.why(view, policy, "it sees every device of its node")
                + " (Pod Security baseline: Privileged Containers)",
                hint=advice.fix(
                    view,
                    policy,
                    "remove securityContext.privileged",
                    gpu="request GPUs in resources.limits (e.g. nvidia.com/gpu: 1)",
                ),
                subject=container.name,
                field=f"{container.list_name}.securityContext.privileged",
            )
