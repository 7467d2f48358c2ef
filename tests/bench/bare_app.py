"""The benchmark's baseline: the bare stack, a Flask route that reads the body, decodes it with
orjson and answers "allowed" with the review's uid, under exactly the webhook's gunicorn and TLS.

Run as ``python -m tests.bench.bare_app`` with the options of ``gpu-admission serve``. It is
the webhook's own :class:`~webhook.server.gunicorn.AdmissionServer` (worker class, threads,
keep-alive, TLS context, drain) with only the WSGI app replaced, so the difference between the
two is the cost of the admission path itself.

``reference_app`` is the same app for vanilla gunicorn (``tests.bench.bare_app:reference_app``,
one gthread worker): the reference the served webhook is measured against.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import orjson
from flask import Flask, Response, request

from webhook.cli import serve
from webhook.server.gunicorn import AdmissionServer
from webhook.server.settings import resolve_settings


def bare_app() -> Flask:
    """Read and decode the review, answer "allowed" with its uid: all a webhook must do."""
    app = Flask("bare")

    @app.post("/")
    def index() -> Response:
        review = orjson.loads(request.get_data(cache=False))
        answer = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }
        return Response(orjson.dumps(answer), mimetype="application/json")

    @app.get("/readyz")
    def readyz() -> Response:
        return Response(b'{"status":"ready"}', mimetype="application/json")

    return app


reference_app = bare_app()


class BareServer(AdmissionServer):
    def load(self) -> Flask:
        return bare_app()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bare_app")
    serve.add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    settings = resolve_settings(vars(args), os.environ)
    BareServer(settings).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
