"""The model process: gunicorn's one gevent worker, which loads the app (the core and every model) and
serves the channel (channel/server.py) to the front-end processes. With SERVE_HTTP_WORKERS=0 it serves
HTTP itself (http_transport.py); otherwise the HTTP front-ends do, and hand it their requests over the
channel. gunicorn still manages the process (`worker_class` in gunicorn_conf): its start, its
heartbeat, its restart, its graceful stop. With SERVE_METRICS_PORT it also serves `/metrics` alone there."""

import atexit
import importlib
import logging
import os
import signal

import gevent
from gevent import socket  # the loop's own: nothing here is monkey-patched
from gevent.event import Event
from gevent.pool import Pool
from gevent.server import StreamServer
from gunicorn.workers.ggevent import GeventWorker

from container import channel, frontends
from container.channel.server import STOPPING, ChannelServer
from container.http_transport import Connections, HeadLimits
from container.settings import Settings

log = logging.getLogger(__name__)
_METRICS_CONNECTIONS = 64  # scrapers at once on SERVE_METRICS_PORT
_METRICS_RETRY = 1.0  # seconds between tries of a metrics port that another process holds
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
# From the master as the server starts to stop, while the front-ends drain (gunicorn_conf): the loads end
STOP_LOADING = signal.SIGUSR2
# What the master sends its worker: to stop (TERM, QUIT; INT from a terminal reaches the whole group),
# to reopen logs (USR1), to end its loads (USR2), to restart (HUP)
_FROM_THE_MASTER = (*_STOPS, signal.SIGHUP, signal.SIGUSR1, STOP_LOADING)


class Worker(GeventWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = Settings.from_env(os.environ)
        self.connections: Connections | None = None
        self.channel: ChannelServer | None = None
        self.metrics_server: StreamServer | None = None
        self.stopping: Event | None = None  # set by SIGTERM: the channel-only loop ends at once, not at its next beat
        self.loads_end = False  # the server stops: loads under way end, and later ones are refused
        self.wsgi = None  # the app, once load_wsgi has made it
        self._importing = False  # importing the app's modules: a stop ends the process at once (handle_exit, handle_quit)

    def patch(self):
        """gunicorn's gevent worker monkey-patches the standard library here; this one patches nothing, as
        the HTTP front-ends do not. Its greenlets use gevent by name (`gevent.socket`, `gevent.sleep`,
        `gevent.event`, `gevent.lock`), and its native threads (loads, executions, downloads) the standard
        library as CPython made it: gevent's, met by native threads, was measured failing every way. Each
        lock, condition and queue a module made (a logging handler's, the import system's) now and then left
        a thread waiting for ever, a wake-up lost between two threads' hubs; a thread's `subprocess.run` or
        `os.waitpid` raised (gevent watches children on the main thread's loop alone); a descriptor it
        closed stayed open (the close deferred to its hub's loop, which it never runs); and each thread
        that touched a socket (boto3's transfer threads, eight to an S3 download) left its hub's thread
        pool and descriptors behind when it ended."""
        self.sockets = [socket.socket(s.FAMILY, socket.SOCK_STREAM, fileno=s.sock.detach()) for s in self.sockets]

    def load_wsgi(self):
        # Most of a boot is importing the app's modules (torch: ~1 s here, more from a cold disk). A stop in
        # the meantime would wait for that and for the app to be made, with nothing to drain: it ends the
        # process at once instead, from its handler (the import has started no thread yet), or here for a
        # stop queued before the handlers were set.
        self._importing = True
        try:
            if self.alive:
                importlib.import_module("container.app")
        finally:
            self._importing = False
        if not self.alive:
            raise SystemExit(0)
        super().load_wsgi()
        extensions = self.wsgi.extensions  # of the app create_app() made
        if self.loads_end:  # told before the app was made
            extensions["core"].stop_loading(STOPPING)
        if not self.settings.http_workers:  # HTTP is this process's own
            self.connections = Connections(extensions["dispatcher"], self.settings, HeadLimits(**frontends.head_limits(self.cfg)),
                                           self.worker_connections, max_requests=self.max_requests, retire=self._retire,
                                           ending=STOPPING)  # a SIGHUP, or max_requests, stops it too
        # the front-end processes' way in; the master named the socket after itself (gunicorn_conf)
        self.channel = ChannelServer(channel.socket_path(os.getppid()), extensions["channel"],
                                     channel.max_call(self.settings.max_payload_bytes),
                                     on_connect=extensions["front_end_came"], on_disconnect=extensions["front_end_gone"])
        if self.settings.metrics_port is not None:
            scrapes = Connections(extensions["metrics_dispatcher"], self.settings, HeadLimits(**frontends.head_limits(self.cfg)),
                                  _METRICS_CONNECTIONS)
            self.metrics_server = StreamServer(("0.0.0.0", self.settings.metrics_port), lambda sock, _: scrapes.handle(sock))

    def run(self):
        self.stopping = Event()
        self.channel.start()
        if self.metrics_server is not None:
            gevent.spawn(self._serve_metrics)
        try:
            if self.settings.http_workers:
                self._serve_channel_only()
            else:
                self._serve_http()
        finally:
            self.channel.drain(self.cfg.graceful_timeout)

    def _serve_metrics(self) -> None:
        """SERVE_METRICS_PORT, once it can be had: a port another process holds must not keep the models from
        being served (it restarted this process for ever), and `/metrics` is on the HTTP port meanwhile."""
        told = False
        while True:
            try:
                self.metrics_server.start()
                break
            except OSError as exc:
                if not told:
                    log.error("the metrics port is taken; set SERVE_METRICS_PORT to a free port, or off (trying it "
                              "again each second)", extra={"fields": {"port": self.settings.metrics_port, "error": str(exc)}})
                    told = True
            gevent.sleep(_METRICS_RETRY)
        if told:
            log.info("metrics listening", extra={"fields": {"port": self.settings.metrics_port}})

    def _serve_channel_only(self) -> None:
        """The HTTP front-ends hold the listeners; this process answers their calls until told to stop. Its
        copies of the listeners (a fork's) close: at a stop the port closes once the front-ends close theirs."""
        for listener in self.sockets:
            listener.close()
        self._beat_until_stopped()

    def _serve_http(self) -> None:
        """SERVE_HTTP_WORKERS=0: HTTP on the listeners here until told to stop, then until the connections
        under way have drained (up to the graceful timeout). gunicorn's own loop looked for the stop once a
        second, and for the drain once a second more: this process ended 1.0 s after SIGTERM, now 0.13 s (measured)."""
        servers = [StreamServer(listener, lambda sock, _: self.connections.handle(sock), spawn=Pool(self.worker_connections))
                   for listener in self.sockets]
        for server in servers:
            server.start()
        self._beat_until_stopped()
        for server in servers:
            server.close()
        self.connections.drain(self.cfg.graceful_timeout)

    def _beat_until_stopped(self) -> None:
        while self.alive:
            self.notify()
            self.stopping.wait(1.0)  # gunicorn's heartbeat each second, as its own loop beats

    def init_signals(self):
        super().init_signals()
        # a SIGTERM (the master stopping, `docker stop`) that came between the fork and here was queued
        # by the master's handler and lost: the worker served on until the master's graceful timeout
        queued = getattr(self, "signals_before_its_own", None)  # gunicorn_conf.post_fork
        while queued is not None and not queued.empty():
            sig = queued.get_nowait()
            self.alive = self.alive and sig not in _STOPS
            self.loads_end = self.loads_end or sig in (*_STOPS, STOP_LOADING)
        signal.signal(STOP_LOADING, lambda sig, frame: self._end_loads())
        signal.siginterrupt(STOP_LOADING, False)
        atexit.register(_deaf_to_the_master)

    def _end_loads(self) -> None:
        """A load under way would hold the stop as long as it took (loads are not bounded in time), and serve
        nobody after it: each is told to retry elsewhere now (`Core.stop_loading`), and its thread goes with
        the process. Requests under way other than loads are still answered."""
        self.loads_end = True
        if self.wsgi is not None:  # else load_wsgi tells the core
            gevent.get_hub().loop.run_callback(self.wsgi.extensions["core"].stop_loading, STOPPING)

    def _retire(self) -> None:
        self.alive = False
        self.stopping.set()
        self._end_loads()

    def handle_quit(self, sig, frame):
        if self._importing:  # gevent's worker quits in a greenlet, which would run once the boot is done
            raise SystemExit(0)
        super().handle_quit(sig, frame)

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        if self._importing:
            raise SystemExit(0)
        self._end_loads()
        if self.stopping is not None:
            self.stopping.set()
        if self.channel is not None:
            self.channel.draining = True  # calls under way finish; new ones are refused, as new HTTP requests are
        if self.connections is not None:
            self.connections.shut_down()


def _deaf_to_the_master() -> None:
    """As the process ends, CPython gives each signal it handled its default action back, which for the
    master's is death. A stop that reached the whole group (`kill -- -PGID`, a terminal's Ctrl-C) or the
    process alone has it ending by itself while the master, stopping too, sends it SIGUSR2 and SIGTERM:
    it was killed in its last steps, and gunicorn logged "Worker was sent SIGUSR2!" as a fault. Called
    at exit (atexit), once there is nothing left for the master to tell it."""
    for sig in _FROM_THE_MASTER:
        signal.signal(sig, signal.SIG_IGN)
