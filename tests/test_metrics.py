"""``webhook.server.metrics``: each answer counted as it is given, through prometheus-client's
documented calls, in a registry of its own."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from webhook.server.metrics import DECISION_BUCKETS, Metrics

Sample = tuple[str, tuple[tuple[str, str], ...], float]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition but the creation times, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_every_answer_is_counted_by_endpoint_verdict_rule_and_outcome() -> None:
    metrics = Metrics()
    metrics.answered("validate", "allowed", 0.00008)
    metrics.answered(
        "validate", "denied", 0.003, (("privileged", "Enforce"), ("host-access", "Warn"))
    )
    metrics.answered("validate", "denied", 0.0001, (("privileged", "Enforce"),))
    metrics.answered("mutate", "allowed", 0.0004, mutation="applied")
    metrics.answered("mutate", "allowed", 7.5, mutation="recorded")
    metrics.answered("validate", "invalid")  # a refusal: no decision time
    found = samples(metrics.render()[0].decode())
    requests = "gpu_admission_requests_total"
    assert found[(requests, (("endpoint", "validate"), ("verdict", "denied")))] == 2
    assert found[(requests, (("endpoint", "validate"), ("verdict", "invalid")))] == 1
    # Every series of requests exists from the start, at zero.
    assert found[(requests, (("endpoint", "mutate"), ("verdict", "error")))] == 0
    violations = "gpu_admission_violations_total"
    assert found[(violations, (("mode", "Enforce"), ("rule", "privileged")))] == 2
    assert found[(violations, (("mode", "Warn"), ("rule", "host-access")))] == 1
    mutations = "gpu_admission_mutations_total"
    assert found[(mutations, (("outcome", "applied"),))] == 1
    assert found[(mutations, (("outcome", "recorded"),))] == 1
    seconds = "gpu_admission_decision_seconds"
    validate = (("endpoint", "validate"),)
    assert found[(f"{seconds}_count", validate)] == 3  # the refusal has no time
    assert round(found[(f"{seconds}_sum", validate)], 9) == 0.00318
    # A time equal to a bound falls in that bound's bucket (Prometheus' "le").
    bound = ("le", str(DECISION_BUCKETS[0]))
    assert found[(f"{seconds}_bucket", (("endpoint", "validate"), bound))] == 2
    assert found[(f"{seconds}_bucket", (("endpoint", "mutate"), ("le", "+Inf")))] == 2
    assert found[(f"{seconds}_bucket", (("endpoint", "mutate"), ("le", "5.0")))] == 1


def test_two_metrics_in_one_process_share_nothing() -> None:
    first, second = Metrics(), Metrics()
    first.answered("validate", "allowed", 0.001)
    key = ("gpu_admission_requests_total", (("endpoint", "validate"), ("verdict", "allowed")))
    assert samples(first.render()[0].decode())[key] == 1
    assert samples(second.render()[0].decode())[key] == 0


def test_a_replaced_policy_reads_zero_and_the_one_in_force_one() -> None:
    metrics = Metrics()
    metrics.set_policy("a" * 64)
    metrics.set_policy("b" * 64)
    metrics.set_policy("b" * 64)
    found = samples(metrics.render()[0].decode())
    info = "gpu_admission_policy_info"
    assert found[(info, (("sha256", "a" * 64),))] == 0
    assert found[(info, (("sha256", "b" * 64),))] == 1


def test_the_node_inventory_figures_are_read_at_each_scrape() -> None:
    metrics = Metrics()
    figures = [(3, 0.5, 0)]
    metrics.watch_inventory(lambda: figures[-1])
    first = samples(metrics.render()[0].decode())
    figures.append((5000, 42.0, 2))
    second = samples(metrics.render()[0].decode())
    assert first[("gpu_admission_inventory_nodes", ())] == 3
    assert second[("gpu_admission_inventory_nodes", ())] == 5000
    assert second[("gpu_admission_inventory_age_seconds", ())] == 42.0
    assert second[("gpu_admission_inventory_watch_restarts_total", ())] == 2
