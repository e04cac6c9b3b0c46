"""The one error renderer: every failure, ours or the framework's, becomes `{"error": "…"}`."""

import logging

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from container.errors import ServeError

log = logging.getLogger(__name__)


def error_response(status: int, message: str, headers: dict | None = None) -> Response:
    return Response(orjson.dumps({"error": message}), status, headers, mimetype="application/json")


def render_error(exc: Exception) -> Response:
    if isinstance(exc, ServeError):
        if exc.status >= 500:
            log.warning("%s %s → %d: %s", request.method, request.path, exc.status, exc)
        return error_response(exc.status, exc.message, exc.headers)
    if isinstance(exc, NotFound):
        return error_response(404, f"no endpoint {request.method} {request.path}; see the README for the API")
    if isinstance(exc, MethodNotAllowed):
        allowed = ", ".join(exc.valid_methods or [])
        return error_response(405, f"{request.path} does not take {request.method}; it takes {allowed}", {"Allow": allowed})
    if isinstance(exc, HTTPException):
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}  # keeps Allow on 405
        return error_response(exc.code or 500, exc.description or exc.name, headers)
    log.exception("unexpected error in %s %s", request.method, request.path)
    return error_response(500, f"internal server error ({type(exc).__name__}); the server log has the details")


def register_error_handler(app: Flask) -> None:
    app.register_error_handler(Exception, render_error)
