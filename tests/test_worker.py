"""The worker's own parts: long decisions in a forked process, the body deadline, the
settings that tune it, and the gunicorn internals it builds on."""

from __future__ import annotations

import inspect
import json
import os
import threading
import time
from collections.abc import Iterator

import pytest

from tests.serving import (
    TEST_POLICY,
    Server,
    fixture_bytes,
    metric_value,
    post_json,
    tls_server,
    wait_until,
)
from webhook.admission.engine import review
from webhook.policy.load import parse_policy
from webhook.server.child import ChildDecisionLost, run_in_child
from webhook.server.settings import Deadlines, SettingsError, resolve_settings

GPU_POD = fixture_bytes("admission-review-gpu-pod.json")


def big_review(containers: int) -> dict:
    """The fixture GPU Pod review with ``containers`` more containers like its first."""
    body = json.loads(GPU_POD)
    spec = body["request"]["object"]["spec"]
    first = spec["containers"][0]
    spec["containers"] += [dict(first, name=f"extra-{i}") for i in range(containers)]
    return body


# --------------------------------------------------------------------------- run_in_child


def test_a_long_decision_returns_what_the_child_computed() -> None:
    parent = os.getpid()
    assert run_in_child(lambda: ("from", os.getpid() != parent)) == ("from", True)


def test_an_exception_in_the_child_is_raised_in_the_parent() -> None:
    def fail() -> None:
        raise ValueError("bad review")

    with pytest.raises(ValueError, match="bad review"):
        run_in_child(fail)


def test_a_child_that_dies_without_answering_is_an_error_not_a_hang() -> None:
    with pytest.raises(ChildDecisionLost, match=r"ended without an answer \(exit status 3\)"):
        run_in_child(lambda: os._exit(3))


def test_a_child_that_runs_out_of_time_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    import webhook.server.child as child

    monkeypatch.setattr(child, "LONG_DECISION_SECONDS", 0.5)
    started = time.monotonic()
    with pytest.raises(ChildDecisionLost, match=r"\(killed after 0.5 s\)"):
        run_in_child(lambda: time.sleep(30))
    assert time.monotonic() - started < 5


def test_children_are_collected_by_gevent_as_they_end() -> None:
    # Forked the way gevent supports: every child's status is collected (no zombie is left,
    # none is "collected elsewhere"), whatever the order of its exit and the parent's wait.
    for _ in range(20):
        assert run_in_child(lambda: 1) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


# --------------------------------------------------------------------------- settings


def test_deadlines_come_from_the_environment_and_are_checked() -> None:
    settings = resolve_settings(
        {"insecure": True},
        {"GPU_ADMISSION_HEADERS_TIMEOUT": "2.5", "GPU_ADMISSION_MAX_CONNECTIONS": "100"},
    )
    assert settings.deadlines == Deadlines(headers=2.5, max_connections=100)
    for bad in ("0", "-1", "inf", "soon"):
        with pytest.raises(SettingsError, match="GPU_ADMISSION_IDLE_TIMEOUT"):
            resolve_settings({"insecure": True}, {"GPU_ADMISSION_IDLE_TIMEOUT": bad})


def test_the_body_deadline_grows_with_the_body_and_is_bounded() -> None:
    deadlines = Deadlines(body_floor=5, body_bytes_per_second=1024 * 1024)
    assert deadlines.body(0) == 5
    assert deadlines.body(2 * 1024 * 1024) == 7
    # Beyond the limit (refused unread): the limit's deadline.
    assert deadlines.body(10**12) == 12


# --------------------------------------------------------------------------- real server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("worker")
    with tls_server(directory, {"GPU_ADMISSION_BODY_TIMEOUT": "1"}) as running:
        yield running


def test_a_long_review_is_decided_as_the_engine_decides_it_and_logged_once(
    server: Server,
) -> None:
    body = big_review(1000)
    encoded = json.dumps(body).encode()
    assert len(encoded) >= 64 * 1024  # the app's LONG_BODY_BYTES: decided in a child
    conn = server.connection(timeout=30)
    try:
        reply = post_json(conn, "/validate", encoded)
    finally:
        conn.close()
    assert reply.status == 200
    assert reply.json() == review(body, parse_policy(TEST_POLICY), mutate=False)
    uid = body["request"]["uid"]
    time.sleep(0.2)
    lines = [
        r
        for r in server.log_records()
        if r.get("message") == "admission decision" and r.get("uid") == uid
    ]
    assert len(lines) == 1 and lines[0]["verdict"] == "allowed"


def test_a_long_review_is_mutated_as_the_engine_mutates_it(server: Server) -> None:
    body = big_review(1000)
    conn = server.connection(timeout=30)
    try:
        reply = post_json(conn, "/mutate", json.dumps(body).encode())
    finally:
        conn.close()
    assert reply.status == 200
    expected = review(body, parse_policy(TEST_POLICY), mutate=True)
    assert reply.json() == expected and "patch" in expected["response"]


def test_other_connections_are_answered_while_a_long_review_is_decided(server: Server) -> None:
    encoded = json.dumps(big_review(15_000)).encode()  # about 3 MiB: half a second to decide
    big = server.connection(timeout=60)
    small = server.connection(timeout=10)
    long_took: list[float] = []

    def decide_long() -> None:
        started = time.monotonic()
        assert post_json(big, "/validate", encoded).status == 200
        long_took.append(time.monotonic() - started)

    try:
        post_json(small, "/validate", GPU_POD)
        thread = threading.Thread(target=decide_long)
        thread.start()
        small_took = []
        while thread.is_alive():
            started = time.monotonic()
            assert post_json(small, "/validate", GPU_POD).status == 200
            small_took.append(time.monotonic() - started)
        thread.join()
    finally:
        big.close()
        small.close()
    # A worker frozen by the long review would hold a small one for most of its duration.
    assert len(small_took) >= 10, (small_took, long_took)
    assert max(small_took) < long_took[0] / 4, (max(small_took), long_took)


def test_a_body_slower_than_its_deadline_is_408_and_the_connection_closes(
    server: Server,
) -> None:
    before = metric_value(server.metrics(), "gpu_admission_requests_total")
    conn = server.connection(timeout=10)
    try:
        conn.putrequest("POST", "/validate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(GPU_POD)))
        conn.endheaders()
        conn.send(GPU_POD[:10])
        started = time.monotonic()
        reply = conn.getresponse()
        assert reply.status == 408
        assert reply.headers["Content-Type"] == "application/json"
        assert reply.headers["Connection"] == "close"
        assert "did not arrive within" in json.loads(reply.read())["error"]
        assert time.monotonic() - started < 1 + 1.0
    finally:
        conn.close()
    wait_until(
        lambda: metric_value(server.metrics(), "gpu_admission_requests_total") == before + 1,
        timeout=5,
        what="the refused request counted",
    )


# --------------------------------------------------------------------------- gunicorn


def test_the_worker_overrides_what_it_says_and_calls_what_exists() -> None:
    """The worker overrides GeventWorker's handle, init_process and run and calls into
    gunicorn and gevent by these names and signatures. What they do is tested by behaviour
    (deadlines, room, drain, JSON refusals) in the server tests, on the pinned versions."""
    from gevent import server
    from gunicorn import sock
    from gunicorn.http.parser import Parser
    from gunicorn.workers import ggevent

    from webhook.server.worker import AdmissionWorker

    own = {name for name in vars(AdmissionWorker) if not name.startswith("__")}
    inherited = set(dir(ggevent.GeventWorker))
    # What it replaces of gunicorn; its helpers' names are its own, clashing with nothing.
    assert own & inherited == {"init_process", "handle", "run", "handle_exit"}
    assert own - inherited == {
        "_request_written_before_the_stop",
        "_converse",
        "_serve",
        "_answer_error",
        "_refuse",
        "_wait_for_request",
        "_report_room_made",
        "_drain_left",
        "_drain_over",
    }
    assert list(inspect.signature(ggevent.GeventWorker.handle).parameters) == [
        "self",
        "listener",
        "client",
        "addr",
    ]
    assert ggevent.ssl_context is sock.ssl_context
    for name in (
        "full",
        "wrap_socket_and_handle",
        "start_accepting",
        "stop_accepting",
        "started",
    ):
        assert hasattr(server.StreamServer, name), name
    assert list(inspect.signature(Parser.finish_body).parameters) == [
        "self",
        "deadline",
        "max_bytes",
    ]


def test_large_bodies_take_turns_and_small_reviews_never_wait(server: Server) -> None:
    from webhook.server.worker import LARGE_BODIES_AT_ONCE

    # Large bodies whose deadline is 1 s + 1 s per MiB here: the first ones hold their slots
    # for 2 s, the last one waits for a slot at most about 1 s.
    sizes = [1024 * 1024] * LARGE_BODIES_AT_ONCE + [64 * 1024]
    holders = []
    try:
        for announced in sizes:
            sent_at = time.monotonic()
            conn = server.connection(timeout=10)
            conn.putrequest("POST", "/validate")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(announced))
            conn.endheaders()
            conn.send(b" " * 1000)
            holders.append(conn)
        # Every slot is taken by a slow upload: a small review is answered at once.
        small = server.connection(timeout=10)
        try:
            assert timed_small_review(small) < 1.0
        finally:
            small.close()
        # The one waiting for a slot is answered within its own body deadline (1 s + 1/16 s),
        # counted from its headers: waiting for room is part of it.
        assert holders[-1].getresponse().status == 503
        assert time.monotonic() - sent_at < 1 + 1 / 16 + 0.5
        statuses = sorted([conn.getresponse().status for conn in holders[:-1]] + [503])
    finally:
        for conn in holders:
            conn.close()
    # The ones holding a slot run out of body time (408); the one that never got a slot is
    # told the server is busy (503), within its deadline.
    assert statuses == [408] * LARGE_BODIES_AT_ONCE + [503]


def timed_small_review(conn) -> float:
    started = time.monotonic()
    assert post_json(conn, "/validate", GPU_POD).status == 200
    return time.monotonic() - started
