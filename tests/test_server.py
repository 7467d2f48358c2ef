"""The real ``gpu-admission serve``: gunicorn's arbiter and its worker, TLS on a free 127.0.0.1
port.

Each test talks to the server the way the API server does: HTTPS verified against the CA,
several requests on one kept-alive connection. Waits are bounded and polled.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from tests.serving import (
    INVALID_POLICY,
    STRICT_POLICY,
    TEST_POLICY,
    MountedDir,
    Server,
    client_context,
    fixture_bytes,
    load_fixture,
    make_certificates,
    metric_labels,
    metric_value,
    peer_serial,
    post_json,
    read_all,
    request,
    wait_until,
)
from webhook import parse_policy
from webhook.certs.pki import GeneratedCertificates
from webhook.server.app import MAX_BODY_BYTES

GPU_POD = fixture_bytes("admission-review-gpu-pod.json")
FRACTIONAL = fixture_bytes("admission-review-fractional-gpu.json")
PRIVILEGED = fixture_bytes("admission-review-privileged-gpu-pod.json")
HOSTPATH = fixture_bytes("admission-review-gpu-hostpath.json")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> GeneratedCertificates:
    return make_certificates(tmp_path_factory.mktemp("pki"))


def write_policy(directory: Path, text: str = TEST_POLICY) -> Path:
    path = directory / "policy.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, pki: GeneratedCertificates
) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("server")
    with tls_server(directory, pki) as running:
        yield running


def tls_server(directory: Path, pki: GeneratedCertificates, **options: Any) -> Server:
    """The server over TLS with the test policy written in ``directory``, logging there."""
    return Server(
        policy=write_policy(directory),
        cert=pki.tls_cert,
        key=pki.tls_key,
        ca=pki.ca_cert,
        log_path=directory / "server.log",
        **options,
    )


def admission(reply_body: bytes) -> dict:
    return json.loads(reply_body)["response"]


# --------------------------------------------------------------------------- decisions


def test_one_kept_alive_connection_serves_every_kind_of_answer(server: Server) -> None:
    conn = server.connection()
    try:
        reply = post_json(conn, "/validate", GPU_POD)
        sock = conn.sock
        assert reply.status == 200
        assert reply.headers["Content-Type"] == "application/json"
        assert admission(reply.body)["allowed"] is True

        denied = admission(post_json(conn, "/validate", FRACTIONAL).body)
        assert denied["allowed"] is False
        assert "must be a whole number" in denied["status"]["message"]

        warned = admission(post_json(conn, "/validate", PRIVILEGED).body)
        assert warned["allowed"] is True
        assert any("privileged" in w for w in warned["warnings"])

        audited = admission(post_json(conn, "/validate", HOSTPATH).body)
        assert audited["allowed"] is True
        assert audited["auditAnnotations"]["rules"] == "host-devices"

        mutated = admission(post_json(conn, "/mutate", GPU_POD).body)
        patch = json.loads(base64.b64decode(mutated["patch"]))
        pod = load_fixture("admission-review-gpu-pod.json")["request"]["object"]
        patched = jsonpatch.apply_patch(pod, patch)
        assert patched["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"

        # Every answer came over the first TCP connection: keep-alive held.
        assert conn.sock is sock
        assert reply.headers["Connection"] == "keep-alive"
    finally:
        conn.close()


def test_a_connection_idle_longer_than_gunicorns_default_keepalive_still_works(
    server: Server,
) -> None:
    conn = server.connection()
    try:
        assert post_json(conn, "/validate", GPU_POD).status == 200
        sock = conn.sock
        time.sleep(6)  # gunicorn's default keepalive (2 s) would have closed it
        # A closed connection would fail here: http.client does not retry a request.
        assert post_json(conn, "/validate", GPU_POD).status == 200
        assert conn.sock is sock
    finally:
        conn.close()


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_tls_uses_forward_secret_aead_ciphers(server: Server, version: ssl.TLSVersion) -> None:
    assert server.ca is not None
    context = client_context(server.ca)
    context.minimum_version = context.maximum_version = version
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=5, context=context)
    try:
        assert request(conn, "GET", "/healthz").status == 200
        assert isinstance(conn.sock, ssl.SSLSocket)
        name, negotiated, _ = conn.sock.cipher()
        assert negotiated == version.name.replace("_", ".")
        assert "GCM" in name or "CHACHA20" in name
        if version is ssl.TLSVersion.TLSv1_2:
            assert name.startswith("ECDHE-")
        assert conn.sock.selected_alpn_protocol() in (None, "http/1.1")
    finally:
        conn.close()


# --------------------------------------------------------------------------- bad input


BAD_REQUESTS = [
    ("text/plain", GPU_POD, 415),
    ("application/json", b"{not json", 400),
    ("application/json", b'{"kind": "\xff"}', 400),
    ("application/json", b"[]", 400),
    ("application/json", b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', 400),
    (
        "application/json",
        GPU_POD.replace(b'"admission.k8s.io/v1"', b'"admission.k8s.io/v1beta1"'),
        400,
    ),
]


def test_malformed_inputs_get_json_errors_and_the_connection_stays_usable(
    server: Server,
) -> None:
    conn = server.connection()
    try:
        for content_type, body, status in BAD_REQUESTS:
            for endpoint in ("/validate", "/mutate"):
                reply = request(conn, "POST", endpoint, body, {"Content-Type": content_type})
                assert reply.status == status, (endpoint, body[:60], reply.body)
                assert reply.headers["Content-Type"] == "application/json"
                assert set(json.loads(reply.body)) == {"error"}
        assert post_json(conn, "/validate", GPU_POD).status == 200
    finally:
        conn.close()


def test_an_oversized_body_is_refused_from_its_content_length(server: Server) -> None:
    conn = server.connection()
    try:
        # Only the headers are sent: the answer must not wait for 8 MiB of body.
        conn.putrequest("POST", "/validate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
        conn.endheaders()
        reply = conn.getresponse()
        assert reply.status == 413
        assert "exceeds" in json.loads(reply.read())["error"]
    finally:
        conn.close()


def test_chunked_bodies_are_refused_with_411_and_the_connection_closes(
    server: Server, pki: GeneratedCertificates
) -> None:
    # The API server always sends a Content-Length; a chunked body's size is unknown until
    # read, and its chunk and trailer parsing is work a client could make the worker do.
    # Sent in one write: the server answers after the headers and closes, and a client still
    # writing chunks then would see its write fail instead of reading the answer.
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(GPU_POD), GPU_POD)
    answer = exchange(
        server,
        pki,
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + body,
    )
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 411"), answer[:200]
    assert b"content-type: application/json" in head.lower()
    assert b"connection: close" in head.lower()
    assert "Content-Length" in json.loads(payload)["error"]
    # Even on a GET, and a malformed one: one answer, then the connection closes.
    answer = exchange(
        server,
        pki,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert answer.count(b"HTTP/1.1 ") == 1 and answer.startswith(b"HTTP/1.1 411"), answer


def test_garbage_on_the_wire_is_no_server_error(server: Server, pki: GeneratedCertificates) -> None:
    # Not HTTP at all, over TLS.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        with client_context(pki.ca_cert).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"\x00\x01GARBAGE\r\n\r\n")
            answer = tls.recv(4096)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
    # Plain HTTP on the TLS port.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            raw.recv(4096)
        except OSError:
            pass
    assert server.get("/healthz").status == 200


# --------------------------------------------------------------------------- metrics


def test_metrics_count_every_answer_as_it_is_given(server: Server) -> None:
    before = server.metrics()
    for _ in range(4):
        server_conn = server.connection()
        try:
            post_json(server_conn, "/validate", FRACTIONAL)
            post_json(server_conn, "/mutate", GPU_POD)
        finally:
            server_conn.close()
    expected = {
        ("gpu_admission_requests_total", (("endpoint", "validate"), ("verdict", "denied"))): 4,
        ("gpu_admission_requests_total", (("endpoint", "mutate"), ("verdict", "allowed"))): 4,
        ("gpu_admission_violations_total", (("mode", "Enforce"), ("rule", "gpu-quantity"))): 4,
        ("gpu_admission_mutations_total", (("outcome", "applied"),)): 4,
        ("gpu_admission_decision_seconds_count", ()): 8,
    }

    # Counted as answered: the next scrape sees them all.
    after = server.metrics()
    deltas = {
        (name, labels): metric_value(after, name, **dict(labels))
        - metric_value(before, name, **dict(labels))
        for name, labels in expected
    }
    assert deltas == expected
    expiry = metric_value(after, "gpu_admission_certificate_expiry_timestamp_seconds")
    assert expiry == pytest.approx(time.time() + 365 * 86400, abs=86400)


def test_a_killed_worker_is_replaced_and_serves_at_once(
    tmp_path: Path, pki: GeneratedCertificates
) -> None:
    """One worker per Pod: the arbiter replaces a worker that died, and the new one serves
    with the policy loaded; its counters start again from zero, as a restarted process's."""
    with tls_server(tmp_path, pki) as server:
        (old_worker,) = server.worker_pids()
        conn = server.connection()
        try:
            for _ in range(5):
                assert post_json(conn, "/validate", GPU_POD).status == 200
        finally:
            conn.close()
        os.kill(int(old_worker), signal.SIGKILL)
        killed = time.monotonic()
        wait_until(
            lambda: server.worker_pids() not in (set(), {old_worker}),
            timeout=15,
            what="a new worker",
        )
        wait_until(lambda: server.get("/readyz").status == 200, timeout=15, what="ready again")
        replaced_in = time.monotonic() - killed
        conn = server.connection()
        try:
            assert admission(post_json(conn, "/validate", FRACTIONAL).body)["allowed"] is False
        finally:
            conn.close()
        assert metric_value(server.metrics(), "gpu_admission_requests_total") == 1
        assert replaced_in < 5, replaced_in


# --------------------------------------------------------------------------- policy


def test_policy_changes_while_serving_and_an_invalid_one_is_refused(
    tmp_path: Path, pki: GeneratedCertificates
) -> None:
    mount = MountedDir(tmp_path / "policy", {"policy.yaml": TEST_POLICY.encode()})
    first = parse_policy(TEST_POLICY, "x").sha256
    strict = parse_policy(STRICT_POLICY, "x").sha256
    with Server(
        policy=mount.path("policy.yaml"),
        cert=pki.tls_cert,
        key=pki.tls_key,
        ca=pki.ca_cert,
        log_path=tmp_path / "server.log",
    ) as server:
        conn = server.connection()
        try:
            assert admission(post_json(conn, "/validate", PRIVILEGED).body)["allowed"] is True

            mount.update({"policy.yaml": STRICT_POLICY.encode()})
            # The worker moves to the new policy, with or without traffic.
            wait_until(
                lambda: (
                    metric_labels(server.metrics(), "gpu_admission_policy_info", "sha256")
                    == {strict}
                ),
                timeout=15,
                what="the worker on the new policy",
            )
            assert admission(post_json(conn, "/validate", PRIVILEGED).body)["allowed"] is False
            assert server.get("/readyz").json()["policy"]["sha256"] == strict

            mount.update({"policy.yaml": INVALID_POLICY.encode()})

            def refused() -> str | None:
                text = server.metrics()
                errors = metric_value(text, "gpu_admission_policy_reload_errors_total")
                return text if errors >= 1 else None

            text = wait_until(refused, timeout=15, what="the invalid policy refused")
            assert metric_labels(text, "gpu_admission_policy_info", "sha256") == {strict}
            assert metric_labels(text, "gpu_admission_policy_info", "sha256", 0.0) == {first}
            assert metric_value(text, "gpu_admission_policy_reloads_total") == 1
            ready = server.get("/readyz")
            assert ready.status == 200
            assert ready.json()["policy"]["sha256"] == strict
            assert admission(post_json(conn, "/validate", PRIVILEGED).body)["allowed"] is False
        finally:
            conn.close()
        refusals = [
            r for r in server.log_records() if r.get("message", "").startswith("policy refused")
        ]
        assert refusals and all("bogusField" in r["error"] for r in refusals)


def test_a_missing_policy_at_start_up_is_not_ready_until_it_appears(tmp_path: Path, pki) -> None:
    policy = tmp_path / "policy.yaml"
    with Server(
        policy=policy,
        cert=pki.tls_cert,
        key=pki.tls_key,
        ca=pki.ca_cert,
        log_path=tmp_path / "server.log",
    ).start(expect_ready=False) as server:
        ready = server.get("/readyz")
        assert ready.status == 503
        assert "policy.yaml" in ready.json()["reason"]
        conn = server.connection()
        try:
            reply = post_json(conn, "/validate", GPU_POD)
            assert reply.status == 503
            assert "allowed" not in reply.json().get("error", "allowed")
        finally:
            conn.close()
        assert server.get("/healthz").status == 200

        policy.write_text(TEST_POLICY)
        wait_until(lambda: server.get("/readyz").status == 200, timeout=15, what="ready")


# --------------------------------------------------------------------------- certificates


def test_certificate_rotation_while_serving(tmp_path: Path, pki: GeneratedCertificates) -> None:
    mount = MountedDir(tmp_path / "tls", read_all([pki.tls_cert, pki.tls_key]))
    with Server(
        policy=write_policy(tmp_path),
        cert=mount.path("tls.crt"),
        key=mount.path("tls.key"),
        ca=pki.ca_cert,
        log_path=tmp_path / "server.log",
    ) as server:
        old_conn = server.connection()
        assert post_json(old_conn, "/validate", GPU_POD).status == 200
        old_serial = peer_serial(old_conn)

        failures: list[str] = []
        served = [0]
        stop = threading.Event()

        def new_connections() -> None:
            # A fresh handshake per request, all through the rotation.
            while not stop.is_set():
                conn = server.connection(timeout=5)
                try:
                    reply = post_json(conn, "/validate", GPU_POD)
                    if reply.status != 200:
                        failures.append(f"status {reply.status}")
                    served[0] += 1
                except (OSError, http.client.HTTPException) as exc:
                    failures.append(repr(exc))
                finally:
                    conn.close()

        hammer = threading.Thread(target=new_connections)
        hammer.start()
        try:
            renewed = make_certificates(tmp_path / "renewed", ca=pki)
            mount.update(read_all([renewed.tls_cert, renewed.tls_key]))

            def serials_in_a_row() -> bool:
                seen = set()
                for _ in range(6):
                    conn = server.connection()
                    try:
                        request(conn, "GET", "/healthz")
                        seen.add(peer_serial(conn))
                    finally:
                        conn.close()
                return seen == {_serial(renewed.tls_cert)}

            wait_until(serials_in_a_row, timeout=20, what="the renewed certificate")
            # The worker moves to it, whether or not it accepted a connection meanwhile.
            wait_until(
                lambda: (
                    metric_value(
                        server.metrics(), "gpu_admission_certificate_expiry_timestamp_seconds"
                    )
                    == pytest.approx(renewed.not_after.timestamp(), abs=1)
                ),
                timeout=20,
                what="the expiry metric to show the renewed certificate",
            )

            # A half-done rotation (a certificate without its key) is refused; the
            # renewed certificate stays in use.
            third = make_certificates(tmp_path / "third", ca=pki)
            mount.update(
                {"tls.crt": third.tls_cert.read_bytes(), "tls.key": renewed.tls_key.read_bytes()}
            )
            wait_until(
                lambda: any(
                    r.get("message") == "new TLS certificate refused, serving the previous one"
                    for r in server.log_records()
                ),
                timeout=15,
                what="the mismatched pair to be refused",
            )
            assert serials_in_a_row()
        finally:
            stop.set()
            hammer.join(timeout=15)

        # The connection opened before the rotation still works, with its old certificate.
        assert post_json(old_conn, "/validate", GPU_POD).status == 200
        assert peer_serial(old_conn) == old_serial != _serial(renewed.tls_cert)
        old_conn.close()
        assert failures == []
        assert served[0] > 0
        expiry = metric_value(
            server.metrics(), "gpu_admission_certificate_expiry_timestamp_seconds"
        )
        assert expiry == pytest.approx(renewed.not_after.timestamp(), abs=1)


def _serial(path: Path) -> int:
    from cryptography import x509

    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


# --------------------------------------------------------------------------- shutdown


def test_sigterm_drains_then_finishes_in_flight_requests(
    tmp_path: Path, pki: GeneratedCertificates
) -> None:
    # Generous: the assertions below happen inside the drain, on a busy 2-core CI machine.
    drain = 6.0
    server = tls_server(
        tmp_path,
        pki,
        drain_seconds=drain,
        # The slow request below outlasts the drain: its body must not hit its deadline.
        env={"GPU_ADMISSION_BODY_TIMEOUT": "60"},
    ).start()
    try:
        statuses: list[int | str] = []
        stop = threading.Event()

        def client() -> None:
            conn = server.connection(timeout=5)
            try:
                while not stop.is_set():
                    try:
                        statuses.append(post_json(conn, "/validate", GPU_POD).status)
                    except (OSError, http.client.HTTPException) as exc:
                        statuses.append(repr(exc))
                        conn.close()
            finally:
                conn.close()

        clients = [threading.Thread(target=client) for _ in range(3)]
        for thread in clients:
            thread.start()

        # A request whose body is still on its way when SIGTERM arrives.
        slow = server.connection(timeout=30)
        slow.putrequest("POST", "/validate")
        slow.putheader("Content-Type", "application/json")
        slow.putheader("Content-Length", str(len(GPU_POD)))
        slow.endheaders()
        half = len(GPU_POD) // 2
        slow.send(GPU_POD[:half])

        time.sleep(0.3)
        server.terminate()
        signalled = time.monotonic()

        wait_until(lambda: server.get("/readyz").status == 503, timeout=4, what="not ready")
        assert "draining" in server.get("/readyz").json()["reason"]
        server.terminate()  # a second SIGTERM changes nothing: the drain goes on

        # Still answering during the drain, and asking clients to reconnect elsewhere.
        conn = server.connection()
        try:
            reply = post_json(conn, "/validate", GPU_POD)
            assert reply.status == 200
            assert reply.headers["Connection"] == "close"
        finally:
            conn.close()

        time.sleep(max(0.0, signalled + drain - 0.5 - time.monotonic()))
        stop.set()
        for thread in clients:
            thread.join(timeout=10)

        # After the drain gunicorn stops gracefully: the in-flight request is still finished.
        wait_until(
            lambda: any(
                r.get("message") == "drain over: stopping gracefully" for r in server.log_records()
            ),
            timeout=drain + 5,
            what="the graceful stop",
        )
        time.sleep(0.5)  # the worker has stopped accepting
        assert server.process is not None and server.process.poll() is None
        slow.send(GPU_POD[half:])
        reply = slow.getresponse()
        assert reply.status == 200
        # Begun before SIGTERM, answered after: its client is told to reconnect elsewhere too.
        assert reply.headers["Connection"] == "close"
        assert json.loads(reply.read())["response"]["allowed"] is True
        slow.close()

        assert server.wait(timeout=20) == 0
        assert statuses and set(statuses) == {200}, statuses
        # The worker waited for the request rather than leaving it to interpreter exit.
        messages = [r.get("message", "") for r in server.log_records()]
        last_decision = max(i for i, m in enumerate(messages) if m == "admission decision")
        last_exit = max(i for i, m in enumerate(messages) if m.startswith("Worker exiting"))
        assert last_decision < last_exit
    finally:
        server.stop()


@pytest.mark.parametrize("stop", ["SIGINT during the drain", "SIGTERM and the drain's end"])
def test_from_start_to_stop_every_line_is_json_and_every_decision_logged_once(
    tmp_path: Path, pki: GeneratedCertificates, stop: str
) -> None:
    server = tls_server(tmp_path, pki, drain_seconds=2.0).start()
    sent: list[str] = []
    try:
        review = load_fixture("admission-review-gpu-pod.json")

        def send(conn: http.client.HTTPConnection, uid: str) -> None:
            review["request"]["uid"] = uid
            assert post_json(conn, "/validate", json.dumps(review).encode()).status == 200
            sent.append(uid)

        conn = server.connection()
        for index in range(40):
            send(conn, f"before-{index}")
        conn.close()
        server.terminate()
        wait_until(lambda: server.get("/readyz").status == 503, timeout=4, what="draining")
        for index in range(10):  # during the drain: each on a connection of its own
            conn = server.connection()
            send(conn, f"draining-{index}")
            conn.close()
        if stop == "SIGINT during the drain":
            assert server.process is not None
            server.process.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
    finally:
        server.stop()
    lines = server.log().splitlines()
    not_json = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert lines and not_json == []
    decided = [r["uid"] for r in server.log_records() if r.get("message") == "admission decision"]
    assert sorted(decided) == sorted(sent) and len(sent) == 50


def test_under_load_across_the_end_of_the_drain_no_written_request_is_dropped(
    tmp_path: Path, pki: GeneratedCertificates
) -> None:
    """Every request written is answered; a connection the server never took is refused (at
    connect or in the TLS handshake, before any request is written). During the drain every
    answer closes its connection, so each request comes on a fresh one, right into the
    moment the worker stops accepting."""
    server = tls_server(tmp_path, pki, drain_seconds=1.0).start()
    outcomes: dict[str, int] = {"answered": 0, "refused": 0}
    dropped: list[str] = []
    lock = threading.Lock()
    stopped = threading.Event()

    def client() -> None:
        while not stopped.is_set():
            conn = server.connection(timeout=10)
            try:
                try:
                    conn.connect()
                except (OSError, ssl.SSLError):
                    outcome = "refused"
                else:
                    try:
                        reply = post_json(conn, "/validate", GPU_POD)
                        outcome = "answered" if reply.status == 200 else f"HTTP {reply.status}"
                    except (OSError, http.client.HTTPException) as exc:
                        outcome = repr(exc)
            finally:
                conn.close()
            with lock:
                if outcome in outcomes:
                    outcomes[outcome] += 1
                else:
                    dropped.append(outcome)
            if outcome == "refused":
                time.sleep(0.01)

    threads = [threading.Thread(target=client) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        server.terminate()
        assert server.wait(timeout=40) == 0
        time.sleep(0.2)  # what the clients see once the port is closed
    finally:
        stopped.set()
        for thread in threads:
            thread.join(timeout=30)
        server.stop()
    assert dropped == [], (dropped[:5], outcomes)
    assert outcomes["answered"] > 50 and outcomes["refused"] > 0, outcomes


# --------------------------------------------------------------------------- settings


def test_settings_from_the_environment_and_record_mode(
    tmp_path: Path, pki: GeneratedCertificates
) -> None:
    with tls_server(
        tmp_path,
        pki,
        settings_in_env=True,
        # Set by Deployments of earlier releases: ignored (with a warning), not refused, and
        # a metrics directory that is not there any more does not stop the worker.
        env={
            "GPU_ADMISSION_MUTATION": "record",
            "GPU_ADMISSION_WORKERS": "2",
            "PROMETHEUS_MULTIPROC_DIR": "/nonexistent/gpu-admission-metrics",
        },
    ) as server:
        assert server.worker_pids() and len(server.worker_pids()) == 1
        warnings = [r["message"] for r in server.log_records() if r.get("level") == "warning"]
        assert any(m.startswith("--workers (GPU_ADMISSION_WORKERS) is ignored") for m in warnings)
        conn = server.connection()
        try:
            response = admission(post_json(conn, "/mutate", GPU_POD).body)
        finally:
            conn.close()
        assert "patch" not in response
        assert "tolerations" in response["auditAnnotations"]["would-patch"]
        name = "gpu_admission_mutations_total"
        wait_until(
            lambda: metric_value(server.metrics(), name, outcome="recorded") == 1,
            timeout=5,
            what="the recorded patch counted",
        )


def test_insecure_serves_plain_http_with_a_loud_warning(tmp_path: Path) -> None:
    with Server(
        policy=write_policy(tmp_path),
        cert=None,
        key=None,
        ca=None,
        log_path=tmp_path / "server.log",
    ) as server:
        conn = server.connection()
        try:
            assert admission(post_json(conn, "/validate", GPU_POD).body)["allowed"] is True
        finally:
            conn.close()
        warnings = [r for r in server.log_records() if r.get("level") == "warning"]
        assert any(r["message"].startswith("INSECURE") for r in warnings)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {}, "--cert and --key are required"),
        (
            ["--insecure"],
            {"GPU_ADMISSION_DRAIN_SECONDS": "soon"},
            "--drain-seconds (GPU_ADMISSION_DRAIN_SECONDS): expected a number",
        ),
        (["--insecure"], {"GPU_ADMISSION_DRAIN_SECONDS": "-1"}, "must be 0 or more"),
        (["--insecure"], {"GPU_ADMISSION_MUTATION": "sometimes"}, "apply or record"),
        (["--cert", "/nonexistent.crt", "--key", "/nonexistent.key"], {}, "cannot load TLS"),
    ],
)
def test_bad_settings_stop_serve_with_one_clear_line(
    args: list[str], env: dict[str, str], message: str
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPU_ADMISSION_")}
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "serve", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def exchange(
    server: Server, pki: GeneratedCertificates, data: bytes, *, linger: float = 0.0
) -> bytes:
    """Send raw bytes over a fresh TLS connection and read until the server closes it or
    ``linger`` seconds are over (then the client goes away without reading)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        with client_context(pki.ca_cert).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(data)
            if linger:
                time.sleep(linger)
                return answer
            while data := tls.recv(65536):
                answer += data
    return answer


MALFORMED_BODIES = {
    "bad-chunk-size": b"zz\r\n{}\r\n0\r\n\r\n",
    "missing-chunk-crlf": b"2\r\n{}XX0\r\n\r\n",
    "bad-trailer": b"2\r\n{}\r\n0\r\nno colon here\r\n\r\n",
    "chunk-longer-than-said": b"1\r\n{}\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("shape", MALFORMED_BODIES)
def test_a_malformed_chunked_body_is_a_4xx_json_refusal(
    server: Server, pki: GeneratedCertificates, shape: str
) -> None:
    head = (
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    answer = exchange(server, pki, head + MALFORMED_BODIES[shape])
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split(b" ")[1].startswith(b"4"), answer[:300]
    assert b"application/json" in rest.lower().split(b"\r\n\r\n")[0], answer[:300]
    assert not [r for r in server.log_records() if r.get("level") == "error"]


def test_a_body_shorter_than_its_length_is_no_server_error(
    server: Server, pki: GeneratedCertificates
) -> None:
    head = (
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    # The server is reading the body when the client goes away.
    exchange(server, pki, head + b'{"kind": "Adm', linger=0.3)
    time.sleep(0.5)
    errors = [r for r in server.log_records() if r.get("level") == "error"]
    assert not errors, errors


@pytest.mark.parametrize(
    "raw_request",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
        b"POST /validate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"POST /validate HTTP/1.1\r\nHost: x\r\nX-Bad Header: 1\r\n\r\n",
    ],
    ids=["request-line", "length-and-chunked", "unknown-coding", "bad-header-name"],
)
def test_the_http_parsers_refusals_are_json(
    server: Server, pki: GeneratedCertificates, raw_request: bytes
) -> None:
    answer = exchange(server, pki, raw_request)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1][:1] in (b"4", b"5"), answer[:200]
    assert b"content-type: application/json" in head.lower(), answer[:300]
    assert "error" in json.loads(body)
