"""Audits: what a policy would deny, warn about and change in manifests on disk or in the
workloads of a live cluster; the PolicyReports of an audit, written and pruned; the pre-flight
of a policy change; the policy's test suites.

Everything takes typed parameters and returns results (an :class:`~webhook.audit.judging.Audit`,
a :class:`~webhook.audit.preflight.Preflight`, an :class:`~webhook.audit.reports.Applied`):
nothing prints, parses arguments or exits. ``webhook.cli`` renders them.
"""
