"""`POST /v2/models/{m}[/versions/{v}]/infer` as a plain WSGI handler in front of Flask. It is the hot
path, and Flask's request context, routing and response objects cost about a quarter of a small
request's CPU; everything else — the infer function, the error description, the request log — is
shared with the rest of the API. Other requests pass through to Flask untouched."""

import re
import time

from werkzeug.exceptions import MethodNotAllowed

from container.api.errors import describe, json_error, status_line
from container.api.request_log import REQUEST_ID, log_request, new_request_id
from container.api.v2 import serve_infer
from container.api.v2_codec import HEADER_LENGTH
from container.errors import PayloadTooLarge

_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
_ENVIRON = "HTTP_" + HEADER_LENGTH.upper().replace("-", "_")


class InferEndpoint:
    def __init__(self, app, registry, shared_memory, max_body: int):
        self.app, self.registry, self.shared_memory, self.max_body = app, registry, shared_memory, max_body

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        match = _PATH.fullmatch(path)
        if match is None:
            return self.app(environ, start_response)
        started, method = time.perf_counter(), environ["REQUEST_METHOD"]
        request_id = environ.get("HTTP_X_REQUEST_ID") or new_request_id()
        name, version = match.groups()
        try:
            if method != "POST":
                raise MethodNotAllowed(valid_methods=["POST"])
            body, headers = serve_infer(self.registry, self.shared_memory, name, version, self._body(environ),
                                        environ.get(_ENVIRON))
            status = 200
        except Exception as exc:
            status, message, extra = describe(exc, method, path, request_id)
            body, headers = json_error(message), {"Content-Type": "application/json", **extra}
        headers |= {REQUEST_ID: request_id, "Content-Length": str(len(body))}
        start_response(status_line(status), list(headers.items()))
        log_request(method, path, name, status, started, request_id, environ.get("HTTP_X_AMZN_SAGEMAKER_TARGET_MODEL"))
        return [body]

    def _body(self, environ) -> bytes:
        length = environ.get("CONTENT_LENGTH")
        if length and int(length) > self.max_body:
            raise PayloadTooLarge(f"the body is {int(length)} bytes; the limit is {self.max_body} (SAGEMAKER_MAX_PAYLOAD_IN_MB)")
        body = environ["wsgi.input"].read(int(length) if length else self.max_body + 1)
        if len(body) > self.max_body:
            raise PayloadTooLarge(f"the body is larger than {self.max_body} bytes (SAGEMAKER_MAX_PAYLOAD_IN_MB)")
        return body
