"""What an operator asks of a running cluster: why a GPU Pod is Pending or cannot see its GPU
(``explain``), the daily GPU inspection (``inspect``), and a starting policy drafted from the
nodes the cluster has (``policy init --from-cluster``).

Above the audits (it reuses their drift findings) and below the CLI: everything takes typed
parameters and returns results; nothing prints, parses arguments or exits.
"""
