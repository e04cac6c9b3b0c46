"""gunicorn's gevent worker, with HTTP/1.1 parsed by httptools (llhttp, a C parser) and requests handed
straight to the pipeline (api/pipeline.py) instead of through WSGI: gunicorn's pure-Python parser and
the WSGI environ cost more CPU than the rest of a small request. gunicorn still manages the process
(`worker_class` in gunicorn_conf), and this worker keeps the promises of the one it replaces:

- Fairness: after each response the connection's greenlet yields, so a client whose next request is
  already buffered cannot be served again and again before other greenlets run (p99 in seconds).
- Pipelining: requests that arrive together are answered in order, one at a time.
- Shutdown: on SIGTERM, connections idle between requests are closed at once, and the others right
  after their response; requests in flight still finish, and a request that still arrives (pipelined
  behind one in flight) is answered 503 with Retry-After.
- Errors in the HTTP itself (a malformed request, a request line or headers past gunicorn's limits)
  are answered in JSON like every other error, and the connection is closed.
- First request: a new connection that stays silent for SERVE_FIRST_REQUEST_TIMEOUT is closed, so
  idle connections cannot fill `worker_connections`; between requests the keep-alive timeout applies.
- Bodies: read once, kept whole up to the size limit (the handler's buffer is what `np.frombuffer`
  reads); past the limit they are read and dropped, and the pipeline answers 413. With
  `Expect: 100-continue`, a body past the limit is refused before it is sent.
"""

import email.utils
import os
import socket
import time
from collections import deque

import gevent
import httptools
from gunicorn.workers.ggevent import GeventWorker

from container.api.errors import json_error, status_line
from container.api.pipeline import Request, Response, request_path
from container.settings import Settings

_RECEIVE = 256 << 10
_INLINE_BODY = 64 << 10  # a smaller body is sent with its head in one write


class Worker(GeventWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.idle: dict = {}  # greenlet → the socket of its connection, waiting for a next request
        self.first_request_timeout = Settings.from_env(os.environ).first_request_timeout
        self.dispatcher = None

    def load_wsgi(self):
        super().load_wsgi()
        self.dispatcher = self.wsgi.extensions["dispatcher"]  # the app create_app() made

    def handle(self, listener, client, addr):
        try:
            Connection(self, client).serve()
        finally:
            _close(client)

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        for sock in list(self.idle.values()):
            _hang_up(sock)


class _Refused(Exception):
    """The request cannot be parsed or taken: answer `status` with `message` and close."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Connection:
    """One client connection: httptools calls the `on_*` methods as bytes arrive."""

    def __init__(self, worker: Worker, sock):
        self.worker, self.sock = worker, sock
        self.dispatcher = worker.dispatcher
        self.max_body = self.dispatcher.max_body
        cfg = worker.cfg
        # gunicorn's limits, 0 meaning none
        self.max_line = cfg.limit_request_line or 1 << 62
        self.max_fields = cfg.limit_request_fields or 1 << 62
        self.max_field = cfg.limit_request_field_size or 1 << 62
        self.parser = httptools.HttpRequestParser(self)
        self.ready: deque = deque()  # (request, keep_alive) parsed and not yet answered
        self.in_message = False
        self._reset()

    def _reset(self) -> None:
        self.url, self.headers, self.chunks, self.size = b"", {}, [], 0
        self.oversize: int | None = None

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.max_line:
            raise _Refused(414, f"Request Line is too large ({len(self.url)} > {self.max_line})")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= self.max_fields:
            raise _Refused(431, f"the request has more than {self.max_fields} header fields")
        if len(name) + len(value) > self.max_field:
            raise _Refused(431, f"header {name[:100].decode('latin-1')!r} is longer than {self.max_field} bytes")
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        previous = self.headers.get(key)
        self.headers[key] = text if previous is None else f"{previous}, {text}"

    def on_headers_complete(self) -> None:
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            self.oversize = int(length)
        if self.headers.get("expect", "").lower() == "100-continue":
            if self.oversize is not None:
                raise _Refused(413, str(self.dispatcher.too_large(self.oversize)))
            self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self.oversize is not None:
            return
        self.size += len(body)
        if self.size > self.max_body:
            self.oversize, self.chunks = 0, []
            return
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        path, query = request_path(self.url)
        request = Request(self.parser.get_method().decode("latin-1"), path, query, self.headers,
                          b"".join(self.chunks), self.oversize)
        self.ready.append((request, self.parser.should_keep_alive()))

    # -- the connection ----------------------------------------------------------------------------

    def serve(self) -> None:
        worker, sock = self.worker, self.sock
        sock.settimeout(self.worker.first_request_timeout)
        greenlet = gevent.getcurrent()
        while True:
            idle = not self.in_message
            if idle:
                worker.idle[greenlet] = sock
            try:
                data = sock.recv(_RECEIVE)
            except OSError:  # a timeout, or the client went away
                return
            finally:
                worker.idle.pop(greenlet, None)
            if not data:
                return
            sock.settimeout(worker.cfg.keepalive)
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                pass  # no protocol upgrades here: the request is answered, and the connection closed
            except httptools.HttpParserError as exc:
                refusal = exc.__context__  # httptools wraps what a callback raised
                if isinstance(refusal, _Refused):
                    self._refuse(refusal.status, str(refusal))
                else:
                    self._refuse(400, f"malformed HTTP request: {exc}")
                return
            if not self._answer():
                return

    def _answer(self) -> bool:
        """Answer the requests parsed so far, in order; False once the connection must close."""
        worker = self.worker
        while self.ready:
            request, keep_alive = self.ready.popleft()
            if not worker.alive:
                self._refuse(503, "the server is shutting down; send the request again (to another instance)",
                             {"Retry-After": "1"})
                return False
            response = self.dispatcher.serve(request)
            worker.nr += 1
            if worker.nr >= worker.max_requests:
                worker.alive = False
            # shutting down: close after this response, unless requests behind it are to be refused first
            close = not keep_alive or (not worker.alive and not self.ready)
            self._send(response, close, request.method == "HEAD")
            if close:
                return False
            gevent.sleep(0)
        return True

    def _refuse(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        """Answer `status` in JSON, and close the connection."""
        self._send(Response(json_error(message), "application/json", status, headers), close=True)

    def _send(self, response: Response, close: bool, head_only: bool = False) -> None:
        body = response.body
        lines = [f"HTTP/1.1 {status_line(response.status)}\r\nDate: {_date()}\r\nContent-Length: {len(body)}\r\n"]
        for name, value in response.headers.items():
            if "\r" in value or "\n" in value:  # a handler's header must not split the response
                value = " ".join(value.splitlines())
            lines.append(f"{name}: {value}\r\n")
        lines.append("Connection: close\r\n\r\n" if close else "\r\n")
        head = "".join(lines).encode("latin-1", "replace")
        try:
            if head_only:
                self._write(head)
            elif len(body) <= _INLINE_BODY:
                self._write(b"".join((head, body)))
            else:
                self._write(head)
                self._write(body)
        except OSError:
            pass  # the client left; the loop ends at its next read

    def _write(self, data) -> None:
        """One send, which takes a small response whole; gevent's sendall costs ~5 µs more per call."""
        sent = self.sock.send(data)
        if sent < len(data):
            self.sock.sendall(memoryview(data)[sent:])


_DATE = [0, ""]


def _date() -> str:
    """The Date header, formatted once a second."""
    now = int(time.time())
    if now != _DATE[0]:
        _DATE[:] = [now, email.utils.formatdate(now, usegmt=True)]
    return _DATE[1]


def _hang_up(sock) -> None:
    """The pending read sees end-of-stream, and the connection closes its usual way."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _close(sock) -> None:
    try:
        sock.close()
    except OSError:
        pass
