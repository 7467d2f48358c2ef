"""The WSGI application: admission endpoints, health, readiness and metrics.

``POST /validate`` and ``POST /mutate`` take an AdmissionReview (admission.k8s.io/v1) and
return the engine's response; the app adds nothing to the verdict. Everything the app
refuses is answered with a JSON body ``{"error": "..."}`` and a 4xx status: a malformed
review must never look like a server failure (5xx) to the API server, and must never show
a traceback. With no valid policy loaded the admission endpoints answer 503: the API
server then applies the webhook's failurePolicy, instead of this server allowing
everything.

The request path is kept short: the body is read once, decoded once and parsed once, and
the response is encoded once, straight into the response body.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

import orjson
from flask import Flask, Response, request
from gunicorn.http.errors import ParseException
from werkzeug.exceptions import ClientDisconnected, HTTPException
from werkzeug.wrappers import Response as WerkzeugResponse

from webhook.admission.engine import TooMuchWork, WorkLimits, decide
from webhook.admission.request import RequestError
from webhook.admission.response import compact_json
from webhook.core.findings import exceptions_of
from webhook.core.inventory import NodeSnapshot
from webhook.policy.model import Policy
from webhook.server.child import ChildDecisionLost
from webhook.server.logs import APP_LOGGER, DECISION_LOGGER, log_decision
from webhook.server.metrics import Metrics
from webhook.server.settings import (
    INLINE_JUDGED_ITEMS,
    INLINE_TEMPLATES,
    LONG_BODY_BYTES,
    LONG_BODY_ITEMS,
    MAX_BODY_BYTES,
)
from webhook.server.store import PolicyStore

JSON = "application/json"

# A readiness check returns None when ready, else the reason it is not.
ReadinessCheck = Callable[[], str | None]

log = logging.getLogger(APP_LOGGER)


class _Refused(Exception):
    """A request the app answers with an error status and message, before any decision."""

    def __init__(self, status: int, message: str, verdict: str = "invalid") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.verdict = verdict

    def __reduce__(self) -> tuple[Any, ...]:  # crosses from the process of a long decision
        return (_Refused, (self.status, self.message, self.verdict))


class _DecisionFailed(Exception):
    """An unexpected error while deciding, with what its log line needs: its type and stack,
    not its text (which can quote the object under review, a value from an environment
    variable, say). Made where the error happened, so it can cross processes."""

    def __init__(self, error: str, stack: str, uid: Any) -> None:
        super().__init__(error, stack, uid)
        self.error = error
        self.stack = stack
        self.uid = uid


# The request's identifying fields, which the decision's log line reads.
LOGGED_REQUEST_FIELDS = ("uid", "kind", "namespace", "name", "operation", "dryRun")


class _Outcome(NamedTuple):
    """What a decision leaves for the response, the metrics and the log line: small, and
    picklable (a long decision runs in another process)."""

    body: bytes
    allowed: bool
    violations: tuple[tuple[str, str], ...]
    mutation: str
    request: dict[str, Any]  # the request's identifying fields, for the log line
    exceptions: tuple[str, ...] = ()  # the policy exceptions that made denials warnings


def _json_response(status: int, payload: dict[str, Any]) -> Response:
    return Response(orjson.dumps(payload), status=status, mimetype=JSON)


def _read_request_body() -> bytes:
    """The body of the current request, or :class:`_Refused` saying why not."""
    environ = request.environ
    # The API server sends exactly this Content-Type: parsing it is for everyone else.
    if environ.get("CONTENT_TYPE") != JSON:
        if request.mimetype != JSON:
            raise _Refused(415, f"Content-Type must be {JSON}, got {request.mimetype or 'none'!r}")
        charset = request.mimetype_params.get("charset")
        if charset is not None and charset.lower() not in ("utf-8", "utf8"):
            raise _Refused(415, f"charset must be utf-8, got {charset!r}")
    announced = environ.get("CONTENT_LENGTH")
    if announced and announced.isascii() and announced.isdigit():
        # What the API server sends: read exactly that many bytes from the server's stream,
        # without Werkzeug's wrapping (a tenth of the request's cost outside the decision).
        announced_length = int(announced)
        if announced_length > MAX_BODY_BYTES:  # refused without being buffered
            raise _Refused(
                413, f"request body of {announced_length} bytes exceeds {MAX_BODY_BYTES} bytes"
            )
        return _read_body(partial(environ["wsgi.input"].read, announced_length), announced_length)
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        raise _Refused(413, f"request body of {length} bytes exceeds {MAX_BODY_BYTES} bytes")
    body = _read_body(lambda: request.get_data(cache=False), length)
    if len(body) > MAX_BODY_BYTES:  # a chunked body, cut one byte past the limit
        raise _Refused(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    return body


def _encode_json(value: Any) -> bytes:
    """``value`` as compact JSON (a patch): orjson, or the standard library for what orjson
    does not write (an integer beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return compact_json(value)


def _refusal(body: bytes, exc: orjson.JSONDecodeError) -> _Refused:
    """Why orjson could not decode a request body. orjson follows RFC 8259 as the API server
    does: no NaN or Infinity, no lone surrogates, at most 1,024 levels of nesting."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as bad:
        return _Refused(400, f"request body is not UTF-8: byte {bad.start}")
    except MemoryError:
        return _Refused(413, TOO_BIG_TO_JUDGE)
    return _Refused(400, f"request body is not valid JSON: {exc}")


def _read_body(read: Callable[[], bytes], announced: int | None) -> bytes:
    """The request body ``read`` returns, or :class:`_Refused`: a malformed body (bad chunk
    sizes, missing CRLFs, bad trailers) is the client's error, and so is a client that goes
    away before it has sent the ``announced`` length. Neither is ours: no 5xx, no error log,
    no error verdict."""
    try:
        body = read()
    except ParseException as exc:
        raise _Refused(400, f"malformed request body: {type(exc).__name__}") from None
    except (ClientDisconnected, OSError) as exc:
        # Werkzeug reads an error of the input stream as a disconnect (the error is the
        # context); the worker's body deadline is one.
        expired = exc if isinstance(exc, TimeoutError) else exc.__context__
        if isinstance(expired, TimeoutError):
            log.info("client too slow sending the body", extra={"fields": {"error": str(expired)}})
            raise _Refused(408, str(expired)) from None
        body = b""  # werkzeug mostly reads a lost client as EOF
    if announced is not None and len(body) < announced:
        log.info(
            "client went away while sending the body",
            extra={"fields": {"announced": announced, "received": len(body)}},
        )
        raise _Refused(400, f"the request body ended after {len(body)} of {announced} bytes")
    return body


def _log_failure(message: str, exc: Exception, **fields: Any) -> None:
    """Log an unexpected error with its type and stack, but not its text (see
    :class:`_DecisionFailed`)."""
    fields["error"] = type(exc).__name__
    fields["traceback"] = "".join(traceback.format_tb(exc.__traceback__))
    log.error(message, extra={"fields": fields})


def _uid(review: Any) -> Any:
    """The request uid of a parsed review, if it has one, for error logs."""
    admission_request = review.get("request") if isinstance(review, dict) else None
    return admission_request.get("uid") if isinstance(admission_request, dict) else None


# A long decision runs in a child whose memory is capped (the server's child.py).
TOO_BIG_TO_JUDGE = "the review needs more memory to judge than one review may use"


INLINE_LIMITS = WorkLimits(templates=INLINE_TEMPLATES, judged_items=INLINE_JUDGED_ITEMS)


def _is_long(body: bytes) -> bool:
    """Whether deciding ``body`` could take long: its size, or how many items (array
    elements and object members) it holds, counted by the commas between them in one byte
    scan. A comma outside a string separates two items; one inside a string only
    overcounts, which is safe. A body shorter than the limit cannot hold that many commas,
    and is not scanned: the scan costs a sixth of a small review's decision."""
    size = len(body)
    if size < LONG_BODY_ITEMS:
        return False
    return size >= LONG_BODY_BYTES or body.count(b",") >= LONG_BODY_ITEMS


def _decide_body(
    body: bytes,
    policy: Policy | None,
    problem: str | None,
    mutate: bool,
    limits: WorkLimits | None = None,
    nodes: NodeSnapshot | None = None,
) -> _Outcome:
    """Decode and decide a request body: an :class:`_Outcome`, or :class:`_Refused`,
    :class:`RequestError`, :class:`_DecisionFailed` or (with ``limits``) :class:`TooMuchWork`."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _refusal(body, exc) from None
    except MemoryError:
        raise _Refused(413, TOO_BIG_TO_JUDGE) from None
    if policy is None:
        raise _Refused(503, f"no valid policy loaded: {problem}", "unavailable")
    try:
        decision = decide(
            review,
            policy,
            mutate=mutate,
            encode_json=_encode_json,
            limits=limits,
            nodes=nodes,
        )
    except (RequestError, TooMuchWork):
        raise
    except RecursionError:
        # JSON allows 1,024 levels of nesting, more than Python's repr of a value can take;
        # no object the API server accepts comes near it.
        raise _Refused(400, "the review is nested too deeply to judge") from None
    except MemoryError:
        raise _Refused(413, TOO_BIG_TO_JUDGE) from None
    except Exception as exc:
        stack = "".join(traceback.format_tb(exc.__traceback__))
        raise _DecisionFailed(type(exc).__name__, stack, _uid(review)) from None
    mutation = "none"
    if decision.patch_applied:
        mutation = "applied"
    elif decision.patch_recorded:
        mutation = "recorded"
    admission_request = review["request"]
    findings = decision.findings
    return _Outcome(
        body=orjson.dumps(decision.response),
        allowed=decision.response["response"]["allowed"],
        violations=tuple((f.rule, f.mode) for f in findings),
        mutation=mutation,
        request={field: admission_request.get(field) for field in LOGGED_REQUEST_FIELDS},
        exceptions=exceptions_of(findings),
    )


def create_app(
    store: PolicyStore,
    *,
    mutation_enabled: bool = True,
    metrics: Metrics | None = None,
    readiness_checks: Iterable[ReadinessCheck] = (),
    run_long: Callable[[Callable[[], Any]], Any] | None = None,
    node_snapshot: Callable[[], NodeSnapshot | None] | None = None,
) -> Flask:
    """Build the app around a policy store; all configuration is passed in.

    ``mutation_enabled`` false (``GPU_ADMISSION_MUTATION=record``) makes /mutate record the
    patch it would apply in an audit annotation instead of returning it, whatever mode the
    policy asks for. ``readiness_checks`` are what /readyz consults besides the policy
    (certificates, draining). ``run_long`` runs the decoding and deciding of a body of
    ``LONG_BODY_BYTES`` or more, of ``LONG_BODY_ITEMS`` JSON items or more, or of an object
    past ``INLINE_LIMITS`` (templates, and what they inherit), and returns its result,
    which it may pickle (the server runs it in a forked process, so that one big review
    does not stall the worker's other connections) or raises :class:`ChildDecisionLost`
    (answered 503); unset, everything runs inline. ``node_snapshot`` returns the node
    inventory's latest snapshot (None before its first list), which decisions read as it is.
    """
    app = Flask(__name__)
    # One byte more than allowed: Werkzeug stops reading a body without Content-Length
    # (chunked) at this limit without an error, so only a longer read shows it was longer.
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES + 1
    metrics = metrics if metrics is not None else Metrics()
    checks = tuple(readiness_checks)
    decision_log = logging.getLogger(DECISION_LOGGER)

    # The record-mode copy of the policy in force, made once per policy rather than per request.
    recording: list[tuple[Policy, Policy]] = []

    def for_mutation(policy: Policy) -> Policy:
        if policy.mutation_mode == "Record":
            return policy
        if recording and recording[0][0] is policy:
            return recording[0][1]
        record_only = dataclasses.replace(policy, mutation_mode="Record")
        recording[:] = [(policy, record_only)]
        return record_only

    def admit(endpoint: str, mutate: bool) -> Response:
        started = time.perf_counter()
        try:
            body = _read_request_body()
            store.reload_if_changed()
            policy = store.policy
            if policy is not None and mutate and not mutation_enabled:
                policy = for_mutation(policy)
            problem = store.problem
            nodes = node_snapshot() if node_snapshot is not None else None
            if run_long is None:
                outcome = _decide_body(body, policy, problem, mutate, nodes=nodes)
            elif len(body) >= LONG_BODY_ITEMS and _is_long(body):  # mostly not: no call
                outcome = run_long(lambda: _decide_body(body, policy, problem, mutate, nodes=nodes))
            else:
                try:
                    outcome = _decide_body(body, policy, problem, mutate, INLINE_LIMITS, nodes)
                except TooMuchWork:
                    # Found before the object was judged (or its old object): judged again,
                    # off the event loop.
                    outcome = run_long(
                        lambda: _decide_body(body, policy, problem, mutate, nodes=nodes)
                    )
        except _Refused as refused:
            metrics.answered(endpoint, refused.verdict)
            return _json_response(refused.status, {"error": refused.message})
        except RequestError as exc:
            metrics.answered(endpoint, "invalid")
            return _json_response(400, {"error": str(exc)})
        except ChildDecisionLost as exc:
            metrics.answered(endpoint, "unavailable")
            log.warning("long review not decided", extra={"fields": {"reason": str(exc)}})
            return _json_response(503, {"error": f"review not decided: {exc}"})
        except _DecisionFailed as failed:
            metrics.answered(endpoint, "error")
            fields = {"uid": failed.uid, "error": failed.error, "traceback": failed.stack}
            log.error("admission decision failed", extra={"fields": fields})
            return _json_response(500, {"error": "internal error while deciding the review"})
        elapsed = time.perf_counter() - started
        # The API server calls both webhooks for one object: violations are counted once,
        # from /validate, and mutations from /mutate.
        metrics.answered(
            endpoint,
            "allowed" if outcome.allowed else "denied",
            elapsed,
            outcome.violations if endpoint == "validate" else (),
            outcome.mutation,
        )
        log_decision(
            decision_log,
            endpoint=endpoint,
            request=outcome.request,
            allowed=outcome.allowed,
            violations=outcome.violations,
            mutation=outcome.mutation,
            duration_ms=elapsed * 1000,
            exceptions=outcome.exceptions,
        )
        return Response(outcome.body, status=200, mimetype=JSON)

    @app.post("/validate")
    def validate() -> Response:
        return admit("validate", mutate=False)

    @app.post("/mutate")
    def mutate() -> Response:
        return admit("mutate", mutate=True)

    @app.get("/healthz")
    def healthz() -> Response:
        return _json_response(200, {"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        store.reload_if_changed()
        policy = store.policy
        reason: str | None
        if policy is None:
            reason = f"no valid policy loaded: {store.problem}"
        else:
            reason = next((r for check in checks if (r := check()) is not None), None)
        if reason is not None or policy is None:
            return _json_response(503, {"status": "not ready", "reason": reason})
        return _json_response(
            200,
            {"status": "ready", "policy": {"source": policy.source, "sha256": policy.sha256}},
        )

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        store.reload_if_changed()
        body, content_type = metrics.render()
        return Response(body, status=200, content_type=content_type)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> WerkzeugResponse:
        # Werkzeug's response keeps headers such as Allow on a 405; only the body changes.
        response = exc.get_response()
        response.set_data(orjson.dumps({"error": f"{exc.code} {exc.name}: {exc.description}"}))
        response.mimetype = JSON
        return response

    @app.errorhandler(Exception)
    def unexpected_error(exc: Exception) -> Response:
        _log_failure("unhandled error", exc, path=request.path)
        return _json_response(500, {"error": "internal server error"})

    return app
