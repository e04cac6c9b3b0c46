"""gunicorn's gevent worker with two keep-alive fixes (`worker_class` in gunicorn_conf).

- Fairness: after each request the connection's greenlet yields, so a client whose next request is
  already buffered cannot be served again and again before other greenlets run (p99 in seconds).
- Shutdown: on SIGTERM, connections idle between requests are closed at once, and the others right
  after their response. gunicorn otherwise counts idle keep-alives (every load balancer keeps some)
  as busy and waits out the whole graceful timeout; requests in flight still finish.
"""

import socket

import gevent
from gunicorn.workers.ggevent import GeventWorker


class Worker(GeventWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._connections = {}  # greenlet → the client socket it serves
        self._idle = set()  # greenlets waiting for the next request on a keep-alive connection

    def handle(self, listener, client, addr):
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
        super().handle_request(listener_name, req, sock, addr)
        if not self.alive:  # shutting down: this connection's next read must not wait for a request
            _hang_up(sock)
        gevent.sleep(0)

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        for greenlet in list(self._idle):
            if greenlet in self._connections:
                _hang_up(self._connections[greenlet])


def _hang_up(sock) -> None:
    """The pending read sees end-of-stream, and gunicorn closes the connection its usual way."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


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
