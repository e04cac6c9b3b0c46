"""The one request pipeline every URL goes through: route (routing.py), body limit, request id, the
handler, the one error renderer, the access log. The HTTP worker (gunicorn_worker.py) hands it requests
it has parsed itself; any other WSGI server (Flask's test client, say) reaches it through `__call__`."""

import itertools
import os
import time
from typing import Iterator
from urllib.parse import parse_qs, unquote_to_bytes, urlsplit

import gevent
import orjson

from container import content
from container.api.errors import error_answer, status_line
from container.api.routing import Match, Routes
from container.errors import PayloadTooLarge, ServeError
from container.inference import Client
from container.request_log import AccessLog
from container.settings import Restriction

REQUEST_ID = "X-Request-Id"
ACCESS_LOG = AccessLog(gevent.spawn_later)  # the process's: an HTTP front-end's, or the model process's
LIMIT_SETTING = "SAGEMAKER_MAX_PAYLOAD_IN_MB"
_WSGI_CHUNK = 256 << 10


class Request:
    """What a handler sees of its request. Header names are lower-case; values are latin-1 text, as
    HTTP carries them."""

    __slots__ = ("method", "path", "query_string", "headers", "body", "oversize", "client", "params", "request_id",
                 "model")

    def __init__(self, method: str, path: str, query_string: str, headers: dict[str, str], body: bytes = b"",
                 oversize: int | None = None, client: Client | None = None):
        """`oversize`: the body was longer than the limit and was not kept: its length, 0 when unknown.
        `client`: the connection it came on (None: not known)."""
        self.method, self.path, self.query_string, self.headers = method, path, query_string, headers
        self.body, self.oversize, self.client = body, oversize, client
        self.params: dict[str, str] = {}
        self.request_id = ""
        self.model: str | None = None  # the model the request is for, in the access log

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def args(self) -> dict[str, str]:
        """The query string's parameters, the first value of each."""
        return {k: v[0] for k, v in parse_qs(self.query_string, keep_blank_values=True).items()}


class Response:
    """`stream`: the body's pieces as they are made, for an answer sent while it is being made
    (server-sent events); `body` is then empty."""

    __slots__ = ("body", "status", "headers", "stream")

    def __init__(self, body: bytes = b"", content_type: str | None = None, status: int = 200,
                 headers: dict[str, str] | None = None, stream: Iterator[bytes] | None = None):
        self.body, self.status, self.stream = body, status, stream
        self.headers = headers if headers is not None else {}
        if content_type is not None:
            self.headers["Content-Type"] = content_type

    @classmethod
    def json(cls, value, status: int = 200) -> "Response":
        return cls(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY), content.JSON, status)


class Dispatcher:
    def __init__(self, routes: Routes, max_body: int, restrictions: tuple[Restriction, ...] = ()):
        self.routes, self.max_body = routes, max_body
        self._restricted = {group: r for r in restrictions for group in r.groups}  # API group → its restriction
        # A made request id is this process's random prefix and a count: unique, and without the
        # getrandom() call per request, which lets go of the GIL and hands it to a busy execution thread.
        prefix = os.urandom(8).hex()
        self._request_ids = map(f"{prefix}{{:016x}}".format, itertools.count())

    def serve(self, request: Request, match: Match | None = None) -> Response:
        """`match`: the request's route, where the caller has found it already."""
        started = time.perf_counter()
        request.request_id = request.headers.get("x-request-id") or next(self._request_ids)
        try:
            match = match or self.routes.match(request.method, request.path)
            request.params = match.params
            request.model = match.params.get("name")
            restriction = self._restricted.get(match.route.api) if self._restricted else None
            if restriction is not None:
                restriction.check(request.headers.get(restriction.header))
            if request.oversize is not None:
                raise self.too_large(request.oversize)
            response = match.route.handler(request)
        except Exception as exc:
            response = self._error(request, exc)
        response.headers[REQUEST_ID] = request.request_id
        _logged(request, response.status, started)
        return response

    def refuse(self, request: Request, exc: ServeError) -> Response:
        """The answer to a request the HTTP worker would not take whole (a head too large or too slow, a
        body past the limit, the server shutting down): rendered, identified and logged as any other."""
        started = time.perf_counter()
        request.request_id = request.headers.get("x-request-id") or next(self._request_ids)
        response = self._error(request, exc)
        response.headers[REQUEST_ID] = request.request_id
        _logged(request, response.status, started)
        return response

    def _error(self, request: Request, exc: Exception) -> Response:
        status, message, headers = error_answer(exc, request.method, request.path, request.request_id)
        return Response(self.routes.error_body(request.path)(message), content.JSON, status, headers)

    def too_large(self, length: int) -> PayloadTooLarge:
        if length:
            return PayloadTooLarge(f"the body is {length} bytes; the limit is {self.max_body} ({LIMIT_SETTING})")
        return PayloadTooLarge(f"the body is larger than {self.max_body} bytes ({LIMIT_SETTING})")

    def __call__(self, environ, start_response):
        """WSGI: the same pipeline, and the same body reader, for any WSGI server."""
        headers = {key[5:].replace("_", "-").lower(): value for key, value in environ.items() if key.startswith("HTTP_")}
        for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(key):
                headers[key.replace("_", "-").lower()] = environ[key]
        length = int(environ["CONTENT_LENGTH"]) if environ.get("CONTENT_LENGTH") else None
        body = Body(self.max_body, length)
        if body.oversize is None:
            _read_wsgi(environ["wsgi.input"], length, body)
        path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
        request = Request(environ["REQUEST_METHOD"], path, environ.get("QUERY_STRING", ""), headers, body.whole(),
                          body.oversize)
        response = self.serve(request)
        if response.stream is None:
            response.headers["Content-Length"] = str(len(response.body))
        start_response(status_line(response.status), list(response.headers.items()))
        if request.method == "HEAD":
            return [b""]
        return response.stream if response.stream is not None else [response.body]


class Body:
    """A request body as it arrives, kept whole up to the limit; past it, what still comes is dropped
    and the request is answered 413 (`oversize`: None while within the limit, else the length when it
    was declared, 0 when it was not). The HTTP worker and the WSGI face both read through it."""

    __slots__ = ("limit", "chunks", "size", "oversize")

    def __init__(self, limit: int, declared: int | None = None):
        self.limit, self.chunks, self.size = limit, [], 0
        self.oversize = declared if declared is not None and declared > limit else None

    def add(self, data: bytes) -> None:
        if self.oversize is not None:
            return
        self.size += len(data)
        if self.size > self.limit:
            self.oversize, self.chunks = 0, []
            return
        self.chunks.append(data)

    def whole(self) -> bytes:
        """The body, joined; its chunks are let go of, so that a large body is not held twice while it is answered."""
        data, self.chunks = b"".join(self.chunks), []
        return data


def _read_wsgi(stream, length: int | None, body: Body) -> None:
    """The WSGI input into `body`: `length` bytes, or to its end when no length was declared."""
    left = length if length is not None else float("inf")
    while left > 0 and (chunk := stream.read(int(min(_WSGI_CHUNK, left)))):
        body.add(chunk)
        left -= len(chunk)


def request_path(raw: bytes) -> tuple[str, str]:
    """(path, query string) of a request target as sent: the path percent-decoded as UTF-8."""
    if not raw.startswith(b"/") and b"://" in raw:  # absolute-form, as a proxy would send it
        parts = urlsplit(raw)
        raw = (parts.path or b"/") + (b"?" + parts.query if parts.query else b"")
    path, _, query = raw.partition(b"?")
    if b"%" in path:
        path = unquote_to_bytes(path)
    return path.decode("utf-8", "replace"), query.decode("latin-1")


def _logged(request: Request, status: int, started: float) -> None:
    ACCESS_LOG.record(request.method, request.path, request.model, status, started, request.request_id,
                      request.headers.get("x-amzn-sagemaker-target-model"))
