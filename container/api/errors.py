"""The one error renderer: every failure, ours or the framework's, becomes a status and a message
(`error_answer`), written as `{"error": "…"}` — in each protocol's own spelling of that document."""

import functools
import logging
from http import HTTPStatus

import orjson
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from container.errors import ServeError, Unavailable

log = logging.getLogger(__name__)


def error_answer(exc: Exception, method: str, path: str, request_id: str | None) -> tuple[int, str, dict]:
    """(status, message, headers) for any exception raised while serving a request."""
    if isinstance(exc, ServeError):
        if exc.status >= 500 and not isinstance(exc, Unavailable):  # 503s are states, not faults
            log.warning("request failed", extra={"fields": {"status": exc.status, "error": exc.message, "request_id": request_id}})
        return exc.status, exc.message, exc.headers
    if isinstance(exc, NotFound):
        return 404, f"no endpoint {method} {path}; see the README for the API", {}
    if isinstance(exc, MethodNotAllowed):
        allowed = ", ".join(exc.valid_methods or [])
        return 405, f"{path} does not take {method}; it takes {allowed}", {"Allow": allowed}
    if isinstance(exc, HTTPException):
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        return exc.code or 500, exc.description or exc.name, headers
    log.exception("unexpected error", extra={"fields": {"method": method, "path": path, "request_id": request_id}})
    return 500, f"internal server error ({type(exc).__name__}); the server log has the details", {}


@functools.cache  # a handful of statuses, written on every response
def status_line(status: int) -> str:
    return f"{status} {_phrase(status)}"


def _phrase(status: int) -> str:
    """The standard reason phrase ("Not Found"); werkzeug would write it in capitals."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Client Closed Request" if status == 499 else ""  # nginx's, for a request cancelled


def json_error(message: str) -> bytes:
    return orjson.dumps({"error": message})

