"""HTTP/1.1 connections on gevent, parsed by httptools (llhttp, a C parser), each request handed straight
to a dispatcher (api/pipeline.py, or a front-end's way to it) instead of through WSGI: gunicorn's
pure-Python parser and the WSGI environ cost more CPU than the rest of a small request. The gunicorn
worker (gunicorn_worker.py) and the HTTP front-end processes (http_frontend/) both serve through
`Connections`, which keeps the promises of gunicorn's gevent worker:

- Fairness: after each response the connection's greenlet yields, so a client whose next request is
  already buffered cannot be served again and again before other greenlets run (p99 in seconds).
- Pipelining: requests that arrive together are answered in order, one at a time.
- Shutdown: on SIGTERM, connections idle between requests are closed at once, and the others right
  after their response; requests in flight still finish, and a request that still arrives (pipelined
  behind one in flight) is answered 503 with Retry-After.
- Errors in the HTTP itself (a malformed request, a request line or headers past gunicorn's limits,
  a head or body too slow, a body too large, a request at shutdown) are answered by the dispatcher
  like every other error — its renderer, a request id, the access log — and the connection closed.
- Slow and idle clients: a new connection that stays silent for SERVE_FIRST_REQUEST_TIMEOUT is
  closed; between requests the keep-alive timeout applies. A request head must arrive whole within
  SERVE_REQUEST_HEAD_TIMEOUT, and a body at SERVE_MIN_BODY_RATE on average (after a grace), else 408.
  When every connection slot is taken, the connection idle the longest is closed to make room, so a
  new client is always served. An answer must be taken at SERVE_MIN_BODY_RATE too, after the same
  grace, else its connection is closed.
- Heads are bounded while they arrive: SERVE_MAX_HEADER_BYTES and gunicorn's field count (every
  header line counts, repeated names too) and field size; past them, 431.
- Bodies: read once, kept whole up to the size limit (the handler's buffer is what `np.frombuffer`
  reads). A Content-Length past the limit is a 413 at once, before the body is read; a chunked body
  that grows past it is read and dropped, and the pipeline answers 413. What a process makes of the
  bodies it has read is bounded too (body_budget.py): a whole body counts from then until its answer
  is made, and waits for room first.
"""

import email.utils
import functools
import logging
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import gevent
import httptools
from gevent.event import Event

from container.api.errors import status_line
from container.api.pipeline import Body, Request, Response, request_path
from container.body_budget import BodyBudget, no_room
from container.errors import HeadersTooLarge, InvalidRequest, RequestTimeout, ServeError, Unavailable, UriTooLong
from container.inference import Client
from container.settings import Settings

log = logging.getLogger(__name__)
_RECEIVE = 256 << 10
_INLINE_BODY = 64 << 10  # a smaller body is sent with its head in one write
_BODY_GRACE = 5.0  # seconds a body may take before SERVE_MIN_BODY_RATE applies
_LINGER = 2.0  # seconds a refused request's unread body is drained, so its client can read the answer
SHUTTING_DOWN = "the server is shutting down; send the request again (to another instance)"


@dataclass(frozen=True)
class HeadLimits:
    """gunicorn's bounds on a request head (0: none) and its keep-alive (frontends.head_limits reads them)."""

    max_line: int
    max_fields: int
    max_field: int
    keepalive: float


class Connections:
    """The HTTP connections of one process: its connection slots, the idle connections (the longest
    idle first), and its shutdown. `dispatcher` answers requests (`serve`) and refusals (`refuse`);
    `new_client` makes the Client a connection is to the schedulers."""

    def __init__(self, dispatcher, settings: Settings, limits: HeadLimits, capacity: int,
                 new_client: Callable[[], Client] = Client, max_requests: int | None = None,
                 retire: Callable[[], None] | None = None, ending: str = SHUTTING_DOWN):
        """`max_requests`: once answered, the process retires (`retire()`), as gunicorn's setting says.
        `ending`: what a request that still arrives as the process stops is told."""
        self.dispatcher, self.settings, self.limits, self.capacity = dispatcher, settings, limits, capacity
        self.ending = ending
        self.new_client, self.max_requests, self.retire = new_client, max_requests, retire
        self.idle: dict = {}  # greenlet → the socket of its connection, waiting for a (next) request
        self.bodies = BodyBudget(settings.bodies_per_process)
        self.count = self.served = 0
        self.alive = True
        self.drained = Event()  # set while no connection is open
        self.drained.set()

    def handle(self, sock) -> None:
        self.count += 1
        self.drained.clear()
        if self.count >= self.capacity and self.idle:
            # the last slot is taken: free one, so the next client is accepted and served
            _hang_up(self.idle.pop(next(iter(self.idle))))
        connection = Connection(self, sock)
        try:
            connection.serve()
        finally:
            self.count -= 1
            _close(sock)
            connection.client.close()
            if not self.count:
                self.drained.set()

    def answered(self) -> None:
        self.served += 1
        if self.max_requests is not None and self.served >= self.max_requests:
            self.alive = False
            self.retire()

    def shut_down(self) -> None:
        """Connections idle between requests close now, the others after their response."""
        self.alive = False
        for sock in list(self.idle.values()):
            _hang_up(sock)

    def drain(self, timeout: float) -> None:
        """At a stop, once no new connection is accepted: idle ones close, and those under way have up to
        `timeout` seconds to be answered. What the stop waits for is said, so that one that lingers is explained."""
        self.shut_down()
        if self.count:
            log.info("stopping: waiting for the requests under way", extra={"fields": {"connections": self.count}})
        if not self.drained.wait(timeout):
            log.warning("requests still under way at the end of the graceful timeout are abandoned",
                        extra={"fields": {"connections": self.count}})


class Connection:
    """One client connection: httptools calls the `on_*` methods as bytes arrive."""

    def __init__(self, connections: Connections, sock):
        self.connections, self.sock = connections, sock
        self.dispatcher = connections.dispatcher
        self.max_body = self.dispatcher.max_body
        limits, settings = connections.limits, connections.settings
        self.max_line = limits.max_line or 1 << 62
        self.max_fields = limits.max_fields or 1 << 62
        self.max_field = limits.max_field or 1 << 62
        self.max_head = settings.max_header_bytes
        self.head_timeout, self.body_rate = settings.request_head_timeout, settings.min_body_rate
        self.idle_timeout = settings.first_request_timeout  # until the first request; then keep-alive's
        self.parser = httptools.HttpRequestParser(self)
        self.client = connections.new_client()  # the connection as the schedulers see it
        self.ready: deque = deque()  # (request, keep_alive) parsed and not yet answered
        self.in_message = self.in_body = False
        self._watch = None  # the hub's watcher of the socket while a request is answered
        self._reset()

    def _reset(self) -> None:
        self.url, self.headers, self.body = b"", {}, Body(self.max_body)
        self.fields = self.head_bytes = self.received = 0
        self.started = time.monotonic()

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.max_line:
            raise UriTooLong(f"Request Line is too large ({len(self.url)} > {self.max_line})")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields += 1
        if self.fields > self.max_fields:
            raise HeadersTooLarge(f"the request has more than {self.max_fields} header fields")
        if len(name) + len(value) > self.max_field:
            raise HeadersTooLarge(f"header {name[:100].decode('latin-1')!r} is longer than {self.max_field} bytes")
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        previous = self.headers.get(key)
        self.headers[key] = text if previous is None else f"{previous}, {text}"

    def on_headers_complete(self) -> None:
        self.in_body, self.started = True, time.monotonic()
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise self.dispatcher.too_large(int(length))
        if self.headers.get("expect", "").lower() == "100-continue":
            self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.received += len(body)
        self.body.add(body)

    def on_message_complete(self) -> None:
        self.in_message = self.in_body = False
        path, query = request_path(self.url)
        self.client.requests += 1
        request = Request(self.parser.get_method().decode("latin-1"), path, query, self.headers,
                          self.body.whole(), self.body.oversize, self.client)
        self.ready.append((request, self.parser.should_keep_alive()))

    # -- the connection ----------------------------------------------------------------------------

    def serve(self) -> None:
        connections, sock = self.connections, self.sock
        greenlet = gevent.getcurrent()
        while True:
            timeout, too_slow = self._deadline()
            if timeout <= 0:
                self._refuse(RequestTimeout(too_slow))
                return
            sock.settimeout(timeout)
            idle = not self.in_message
            if idle:
                connections.idle[greenlet] = sock
            try:
                data = sock.recv(_RECEIVE)
            except socket.timeout:
                if not idle:
                    self._refuse(RequestTimeout(too_slow))
                return
            except OSError:  # the client went away, or was hung up on to make room
                return
            finally:
                connections.idle.pop(greenlet, None)
            if not data:
                return
            self.idle_timeout = connections.limits.keepalive
            in_head = self.in_message and not self.in_body  # before this read: all of it is head
            try:
                self.parser.feed_data(data)
                if in_head and self.in_message and not self.in_body:
                    self.head_bytes += len(data)  # httptools holds a header value whole until its line ends
                    if self.head_bytes > self.max_head:
                        raise HeadersTooLarge(f"the request head is larger than {self.max_head} bytes (SERVE_MAX_HEADER_BYTES)")
            except ServeError as refusal:
                self._refuse(refusal)
                return
            except httptools.HttpParserUpgrade:
                pass  # no protocol upgrades here: the request is answered, and the connection closed
            except httptools.HttpParserError as exc:
                refusal = exc.__context__  # httptools wraps what a callback raised
                self._refuse(refusal if isinstance(refusal, ServeError) else InvalidRequest(f"malformed HTTP request: {exc}"))
                return
            if not self._answer():
                return

    def _deadline(self) -> tuple[float, str]:
        """Seconds the next read may wait, and what a request still arriving then is told."""
        if not self.in_message:
            return self.idle_timeout, ""
        elapsed = time.monotonic() - self.started
        if not self.in_body:
            return self.head_timeout - elapsed, (f"the request head did not arrive within {self.head_timeout} s "
                                                 f"(SERVE_REQUEST_HEAD_TIMEOUT)")
        return _BODY_GRACE + self.received / self.body_rate - elapsed, (
            f"the body arrived slower than {self.body_rate} bytes/s (SERVE_MIN_BODY_RATE)")

    def _answer(self) -> bool:
        """Answer the requests parsed so far, in order; False once the connection must close."""
        connections = self.connections
        while self.ready:
            request, keep_alive = self.ready.popleft()
            if not connections.alive:
                self._refuse(Unavailable(connections.ending), request)
                return False
            response = self._counted(request)
            if response is None:
                return False
            connections.answered()
            # shutting down: close after this response, unless requests behind it are to be refused first
            close = not keep_alive or (not connections.alive and not self.ready)
            if not self._send(response, close, request.method == "HEAD") or close:
                return False
            gevent.sleep(0)
        return True

    def _counted(self, request: Request) -> Response | None:
        """`_served`, with its body counted among those the process holds until its answer is made, waiting
        for room as long as SAGEMAKER_MODEL_SERVER_TIMEOUT allows (body_budget.py); None once refused."""
        size, timeout = len(request.body), self.connections.settings.model_server_timeout
        if not self.connections.bodies.take(size, timeout):
            self._refuse(no_room(timeout), request)
            return None
        try:
            return self._served(request)
        finally:
            self.connections.bodies.give(size)

    def _served(self, request: Request) -> Response:
        """The dispatcher's response to `request`, watching meanwhile for its client hanging up: then the
        connection's Client closes, which cancels the request if it waits for an instance (a client that
        timed out and sent its request again does not cost the model twice)."""
        watch = self._watching(self.client.close)
        try:
            return self.dispatcher.serve(request)
        finally:
            watch.stop()

    def _watching(self, hang_up: Callable[[], None]):
        """The hub's watcher of the socket, started: `hang_up()` once the client is seen gone (`_readable`)."""
        watch = self._watch
        if watch is None:
            watch = self._watch = gevent.get_hub().loop.io(self.sock.fileno(), 1)
        watch.start(self._readable, hang_up)
        return watch

    def _readable(self, hang_up: Callable[[], None]) -> None:
        """On the hub: bytes, or the end of the stream, arrived while a request was under way. Bytes are a
        request sent behind it (pipelined), read after its answer; the end, or a reset, is the client
        gone (as nginx and Go's net/http take it): `hang_up()` in a greenlet of its own."""
        try:
            ahead = self.sock._sock.recv(1, socket.MSG_PEEK)  # the raw socket: gevent's recv would wait, on the hub
        except BlockingIOError:
            return  # nothing after all: still watching
        except OSError:
            ahead = b""
        self._watch.stop()
        if not ahead:
            gevent.spawn(hang_up)

    def _refuse(self, refusal: ServeError, request: Request | None = None) -> None:
        """Answer `refusal` through the dispatcher, as every answer goes (the request as far as it was
        read, when it was not read whole), and close the connection: first the sending side, then, for a
        moment, read and drop what the client still sends (a body it was writing while refused), as a
        client that sees its connection reset mid-write never reads the answer."""
        self._send(self.dispatcher.refuse(request or self._partial(), refusal), close=True)
        try:
            self.sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + _LINGER
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                if not self.sock.recv(_RECEIVE):
                    break
                gevent.sleep(0)  # a read that finds data does not yield: let the other connections run
        except OSError:
            pass

    def _partial(self) -> Request:
        """The request being read, as far as it arrived: for the access log and the error's spelling."""
        try:
            method = self.parser.get_method().decode("latin-1")
        except httptools.HttpParserError:  # not even the method arrived
            method = ""
        path, query = request_path(self.url) if self.url else ("", "")
        return Request(method, path, query, self.headers)

    def _send(self, response: Response, close: bool, head_only: bool = False) -> bool:
        """Write `response`; False when its client left, or did not take it in time (`_write`): then the
        connection closes, since what it has read is not a whole answer."""
        body = response.body
        length = "Transfer-Encoding: chunked" if response.stream is not None else f"Content-Length: {len(body)}"
        lines = [f"HTTP/1.1 {status_line(response.status)}\r\nDate: {_date()}\r\n{length}\r\n"]
        for name, value in response.headers.items():
            if "\r" in value or "\n" in value:  # a handler's header must not split the response
                value = " ".join(value.splitlines())
            lines.append(f"{name}: {value}\r\n")
        lines.append("Connection: close\r\n\r\n" if close else "\r\n")
        head = "".join(lines).encode("latin-1", "replace")
        try:
            if head_only:
                self._write(head)
            elif response.stream is not None:
                self._write(head)
                self._write_chunks(response.stream)
            elif len(body) <= _INLINE_BODY:
                self._write(b"".join((head, body)))
            else:
                self._write(head)
                self._write(body)
        except OSError:
            return False
        return True

    def _write_chunks(self, stream) -> None:
        """Each piece as one chunk as soon as it is made, then the end. A client that leaves ends the
        stream (its generator is closed), whether a write fails or, between pieces, the connection is
        seen to end: then this greenlet is killed where it waits for the next piece."""
        watch = self._watching(functools.partial(gevent.kill, gevent.getcurrent()))
        try:
            for piece in stream:
                if piece:
                    self._write(b"".join((b"%x\r\n" % len(piece), piece, b"\r\n")))
            self._write(b"0\r\n\r\n")
        finally:
            watch.stop()
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    def _write(self, data) -> None:
        """One send, which takes a small response whole; gevent's sendall costs ~5 µs more per call. The
        client must take it as a body must arrive: at SERVE_MIN_BODY_RATE on average after the grace (the
        socket's timeout was the last read's, so that a pause of SERVE_FIRST_REQUEST_TIMEOUT once cut an
        answer in two and left its connection open)."""
        self.sock.settimeout(_BODY_GRACE + len(data) / self.body_rate)
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
