"""Front-end processes the gunicorn master runs beside its worker (the HTTP front-ends and the gRPC
ones), each restarted when it dies. They hold no model, so a restart loses none; they reach the worker, the one
process that owns the models, over the channel. The master starts them before its worker and stops
them when it exits."""

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import psutil

from container import resources

# What each front-end process holds (its PSS), measured with a model loaded and requests served
# (29 and 41 MiB on 2026-11-25), rounded up: the models' budget leaves room for them.
HTTP_FRONT_END_BYTES = 32 << 20
GRPC_FRONT_END_BYTES = 48 << 20
_RESTART_DELAY = 1.0  # seconds before a dead front-end is started again; doubled while it keeps dying at once
_MAX_DELAY = 60.0
# Seconds of running after which an exit is a new failure (a crash, the OOM killer), not one that cannot start
# (a port taken, a broken install: it exits within its imports' 0.4 s). Restarting the former at once keeps the
# cores serving; at 60 s, a front-end killed every minute was down for up to 30 s each time.
_STEADY = 10.0


class FrontEnd:
    def __init__(self, name: str, command: list[str], log):
        """`log`: the master's logger (gunicorn's, which writes JSON lines)."""
        self.name, self.command, self.log = name, command, log
        self.process: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._keep_running, name=f"front-end {name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stopping(self) -> None:
        """The master was told to stop: a front-end that exits now is not started again (a signal to the
        whole process group reaches it before the master has stopped its worker)."""
        self._stopping.set()

    def stop(self, timeout: float) -> None:
        """SIGTERM, `timeout` seconds to drain, then SIGKILL."""
        self.terminate()
        self.wait(timeout)

    def terminate(self) -> None:
        """SIGTERM: the front-end drains, and is not started again."""
        self._stopping.set()
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> None:
        """Until the front-end has exited; SIGKILL once `timeout` seconds have passed. Its thread, told
        to stop, ends as the process exits (Popen's own wait with a timeout polls every 50 ms)."""
        self._thread.join(timeout)
        if self._thread.is_alive() and self.process is not None:
            self.process.kill()

    def _keep_running(self) -> None:
        delay = _RESTART_DELAY
        while not self._stopping.is_set():
            started = time.monotonic()
            # close_fds=False makes Popen use posix_spawn: no fork, so no pipe of its own that gunicorn's
            # forking of a worker at the same moment could inherit (Popen would then wait for that worker)
            self.process = subprocess.Popen(self.command, close_fds=False)
            if self._stopping.is_set():  # told to stop while it was being started: `terminate` found no process
                self.process.send_signal(signal.SIGTERM)
            resources.killed_first(self.process.pid)
            self.log.info("front-end started", extra={"fields": {"front_end": self.name, "pid": self.process.pid}})
            # gunicorn's master reaps every child; waiting then fails with ECHILD, which Popen reads as an exit
            code = self.process.wait()
            delay = _RESTART_DELAY if time.monotonic() - started > _STEADY else min(delay * 2, _MAX_DELAY)
            if self._stopping.wait(delay / 2):
                return
            self.log.error("front-end exited; starting it again", extra={"fields": {
                "front_end": self.name, "pid": self.process.pid, "status": code, "after_seconds": delay / 2}})


class Connected:
    """The front-end processes connected to the model process (their pids, as the channel's peer
    credentials give them), and what they hold beyond what the budget set aside for them at start: each
    keeps up to glibc's trim threshold of freed heap (resources.keep_freed_heap), and a large request
    or a burst leaves it holding more than its idle pages."""

    def __init__(self, allowance: int):
        self.allowance = allowance  # memory(): what the budget set aside for all of them
        self._pids: Counter[int] = Counter()  # pid → its connections

    def connected(self, pid: int) -> None:
        """A channel connection from `pid`, counted when it is a front-end: a process the master started,
        as it started this one. A python model's worker connects too, for its BLS calls: its memory is
        its model's."""
        try:
            if psutil.Process(pid).ppid() == os.getppid():
                self._pids[pid] += 1
        except psutil.Error:
            pass

    def disconnected(self, pid: int) -> None:
        if pid in self._pids:
            self._pids[pid] -= 1
            if not self._pids[pid]:
                del self._pids[pid]

    def beyond_allowance(self) -> int:
        """Their anonymous resident bytes together, less the allowance (0 below it)."""
        return max(sum(resources.anonymous_bytes(pid) for pid in list(self._pids)) - self.allowance, 0)


def memory(http_workers: int, grpc: bool) -> int:
    """Bytes the front-end processes hold beside the model process."""
    return http_workers * HTTP_FRONT_END_BYTES + (grpc_workers(http_workers) * GRPC_FRONT_END_BYTES if grpc else 0)


def grpc_workers(http_workers: int) -> int:
    """gRPC front-ends: as many as HTTP ones, so that gRPC is served on as many cores; one at least."""
    return max(http_workers, 1)


def grpc_front_ends(http_workers: int, port: int, channel: str, log) -> list[FrontEnd]:
    """The gRPC front-ends, sharing `port` (SO_REUSEPORT: the kernel spreads connections over them), or,
    when the port is taken already, one front-end that says so and tries again (backing off) as it
    would alone: a second server on the port is an error, never a silent share."""
    shared = port_free(port)
    if not shared:
        log.error("the gRPC port is taken; set SERVE_GRPC_PORT to a free port, or off", extra={"fields": {"port": port}})
    return [FrontEnd(f"grpc-{n}", [sys.executable, "-m", "container.grpc_api", channel, "shared" if shared else "alone"], log)
            for n in range(grpc_workers(http_workers) if shared else 1)]


def port_free(port: int) -> bool:
    """Whether nothing listens on TCP `port`: tried without SO_REUSEPORT, so that a listener that shares
    it (another server's gRPC front-ends) takes it too."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((address, port))
                return True
        except OSError as exc:  # in use; or this family is off here (IPv6 disabled): the next one says
            if exc.errno == errno.EADDRINUSE:
                return False
    return True  # no address to try it on: gRPC's own bind will say what is wrong


def head_limits(cfg) -> dict:
    """gunicorn's bounds on a request head (0: none) and its keep-alive (http_transport.HeadLimits)."""
    return {"max_line": cfg.limit_request_line, "max_fields": cfg.limit_request_fields,
            "max_field": cfg.limit_request_field_size, "keepalive": cfg.keepalive}


def http_front_end(number: int, channel: str, listeners: list[int], head: dict, graceful_timeout: float, log) -> FrontEnd:
    """The `number`th HTTP front-end, serving the master's `listeners` (descriptors it leaves open)."""
    limits = json.dumps({"head": head, "graceful_timeout": graceful_timeout})
    return FrontEnd(f"http-{number}", [sys.executable, "-m", "container.http_frontend", channel, limits,
                                       *map(str, listeners)], log)
