"""The WSGI app through Flask's test client: every endpoint and every kind of bad input.

The policy is ``tests.serving.TEST_POLICY``: GPU Pods get a toleration patch, privileged
containers are warned about, GPU device host paths are audited, fractional GPUs are denied.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient
from gunicorn.http.errors import ChunkMissingTerminator, InvalidChunkSize, NoMoreData
from werkzeug.test import TestResponse

from tests import patching
from tests.serving import (
    INVALID_POLICY,
    STRICT_POLICY,
    TEST_POLICY,
    MountedDir,
    fixture_bytes,
    load_fixture,
    metric_labels,
    metric_value,
)
from webhook.policy.load import default_policy_path
from webhook.server.app import MAX_BODY_BYTES, create_app
from webhook.server.logs import JsonFormatter
from webhook.server.metrics import Metrics
from webhook.server.store import PolicyStore

JSON = "application/json"
GPU_POD = "admission-review-gpu-pod.json"
FRACTIONAL = "admission-review-fractional-gpu.json"
PRIVILEGED = "admission-review-privileged-gpu-pod.json"
HOSTPATH = "admission-review-gpu-hostpath.json"


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(TEST_POLICY)
    return path


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def store(policy_path: Path, metrics: Metrics) -> PolicyStore:
    # No rate limit: a rewritten file is seen by the next request.
    return PolicyStore(policy_path, metrics=metrics, check_interval=0)


@pytest.fixture
def client(store: PolicyStore, metrics: Metrics) -> FlaskClient:
    return create_app(store, metrics=metrics).test_client()


def post(client: FlaskClient, path: str, body: bytes | str, **kwargs: Any) -> TestResponse:
    kwargs.setdefault("content_type", JSON)
    return client.post(path, data=body, **kwargs)


def answer(reply: TestResponse) -> dict[str, Any]:
    """The AdmissionReview response of a 200 reply."""
    assert reply.status_code == 200, reply.get_data(as_text=True)
    assert reply.mimetype == JSON
    review = reply.get_json()
    assert review["apiVersion"] == "admission.k8s.io/v1"
    assert review["kind"] == "AdmissionReview"
    return review["response"]


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


def metrics_text(client: FlaskClient) -> str:
    reply = client.get("/metrics")
    assert reply.status_code == 200
    assert reply.mimetype == "text/plain"
    return reply.get_data(as_text=True)


# --------------------------------------------------------------------------- decisions


def test_validate_allows_a_gpu_pod_and_echoes_the_uid(client: FlaskClient) -> None:
    response = answer(post(client, "/validate", fixture_bytes(GPU_POD)))
    assert response["uid"] == load_fixture(GPU_POD)["request"]["uid"]
    assert response["allowed"] is True
    assert "patch" not in response


def test_mutate_returns_a_toleration_patch_that_applies(client: FlaskClient) -> None:
    review = load_fixture(GPU_POD)
    response = answer(post(client, "/mutate", json.dumps(review)))
    assert response["allowed"] is True
    patched = jsonpatch.apply_patch(review["request"]["object"], decoded_patch(response))
    assert {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}.items() <= (
        patched["spec"]["tolerations"][0].items()
    )


def test_validate_denies_a_fractional_gpu_with_its_reason(client: FlaskClient) -> None:
    response = answer(post(client, "/validate", fixture_bytes(FRACTIONAL)))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert '"0.5"' in response["status"]["message"]
    assert "whole number" in response["status"]["message"]


def test_validate_warns_about_a_privileged_gpu_container(client: FlaskClient) -> None:
    response = answer(post(client, "/validate", fixture_bytes(PRIVILEGED)))
    assert response["allowed"] is True
    assert any("privileged" in warning for warning in response["warnings"])


def test_validate_audits_a_gpu_device_host_path(client: FlaskClient) -> None:
    response = answer(post(client, "/validate", fixture_bytes(HOSTPATH)))
    assert response["allowed"] is True
    assert "warnings" not in response
    assert response["auditAnnotations"]["rules"] == "host-devices"


def test_record_mode_returns_no_patch_and_records_it(store: PolicyStore) -> None:
    metrics = Metrics()
    client = create_app(store, mutation_enabled=False, metrics=metrics).test_client()
    response = answer(post(client, "/mutate", fixture_bytes(GPU_POD)))
    assert response["allowed"] is True
    assert "patch" not in response
    assert "tolerations" in response["auditAnnotations"]["would-patch"]
    text = metrics_text(client)
    assert metric_value(text, "gpu_admission_mutations_total", outcome="recorded") == 1
    assert metric_value(text, "gpu_admission_mutations_total", outcome="applied") == 0


def test_the_fixtures_mean_what_their_names_say_under_the_default_policy() -> None:
    store = PolicyStore(default_policy_path())
    client = create_app(store).test_client()
    review = load_fixture(GPU_POD)
    assert review["request"]["namespace"] == "ml"
    assert answer(post(client, "/validate", json.dumps(review)))["allowed"] is True
    mutated = answer(post(client, "/mutate", json.dumps(review)))
    patched = jsonpatch.apply_patch(review["request"]["object"], decoded_patch(mutated))
    assert any(t["key"] == "nvidia.com/gpu" for t in patched["spec"]["tolerations"])
    assert answer(post(client, "/validate", fixture_bytes(FRACTIONAL)))["allowed"] is False


# --------------------------------------------------------------------------- bad input

VALID = fixture_bytes(GPU_POD)


def _review_without(*path: str) -> bytes:
    review = load_fixture(GPU_POD)
    target = review
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return json.dumps(review).encode()


def _review_with(value: Any, *path: str) -> bytes:
    review = load_fixture(GPU_POD)
    target = review
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return json.dumps(review).encode()


BAD_REQUESTS = {
    # name: (content type, body, status)
    "text/plain": ("text/plain", VALID, 415),
    "no content type": (None, VALID, 415),
    "form": ("application/x-www-form-urlencoded", VALID, 415),
    "utf-16 charset": ("application/json; charset=utf-16", VALID, 415),
    "empty body": (JSON, b"", 400),
    "truncated JSON": (JSON, VALID[:-10], 400),
    "not JSON": (JSON, b"{not json", 400),
    "not UTF-8": (JSON, b'{"kind": "\xff\xfe"}', 400),
    "UTF-16 bytes": (JSON, VALID.decode().encode("utf-16"), 400),
    "NaN": (JSON, b'{"a": NaN}', 400),
    "Infinity": (JSON, b'{"a": -Infinity}', 400),
    "nested too deeply": (JSON, b"[" * 100_000 + b"]" * 100_000, 400),
    "integer too long": (JSON, b"1" * 5_000, 400),
    "a list": (JSON, b"[]", 400),
    "a string": (JSON, b'"AdmissionReview"', 400),
    "null": (JSON, b"null", 400),
    "no request": (JSON, _review_without("request"), 400),
    "request not an object": (JSON, _review_with("x", "request"), 400),
    "no uid": (JSON, _review_without("request", "uid"), 400),
    "empty uid": (JSON, _review_with("", "request", "uid"), 400),
    "uid not a string": (JSON, _review_with(7, "request", "uid"), 400),
    "v1beta1": (JSON, _review_with("admission.k8s.io/v1beta1", "apiVersion"), 400),
    "no apiVersion": (JSON, _review_without("apiVersion"), 400),
    "wrong kind": (JSON, _review_with("AdmissionRequest", "kind"), 400),
    "object not an object": (JSON, _review_with([], "request", "object"), 400),
    "no operation": (JSON, _review_without("request", "operation"), 400),
    "unknown operation": (JSON, _review_with("EXPLODE", "request", "operation"), 400),
    "operation not a string": (JSON, _review_with(1, "request", "operation"), 400),
}


@pytest.mark.parametrize("endpoint", ["/validate", "/mutate"])
@pytest.mark.parametrize("case", BAD_REQUESTS, ids=str)
def test_bad_input_gets_a_4xx_json_error(client: FlaskClient, endpoint: str, case: str) -> None:
    content_type, body, status = BAD_REQUESTS[case]
    reply = client.post(endpoint, data=body, content_type=content_type)
    assert reply.status_code == status, reply.get_data(as_text=True)
    assert reply.mimetype == JSON
    error = reply.get_json()["error"]
    assert isinstance(error, str) and error
    assert "\n" not in error and "Traceback" not in error


def test_bad_input_is_counted_as_invalid(client: FlaskClient) -> None:
    post(client, "/validate", b"{not json")
    post(client, "/mutate", b"[]")
    text = metrics_text(client)
    assert metric_value(text, "gpu_admission_requests_total", verdict="invalid") == 2


def test_body_over_the_limit_is_refused_before_it_is_read(client: FlaskClient) -> None:
    reply = post(client, "/validate", b" " * (MAX_BODY_BYTES + 1))
    assert reply.status_code == 413
    assert "exceeds" in reply.get_json()["error"]


def test_chunked_body_over_the_limit_is_refused(client: FlaskClient) -> None:
    # No Content-Length: the limit applies while the stream is read.
    reply = client.post(
        "/validate",
        input_stream=io.BytesIO(b" " * (MAX_BODY_BYTES + 1)),
        content_type=JSON,
        headers={"Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert reply.status_code == 413
    assert reply.mimetype == JSON


def test_body_just_under_the_limit_is_read(client: FlaskClient) -> None:
    review = load_fixture(GPU_POD)
    body = json.dumps(review).encode()
    padded = body[:-1] + b" " * (MAX_BODY_BYTES - len(body)) + b"}"
    assert len(padded) == MAX_BODY_BYTES
    assert answer(post(client, "/validate", padded))["allowed"] is True


def test_unknown_path_and_wrong_method_get_json_errors(client: FlaskClient) -> None:
    missing = client.get("/nope")
    assert missing.status_code == 404 and missing.mimetype == JSON
    assert "error" in missing.get_json()
    wrong = client.get("/validate")
    assert wrong.status_code == 405 and wrong.mimetype == JSON
    assert "POST" in wrong.headers["Allow"]


def test_an_engine_failure_is_a_500_and_the_app_goes_on(
    client: FlaskClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(review: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"engine bug quoting the object: {json.dumps(review)}")

    with monkeypatch.context() as patched:
        patched.setattr("webhook.server.app.decide", broken)
        with caplog.at_level(logging.ERROR, logger="webhook.app"):
            reply = post(client, "/validate", VALID)
    assert reply.status_code == 500
    assert reply.get_json() == {"error": "internal error while deciding the review"}
    [record] = [r for r in caplog.records if r.name == "webhook.app"]
    assert record.fields["uid"] == load_fixture(GPU_POD)["request"]["uid"]
    assert record.fields["error"] == "RuntimeError"
    assert "in broken" in record.fields["traceback"]
    assert "nvcr.io" not in JsonFormatter().format(record)

    assert answer(post(client, "/validate", VALID))["allowed"] is True
    text = metrics_text(client)
    assert metric_value(text, "gpu_admission_requests_total", verdict="error") == 1


# --------------------------------------------------------------------------- policy


def test_without_a_policy_admission_answers_503_never_allowed(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "missing.yaml", check_interval=0)
    client = create_app(store).test_client()
    for endpoint in ("/validate", "/mutate"):
        reply = post(client, endpoint, VALID)
        assert reply.status_code == 503
        assert "no valid policy" in reply.get_json()["error"]
        assert "allowed" not in reply.get_data(as_text=True)
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert "missing.yaml" in ready.get_json()["reason"]
    assert client.get("/healthz").status_code == 200


def test_an_invalid_policy_at_start_up_is_not_ready(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(INVALID_POLICY)
    metrics = Metrics()
    client = create_app(PolicyStore(path, metrics=metrics), metrics=metrics).test_client()
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert "bogusField" in ready.get_json()["reason"]
    assert post(client, "/validate", VALID).status_code == 503
    text = metrics_text(client)
    assert metric_value(text, "gpu_admission_policy_reload_errors_total") == 1
    assert metric_value(text, "gpu_admission_requests_total", verdict="unavailable") == 1


def test_a_changed_policy_takes_effect_and_an_invalid_one_is_refused(
    client: FlaskClient, policy_path: Path, store: PolicyStore
) -> None:
    first = store.policy
    assert first is not None
    assert answer(post(client, "/validate", fixture_bytes(PRIVILEGED)))["allowed"] is True

    policy_path.write_text(STRICT_POLICY)
    assert answer(post(client, "/validate", fixture_bytes(PRIVILEGED)))["allowed"] is False
    second = store.policy
    assert second is not None and second.sha256 != first.sha256

    policy_path.write_text(INVALID_POLICY)
    assert answer(post(client, "/validate", fixture_bytes(PRIVILEGED)))["allowed"] is False
    assert store.policy is second
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json()["policy"]["sha256"] == second.sha256

    text = metrics_text(client)
    assert metric_value(text, "gpu_admission_policy_reloads_total") == 1
    assert metric_value(text, "gpu_admission_policy_reload_errors_total") == 1
    assert metric_labels(text, "gpu_admission_policy_info", "sha256") == {second.sha256}
    assert metric_labels(text, "gpu_admission_policy_info", "sha256", 0.0) == {first.sha256}


def test_store_follows_a_configmap_symlink_swap(tmp_path: Path) -> None:
    mount = MountedDir(tmp_path / "policy", {"policy.yaml": TEST_POLICY.encode()})
    store = PolicyStore(mount.path("policy.yaml"), check_interval=0)
    first = store.policy
    assert first is not None

    mount.update({"policy.yaml": STRICT_POLICY.encode()})
    assert store.reload_if_changed() is True
    assert store.policy is not None and store.policy.sha256 != first.sha256

    # A new mount generation with the same content is no reload.
    mount.update({"policy.yaml": STRICT_POLICY.encode()})
    assert store.reload_if_changed() is False


def test_store_checks_at_most_once_per_interval(policy_path: Path) -> None:
    now = [100.0]
    store = PolicyStore(policy_path, check_interval=1.0, clock=lambda: now[0])
    first = store.policy
    policy_path.write_text(STRICT_POLICY)
    now[0] += 0.5
    assert store.reload_if_changed() is False
    assert store.policy is first
    now[0] += 0.6
    assert store.reload_if_changed() is True


def test_store_refuses_a_deleted_policy_once_and_keeps_the_last(policy_path: Path) -> None:
    metrics = Metrics()
    store = PolicyStore(policy_path, metrics=metrics, check_interval=0)
    first = store.policy
    os.unlink(policy_path)
    for _ in range(3):
        assert store.reload_if_changed() is False
    assert store.policy is first
    text = metrics.render()[0].decode()
    assert metric_value(text, "gpu_admission_policy_reload_errors_total") == 1


def test_store_logs_the_lint_warnings_of_a_policy_it_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUAdmissionPolicy\n"
        "metadata: {name: warned}\nspec:\n"
        "  gpuNodeTaints: [{key: nvidia.com/gpu, effect: NoSchedule}]\n  tenants:\n"
        "    - namespaces: [kube-system]\n      exemptions:\n"
        "        - reason: operators\n        - reason: agents\n"
    )
    with caplog.at_level(logging.WARNING, logger="webhook.policy_store"):
        store = PolicyStore(path, check_interval=0)
    assert store.policy is not None  # a warning never refuses a policy
    [record] = [r for r in caplog.records if r.name == "webhook.policy_store"]
    assert record.getMessage() == "policy lint warning"
    assert record.fields == {
        "source": str(path),
        "line": 10,
        "path": "spec.tenants[0].exemptions[1]",
        "warning": "redundant exemption: tenants[0].exemptions[0] already exempts every namespace "
        "it names (kube-system) from every rule, for every service account",
    }
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="webhook.policy_store"):
        PolicyStore(default_policy_path(), check_interval=0)
    assert [r for r in caplog.records if r.name == "webhook.policy_store"] == []


# --------------------------------------------------------------------------- probes, metrics, logs


def test_healthz(client: FlaskClient) -> None:
    reply = client.get("/healthz")
    assert reply.status_code == 200
    assert reply.get_json() == {"status": "ok"}


def test_readyz_names_the_policy_in_force(client: FlaskClient, store: PolicyStore) -> None:
    reply = client.get("/readyz")
    assert reply.status_code == 200
    assert store.policy is not None
    assert reply.get_json() == {
        "status": "ready",
        "policy": {"source": store.policy.source, "sha256": store.policy.sha256},
    }


def test_readyz_fails_with_the_reason_of_a_failing_check(store: PolicyStore) -> None:
    draining = [False]
    client = create_app(
        store, readiness_checks=[lambda: "draining" if draining[0] else None]
    ).test_client()
    assert client.get("/readyz").status_code == 200
    draining[0] = True
    reply = client.get("/readyz")
    assert reply.status_code == 503
    assert reply.get_json() == {"status": "not ready", "reason": "draining"}
    # Not ready is not unavailable: admission goes on while the endpoint is drained.
    assert post(client, "/validate", VALID).status_code == 200


def test_metrics_count_requests_violations_mutations_and_latency(client: FlaskClient) -> None:
    post(client, "/validate", fixture_bytes(GPU_POD))
    post(client, "/validate", fixture_bytes(FRACTIONAL))
    post(client, "/mutate", fixture_bytes(FRACTIONAL))
    post(client, "/mutate", fixture_bytes(GPU_POD))
    post(client, "/validate", fixture_bytes(PRIVILEGED))
    text = metrics_text(client)

    def requests(endpoint: str, verdict: str) -> float:
        return metric_value(
            text, "gpu_admission_requests_total", endpoint=endpoint, verdict=verdict
        )

    assert requests("validate", "allowed") == 2
    assert requests("validate", "denied") == 1
    assert requests("mutate", "denied") == 1
    assert requests("mutate", "allowed") == 1
    # From /validate only: the /mutate denial of the same object is not counted again.
    violations = "gpu_admission_violations_total"
    assert metric_value(text, violations, rule="gpu-quantity", mode="Enforce") == 1
    assert metric_value(text, violations, rule="privileged", mode="Warn") == 1
    assert metric_value(text, "gpu_admission_mutations_total", outcome="applied") == 1
    assert metric_value(text, "gpu_admission_decision_seconds_count") == 5
    assert metric_value(text, "gpu_admission_decision_seconds_bucket", le="0.0001") >= 0
    assert metric_labels(text, "gpu_admission_policy_info", "sha256") != set()


def test_one_json_log_line_per_decision_without_object_contents(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    review = load_fixture(PRIVILEGED)
    container = review["request"]["object"]["spec"]["containers"][0]
    container["env"] = [{"name": "WANDB_API_KEY", "value": "s3cr3t-token"}]
    review["request"]["dryRun"] = True
    with caplog.at_level(logging.INFO, logger="webhook.decisions"):
        post(client, "/validate", json.dumps(review))
    [record] = [r for r in caplog.records if r.name == "webhook.decisions"]
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["uid"] == review["request"]["uid"]
    assert entry["kind"] == "Pod"
    assert entry["namespace"] == "ml"
    assert entry["name"] == "debug-privileged"
    assert entry["operation"] == "CREATE"
    assert entry["endpoint"] == "validate"
    assert entry["verdict"] == "allowed"
    assert entry["rules"] == ["privileged"]
    assert entry["modes"] == ["Warn"]
    assert entry["dry_run"] is True
    assert entry["duration_ms"] >= 0
    for secret in ("s3cr3t-token", "WANDB_API_KEY", "nvcr.io"):
        assert secret not in line


def test_decisions_do_not_share_state_between_apps(store: PolicyStore) -> None:
    first = create_app(store, metrics=Metrics()).test_client()
    second = create_app(store, metrics=Metrics()).test_client()
    post(first, "/validate", VALID)
    assert metric_value(metrics_text(first), "gpu_admission_requests_total") == 1
    assert metric_value(metrics_text(second), "gpu_admission_requests_total") == 0


class _BrokenBody(io.RawIOBase):
    """A request body whose reading fails as gunicorn's readers fail."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        raise self.error


@pytest.mark.parametrize(
    ("error", "logged"),
    [
        (InvalidChunkSize(b"zz"), False),
        (ChunkMissingTerminator(b"XX"), False),
        (NoMoreData(b""), True),
        (ConnectionResetError(), True),
    ],
    ids=["bad-chunk-size", "missing-crlf", "no-more-data", "reset"],
)
def test_a_body_that_cannot_be_read_is_the_clients_error(
    client: FlaskClient, metrics: Metrics, caplog: pytest.LogCaptureFixture, error, logged
) -> None:
    with caplog.at_level(logging.INFO, logger="webhook.app"):
        response = client.post(
            "/validate",
            headers={"Content-Type": "application/json", "Content-Length": "100"},
            environ_overrides={
                "wsgi.input": io.BufferedReader(_BrokenBody(error)),
                "CONTENT_LENGTH": "100",
            },
        )
    assert response.status_code == 400
    assert response.is_json and "error" in response.get_json()
    levels = {r.levelname for r in caplog.records if r.name == "webhook.app"}
    assert "ERROR" not in levels
    assert ("INFO" in levels) is logged


DECISION = dict(
    endpoint="validate",
    request={
        "uid": "u1",
        "kind": {"kind": "Pod"},
        "namespace": "ml",
        "name": "p\u00e9\n",  # non-ASCII and a newline: still one line, as UTF-8
        "operation": "CREATE",
        "dryRun": True,
    },
    allowed=False,
    violations=[("privileged", "Enforce")],
    mutation="none",
    duration_ms=0.1234,
)


@contextlib.contextmanager
def json_logging(stream: Any) -> Iterator[None]:
    """The server's logging configuration, writing to ``stream``, for the duration."""
    from webhook.server.logs import configure_logging

    root = logging.getLogger("webhook")
    saved = (list(root.handlers), root.propagate, root.level)
    configure_logging(stream=stream)
    try:
        yield
    finally:
        root.handlers[:], root.propagate = saved[0], saved[1]
        root.setLevel(saved[2])


@pytest.mark.parametrize("to_file", [False, True], ids=["stream", "file descriptor"])
def test_the_decision_line_is_the_one_the_formatter_writes(
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    to_file: bool,
) -> None:
    from webhook.server.logs import DECISION_LOGGER, log_decision

    logger = logging.getLogger(DECISION_LOGGER)
    # A file: the line is written to its descriptor; a stream without one: through it.
    writes: list[int] = []
    real_write = os.write

    def counted_write(fd: int, data: Any) -> int:
        writes.append(fd)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counted_write)
    with open(tmp_path / "log", "w+", encoding="utf-8") if to_file else io.StringIO() as stream:
        with json_logging(stream):
            log_decision(logger, **DECISION)
            log_decision(logger, **DECISION)
        assert writes == ([stream.fileno()] * 2 if to_file else [])
        stream.seek(0)
        lines = stream.read().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert first.pop("time") and second.pop("time") and first == second
    direct = json.loads(lines[0])
    # Unconfigured (here: pytest's handler on the root logger), it goes through logging.
    with caplog.at_level(logging.INFO, logger=DECISION_LOGGER):
        log_decision(logger, **DECISION)
    (record,) = [r for r in caplog.records if r.name == DECISION_LOGGER]
    formatted = json.loads(JsonFormatter().format(record))
    assert direct.keys() == formatted.keys()
    assert {k: v for k, v in direct.items() if k != "time"} == {
        k: v for k, v in formatted.items() if k != "time"
    }
    assert direct["verdict"] == "denied" and direct["dry_run"] is True
    assert direct["name"] == "p\u00e9\n" and direct["duration_ms"] == 0.123
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", direct["time"])


def test_a_full_non_blocking_log_pipe_gets_the_decision_line_whole() -> None:
    from webhook.server.logs import DECISION_LOGGER, log_decision

    # A pipe another process set non-blocking, nearly full: the line does not fit at once.
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"x" * 63 + b"\n")
    os.read(read_end, 4096)
    many = dict(DECISION, violations=[("privileged", "Enforce")] * 400)  # about 10 KB
    drained: list[bytes] = []

    def reader() -> None:
        time.sleep(0.3)  # while the writer waits for room
        while chunk := os.read(read_end, 65536):
            drained.append(chunk)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        with open(write_end, "w", closefd=False) as stream, json_logging(stream):
            log_decision(logging.getLogger(DECISION_LOGGER), **many)
    finally:
        os.close(write_end)
        thread.join(timeout=10)
        os.close(read_end)
    *junk, line, end = b"".join(drained).split(b"\n")
    assert end == b"" and set(junk) == {b"x" * 63}
    assert json.loads(line)["rules"] == ["privileged"] * 400


def test_a_log_pipe_nobody_reads_costs_a_line_not_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from webhook.server import logs

    monkeypatch.setattr(logs, "LINE_DEADLINE_SECONDS", 0.3)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:  # full, and nobody reads it
            os.write(write_end, b"x" * 63 + b"\n")
    try:
        started = time.monotonic()
        with open(write_end, "w", closefd=False) as stream, json_logging(stream):
            logs.log_decision(logging.getLogger(logs.DECISION_LOGGER), **DECISION)
        assert time.monotonic() - started < 3  # the line is lost; the server goes on
    finally:
        os.close(write_end)
        os.close(read_end)


def test_a_log_descriptor_whose_reader_is_gone_does_not_fail_the_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from webhook.server.logs import DECISION_LOGGER, log_decision

    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails (EPIPE): not a byte of the line is written
    stream = open(write_end, "w", closefd=False)  # noqa: SIM115 (closed below)
    try:
        with json_logging(stream):
            log_decision(logging.getLogger(DECISION_LOGGER), **DECISION)  # does not raise
        # Handed to logging, which reports what it could not write and goes on.
        assert "Logging error" in capsys.readouterr().err
    finally:
        with contextlib.suppress(BrokenPipeError):  # what logging left in the stream's buffer
            stream.close()
        os.close(write_end)


def test_identifying_fields_are_logged_short_and_as_strings(tmp_path: Path) -> None:
    from webhook.server.logs import DECISION_LOGGER, IDENTIFIER_CHARS, log_decision

    nested: Any = "deep"
    for _ in range(1000):  # deeper than the standard library's encoder can go
        nested = [nested]
    request = dict(DECISION["request"], uid="u" * 20_000, name=nested, namespace=7)
    with open(tmp_path / "log", "w+", encoding="utf-8") as stream:
        with json_logging(stream):
            log_decision(logging.getLogger(DECISION_LOGGER), **dict(DECISION, request=request))
        stream.seek(0)
        (line,) = stream.read().splitlines()
    entry = json.loads(line)
    assert entry["uid"] == "u" * IDENTIFIER_CHARS + "..."
    assert entry["name"] is None and entry["namespace"] is None
    assert len(line) < 4096  # PIPE_BUF: written to a pipe in one piece


def test_a_long_review_whose_decision_was_lost_is_503_and_a_warning(
    store: PolicyStore, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    from webhook.server.child import ChildDecisionLost

    def lose(work: Any) -> Any:
        raise ChildDecisionLost("the process deciding a long review ended without an answer")

    client = create_app(store, metrics=metrics, run_long=lose).test_client()
    body = json.loads(fixture_bytes(GPU_POD))
    body["request"]["object"]["metadata"]["annotations"] = {"padding": "x" * 70_000}
    with caplog.at_level(logging.INFO, logger="webhook.app"):
        reply = post(client, "/validate", json.dumps(body))
    assert reply.status_code == 503 and reply.mimetype == JSON
    assert "ended without an answer" in reply.get_json()["error"]
    levels = {r.levelname for r in caplog.records if r.name == "webhook.app"}
    assert levels == {"WARNING"}
    text = metrics_text(client)
    assert metric_value(text, "gpu_admission_requests_total", verdict="unavailable") == 1
    assert metric_value(text, "gpu_admission_requests_total", verdict="error") == 0


def test_a_review_nested_deeper_than_python_can_print_is_a_400(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    import sys

    body = json.loads(fixture_bytes(GPU_POD))
    nested: Any = "sa"
    for _ in range(1010):  # JSON (and orjson) allow 1,024 levels; Python's repr 1,000
        nested = [nested]
    body["request"]["object"]["spec"]["serviceAccountName"] = nested
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(5000)  # only to write the test's body
    try:
        text = json.dumps(body)
    finally:
        sys.setrecursionlimit(limit)
    with caplog.at_level(logging.INFO, logger="webhook.app"):
        reply = post(client, "/validate", text)
    assert reply.status_code == 400 and reply.mimetype == JSON
    assert "nested too deeply" in reply.get_json()["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_small_body_of_many_objects_is_decided_as_a_long_one(
    store: PolicyStore, metrics: Metrics
) -> None:
    """Work grows with the objects of a review, not its bytes: thousands of empty containers
    fit in a few kilobytes and would hold the event loop."""
    long_runs = []

    def run_long(work: Any) -> Any:
        long_runs.append(1)
        return work()

    client = create_app(store, metrics=metrics, run_long=run_long).test_client()
    typical = fixture_bytes(GPU_POD)
    assert post(client, "/validate", typical).status_code == 200
    assert long_runs == []
    body = json.loads(typical)
    body["request"]["object"]["spec"]["containers"] += [{}] * 2500
    text = json.dumps(body)
    assert len(text) < 64 * 1024
    assert post(client, "/validate", text).status_code == 200
    assert long_runs == [1]


def test_a_workflow_of_many_templates_is_handed_to_a_long_run(
    store: PolicyStore, metrics: Metrics
) -> None:
    """Found while its templates are read: judged again where it may take long, and the
    answer is that judgement (a Workflow of 600 templates fits in 17 KB)."""
    long_runs = []

    def run_long(work: Any) -> Any:
        long_runs.append(1)
        return work()

    client = create_app(store, metrics=metrics, run_long=run_long).test_client()
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "w", "namespace": "team-a"},
        "spec": {"templates": [{"name": f"t{i}", "container": {}} for i in range(600)]},
    }
    workflow["spec"]["templates"][0]["container"]["resources"] = {
        "limits": {"nvidia.com/gpu": "0.5"}
    }
    review = patching.review(workflow, kind="Workflow", namespace="team-a")
    reply = post(client, "/validate", json.dumps(review))
    assert reply.status_code == 200
    assert long_runs == [1]
    assert reply.get_json()["response"]["uid"] == review["request"]["uid"]
    assert reply.get_json()["response"]["allowed"] is False


def test_the_item_count_is_exact_where_the_scan_is_skipped() -> None:
    """Bodies shorter than the item limit are not scanned: none of them can reach it."""
    from webhook.server.app import _is_long
    from webhook.server.settings import LONG_BODY_ITEMS

    assert not _is_long(b"," * (LONG_BODY_ITEMS - 1))
    assert _is_long(b"," * LONG_BODY_ITEMS)
    assert not _is_long(b" " * LONG_BODY_ITEMS + b"," * (LONG_BODY_ITEMS - 1))
    # Members of one object count as much as elements of an array.
    limits = {f"nvidia.com/mig-{i}g.5gb": "1" for i in range(LONG_BODY_ITEMS + 1)}
    assert _is_long(json.dumps({"limits": limits}).encode())
    assert _is_long(json.dumps([{}] * (LONG_BODY_ITEMS + 1)).encode())


def test_the_servers_patch_encoding_is_the_standard_librarys() -> None:
    """The server writes patches with orjson: the same bytes as the core's own encoder for
    what a plan holds, and the standard library's for what orjson cannot write."""
    from webhook.admission.response import compact_json
    from webhook.server.app import _encode_json

    operations = [
        {"op": "add", "path": "/spec/tolerations", "value": [{"key": "nvidia.com/gpu"}]},
        {"op": "add", "path": "/metadata/annotations/a~1b", "value": "pool=a100,w=10"},
    ]
    assert _encode_json(operations) == compact_json(operations)
    huge = [{"op": "add", "path": "/x", "value": 2**70}]
    assert json.loads(_encode_json(huge)) == huge
