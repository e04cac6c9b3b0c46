"""gunicorn's gevent worker with two keep-alive fixes and a deadline (`worker_class` in gunicorn_conf).

- Fairness: after each request the connection's greenlet yields, so a client whose next request is
  already buffered cannot be served again and again before other greenlets run (p99 in seconds).
- Shutdown: on SIGTERM, connections idle between requests are closed at once, and the others right
  after their response. gunicorn otherwise counts idle keep-alives (every load balancer keeps some)
  as busy and waits out the whole graceful timeout; requests in flight still finish, and a request
  that still arrives (pipelined behind one in flight) is answered 503 with Retry-After.
- Errors gunicorn answers itself (a request line too long, a bad chunk size) are JSON like ours,
  not HTML.
- First request: a new connection that stays silent for SERVE_FIRST_REQUEST_TIMEOUT is closed.
  gunicorn waits for it forever, so idle connections could fill `worker_connections` and leave
  new clients unanswered.
"""

import os
import socket

import gevent
import gevent.socket
from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

from container.api.errors import json_error, status_line
from container.settings import Settings


def _write_json_error(sock, status: int, reason: str, message: str) -> None:
    body = json_error(message or reason)
    head = f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    util.write_nonblock(sock, head.encode("latin-1") + body)


util.write_error = _write_json_error  # gunicorn's workers call it through the module


class Worker(GeventWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._connections = {}  # greenlet → the client socket it serves
        self._idle = set()  # greenlets waiting for the next request on a keep-alive connection
        self._first_request_timeout = Settings.from_env(os.environ).first_request_timeout

    def handle(self, listener, client, addr):
        try:
            gevent.socket.wait_read(client.fileno(), self._first_request_timeout)
        except (TimeoutError, OSError):
            util.close(client)
            return
        current = gevent.getcurrent()
        self._connections[current] = client
        try:
            super().handle(listener, client, addr)
        finally:
            del self._connections[current]

    def timeout_ctx(self):
        """gunicorn wraps only the wait for a keep-alive connection's next request in this."""
        return _IdleWait(self._idle, self.cfg.keepalive)

    def handle_request(self, listener_name, req, sock, addr):
        if not self.alive:
            _refuse(sock)
            return
        super().handle_request(listener_name, req, sock, addr)
        if not self.alive:  # shutting down: this connection's next read must not wait for a request
            _hang_up(sock, socket.SHUT_RD)
        gevent.sleep(0)

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        for greenlet in list(self._idle):
            if greenlet in self._connections:
                _hang_up(self._connections[greenlet])


def _hang_up(sock, how: int = socket.SHUT_RDWR) -> None:
    """The pending read sees end-of-stream, and gunicorn closes the connection its usual way."""
    try:
        sock.shutdown(how)
    except OSError:
        pass


def _refuse(sock) -> None:
    body = json_error("the server is shutting down; send the request again (to another instance)")
    head = (f"HTTP/1.1 {status_line(503)}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Retry-After: 1\r\nConnection: close\r\n\r\n")
    try:
        sock.sendall(head.encode() + body)
    except OSError:
        pass
    _hang_up(sock)


class _IdleWait:
    def __init__(self, idle: set, seconds: float):
        self._idle = idle
        self._timeout = gevent.Timeout(seconds, False)

    def __enter__(self):
        self._idle.add(gevent.getcurrent())
        return self._timeout.__enter__()

    def __exit__(self, *exc):
        self._idle.discard(gevent.getcurrent())
        return self._timeout.__exit__(*exc)
