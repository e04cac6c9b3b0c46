"""The hot endpoints — V2 infer and SageMaker invoke — as plain WSGI in front of Flask. Flask's request
context, routing and response objects cost about a quarter of a small request's CPU, and werkzeug's
body streaming much of a large one's; these handlers share everything else (the serving functions, the
error description, the request log) with the rest of the API. Other requests pass through to Flask,
a chunked body read here first: werkzeug would cut it at the size limit without a word."""

import io
import re
import time
from dataclasses import dataclass
from typing import Callable

from werkzeug.exceptions import MethodNotAllowed

from container.api.errors import describe, json_error, status_line
from container.api.request_log import REQUEST_ID, log_request, new_request_id
from container.errors import PayloadTooLarge


@dataclass
class Call:
    """What a hot handler sees of its request."""

    environ: dict
    match: re.Match | None
    body: bytes
    request_id: str
    model: str | None = None  # for the request log; a handler may name the model it serves

    def header(self, name: str) -> str | None:
        if name.lower() == "content-type":
            return self.environ.get("CONTENT_TYPE") or None
        return self.environ.get("HTTP_" + name.upper().replace("-", "_"))

    def headers(self) -> dict[str, str]:
        """Every request header, by its name in title case (`Content-Type`, `X-Amzn-Sagemaker-…`)."""
        found = {k[5:]: v for k, v in self.environ.items() if k.startswith("HTTP_")}
        found |= {k: self.environ[k] for k in ("CONTENT_TYPE", "CONTENT_LENGTH") if self.environ.get(k)}
        return {k.replace("_", "-").title(): v for k, v in found.items()}


Handler = Callable[[Call], tuple]  # → (body, headers) or (body, headers, status); raises errors.ServeError


class HotPaths:
    def __init__(self, app, routes: list[tuple[re.Pattern, Handler]], max_body: int, announce):
        """`announce(model)`: a context manager around a request for a model, from its headers on."""
        self.app, self.routes, self.max_body, self.announce = app, routes, max_body, announce

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        for pattern, handler in self.routes:
            match = pattern.fullmatch(path)
            if match is not None:
                return self._serve(environ, start_response, path, match, handler)
        if not environ.get("CONTENT_LENGTH") and environ.get("HTTP_TRANSFER_ENCODING", "").lower() == "chunked":
            try:
                body = self._body(environ)
            except Exception as exc:
                return self._fail(environ, start_response, path, exc)
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        return self.app(environ, start_response)

    def _fail(self, environ, start_response, path: str, exc: Exception):
        call = Call(environ, None, b"", environ.get("HTTP_X_REQUEST_ID") or new_request_id())
        return self._respond(environ, start_response, path, call, exc, time.perf_counter())

    def _serve(self, environ, start_response, path: str, match: re.Match, handler: Handler):
        started, method = time.perf_counter(), environ["REQUEST_METHOD"]
        call = Call(environ, match, b"", environ.get("HTTP_X_REQUEST_ID") or new_request_id(), match.groupdict().get("name"))
        try:
            if method != "POST":
                raise MethodNotAllowed(valid_methods=["POST"])
            with self.announce(call.model):
                call.body = self._body(environ)
                answer = handler(call)
        except Exception as exc:
            answer = exc
        return self._respond(environ, start_response, path, call, answer, started)

    def _respond(self, environ, start_response, path: str, call: Call, answer, started: float):
        """Send `answer` — a handler's (body, headers[, status]) or the exception it raised — and log it."""
        method = environ["REQUEST_METHOD"]
        if isinstance(answer, Exception):
            status, message, extra = describe(answer, method, path, call.request_id)
            body, headers = json_error(message), {"Content-Type": "application/json", **extra}
        else:
            body, headers, *status = answer
            status = status[0] if status else 200
        headers |= {REQUEST_ID: call.request_id, "Content-Length": str(len(body))}
        start_response(status_line(status), list(headers.items()))
        log_request(method, path, call.model, status, started, call.request_id, call.header("X-Amzn-SageMaker-Target-Model"))
        return [body]

    def _body(self, environ) -> bytes:
        length = environ.get("CONTENT_LENGTH")
        if length and int(length) > self.max_body:
            raise PayloadTooLarge(f"the body is {int(length)} bytes; the limit is {self.max_body} (SAGEMAKER_MAX_PAYLOAD_IN_MB)")
        body = environ["wsgi.input"].read(int(length) if length else self.max_body + 1)
        if len(body) > self.max_body:
            raise PayloadTooLarge(f"the body is larger than {self.max_body} bytes (SAGEMAKER_MAX_PAYLOAD_IN_MB)")
        return body
