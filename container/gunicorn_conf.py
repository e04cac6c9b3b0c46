"""gunicorn settings, derived from the same environment as the app (`gunicorn -c python:container.gunicorn_conf`)."""

import contextlib
import os
import shutil
import signal
import time

from gunicorn import sock

from container import channel, frontends, gunicorn_worker, resources, workdirs
from container.channel.blobs import Blobs
from container.settings import Settings, unused_variables

resources.raise_open_file_limit()  # first: the connection cap follows from it, and the worker inherits it
resources.keep_freed_heap()  # here and in every process the server starts
_settings = Settings.from_env(os.environ)

bind = f"0.0.0.0:{_settings.port}"
workers = 1  # one process owns the models: the cache and the GPU context exist once
worker_class = "container.gunicorn_worker.Worker"  # gevent, HTTP parsed by httptools, keep-alive fairness, fast shutdown
worker_connections = _settings.max_connections
timeout = _settings.model_server_timeout
graceful_timeout = 30
keepalive = 75  # longer than the load balancers' idle timeout (60 s), so they close first
loglevel = _settings.log_level.lower()
logger_class = "container.logs.GunicornLogger"  # its own lines as JSON, like the app's
control_socket_disable = True  # gunicorn 27's admin socket in $HOME: unused here, and $HOME may not be writable


def when_ready(server):
    """In the master, before its worker: the channel's directory, and the front-ends that reach the
    worker through it (gunicorn restarts the worker; the front-ends wait for it meanwhile). Once the
    master is told to stop, a front-end that exits is not started again; at SIGTERM the front-ends, HTTP
    and gRPC, drain before the worker is told to, as their requests under way need it."""
    for name, why in unused_variables(os.environ).items():
        server.log.warning("an environment variable is not used", extra={"fields": {"variable": name, "why": why}})
    for pid in workdirs.stale_servers():
        _remove_server_files(pid)
    server.workdir = workdirs.claim(os.getpid())  # held, by this process and its worker, until they exit
    path = channel.socket_path(os.getpid())
    grpc = frontends.grpc_front_ends(_settings.http_workers, _settings.grpc_port, path, server.log) if _settings.grpc_port else []
    server.front_ends = [*http_front_ends(server, path), *grpc]
    for front_end in server.front_ends:
        front_end.start()
    server.handle_term = _draining_first(server, server.front_ends, server.handle_term)
    server.handle_hup = lambda: _restart_model_process(server)
    server.handle_ttin = server.handle_usr2 = lambda: server.log.warning(
        "Ignored: one model process owns the models (SIGTTIN would add another, SIGUSR2 start a second "
        "server beside this one); SIGHUP restarts it")
    for name in ("handle_int", "handle_quit"):  # gunicorn's handlers of the signals that stop it at once
        setattr(server, name, _draining_first(server, [], getattr(server, name)))


def http_front_ends(server, path: str) -> list:
    """SERVE_HTTP_WORKERS front-ends on the master's listeners (none: the worker serves HTTP itself)."""
    listeners = [listener.fileno() for listener in server.LISTENERS]
    for fd in listeners:
        os.set_inheritable(fd, True)  # across posix_spawn to the front-ends (the worker forks, and has them anyway)
    head = frontends.head_limits(server.cfg)
    return [frontends.http_front_end(n, path, listeners, head, server.cfg.graceful_timeout, server.log)
            for n in range(_settings.http_workers)]


def _draining_first(server, draining, handle):
    """`handle`, gunicorn's, after the `draining` front-ends have drained (up to the graceful timeout). The
    master's listeners close first: the HTTP front-ends close theirs as they drain, and a socket nobody
    accepts from any more would hold new connections in its queue until the last process closed it (a
    client's request waited out its timeout, then was reset), where a closed port refuses them at once."""
    def handle_stop():
        for front_end in server.front_ends:
            front_end.stopping()
        for pid in server.WORKERS:  # its loads under way end now, rather than hold the front-ends' drain
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, gunicorn_worker.STOP_LOADING)
        sock.close_sockets(server.LISTENERS, unlink=False)
        server.LISTENERS = []
        for front_end in draining:
            front_end.terminate()
        deadline = time.monotonic() + graceful_timeout
        for front_end in draining:
            front_end.wait(max(0.0, deadline - time.monotonic()))
        handle()
    return handle_stop


def post_fork(server, worker):
    """In the new worker, before it sets its own signal handlers: until then a signal goes to the
    master's, copied into it by the fork, which only queues it (`Worker.init_signals` reads the queue)."""
    worker.signals_before_its_own = server.SIG_QUEUE


def _restart_model_process(server) -> None:
    """SIGHUP: gunicorn would start a new worker beside the old one while it drains, two processes
    loading and holding models (a GPU's memory among them) at once, which no memory budget allows for.
    Here the model process drains and exits, as at SIGTERM, and gunicorn starts the next once it has; the
    front-ends answer 503 with Retry-After meanwhile, as while any model process restarts."""
    server.log.info("Hang up: the model process drains, then a new one starts")
    for pid in list(server.WORKERS):
        os.kill(pid, signal.SIGTERM)


def on_exit(server):
    """The worker has drained and exited: the front-ends drain and exit too."""
    for front_end in getattr(server, "front_ends", ()):  # none when the master failed before it was ready
        front_end.stop(graceful_timeout)
    _remove_server_files(os.getpid())


def child_exit(server, worker):
    """The model process has exited, however it ended: nothing of its models' files serves any more;
    and while no other one runs (gunicorn starts the next after this), what the front-ends wrote for it
    will not be taken. What it wrote itself, its last answers, the front-ends may still be reading."""
    shutil.rmtree(workdirs.scratch(os.getpid(), worker.pid), ignore_errors=True)
    if not server.WORKERS:
        _blobs(os.getpid()).remove_all(sparing=worker.pid)


def _remove_server_files(master_pid: int) -> None:
    shutil.rmtree(workdirs.server(master_pid), ignore_errors=True)
    _blobs(master_pid).remove_all()  # data a process that died wrote and nobody took


def _blobs(master_pid: int) -> Blobs:
    """The channel's data in shared memory, of the server whose master is `master_pid`."""
    return Blobs(channel.blob_prefix(channel.socket_path(master_pid)))
