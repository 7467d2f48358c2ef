"""Reaching a cluster: one resolution of the Kubernetes configuration (``connection``), paged
lists of the workload kinds a policy judges (``listing``), who owns what (``ownership``), and
a watch cache that keeps what its readers need of one resource type current (``watching``).

Built on the kubernetes client's public API; bodies are read as the API server sent them (no
model round trip that drops fields). Nothing here prints or parses arguments: failures are
:class:`~webhook.cluster.connection.ClusterError` (the work cannot go on) or
:class:`~webhook.cluster.listing.Problem` (one resource could not be read).
"""
