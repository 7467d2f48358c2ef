"""Names compared the way a reader means them: resource names with their near misses, host paths
as the kubelet would mount them. Compiled into the policy once, read on the request path."""

from __future__ import annotations

import posixpath
import re


def normalise_host_path(path: str) -> str:
    """``//dev/./nvidia0/`` is ``/dev/nvidia0``: what the kubelet would mount."""
    return posixpath.normpath(re.sub(r"/+", "/", path)) if path else path


def near_miss_key(name: str) -> str:
    """What a resource name looks like with case, separators and a plural 's' ignored."""
    key = re.sub(r"[-._+]", "", name.lower())
    return key[:-1] if key.endswith("s") else key
