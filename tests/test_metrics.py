"""``webhook.server.metrics``: each answer counted as it is given, through prometheus-client's
documented calls, in one process and across worker processes (multiprocess mode, which must be
chosen before prometheus-client is imported)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import REPO
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


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_workers_processes_are_summed_in_multiprocess_mode(tmp_path: Path) -> None:
    directory = str(tmp_path)
    answer = f"""
        from webhook.server.metrics import Metrics
        Metrics(multiprocess_dir={directory!r}).answered("validate", "denied", 0.001)
    """
    for _ in range(2):  # two worker processes, one after the other
        result = run_python(answer, {"PROMETHEUS_MULTIPROC_DIR": directory})
        assert result.returncode == 0, result.stderr
    scrape = f"""
        from webhook.server.metrics import Metrics
        print(Metrics(multiprocess_dir={directory!r}).render()[0].decode())
    """
    result = run_python(scrape, {"PROMETHEUS_MULTIPROC_DIR": directory})
    assert result.returncode == 0, result.stderr
    found = samples(result.stdout)
    key = ("gpu_admission_requests_total", (("endpoint", "validate"), ("verdict", "denied")))
    assert found[key] == 2


def test_a_directory_set_after_prometheus_client_was_imported_is_refused(
    tmp_path: Path,
) -> None:
    code = """
        import os, prometheus_client
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = {directory!r}
        from webhook.server.metrics import Metrics
        try:
            Metrics(multiprocess_dir={directory!r})
        except RuntimeError as exc:
            print(exc)
    """.format(directory=str(tmp_path))
    result = run_python(code, {})
    assert result.returncode == 0, result.stderr
    assert "must be set before prometheus_client is imported" in result.stdout
