"""The core layer: how the checks see a pod template (pod and container views), what a check
returns (findings), the scheduler's semantics we rely on (tolerations, node selection) and the
choice of a GPU pool. Pure functions over the compiled policy; no I/O."""
