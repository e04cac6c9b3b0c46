"""A process of user code's own, as the server sees it: forked from the fork server (which imports torch
once, so a worker starts in milliseconds and shares torch's pages), fed messages over a socket pair,
measured from outside, and ended on close. A crash (a segfault, `os._exit`, the OOM killer) ends only
it; a worker that hangs past its deadline is killed. Both kinds of user code run in one: SageMaker
handler models (handler_worker.py) and Triton python-backend models (python_backend.py).

The parent waits on native threads (the model's instance threads), never on the event loop.
"""

import functools
import gc
import itertools
import logging
import pickle
import select
import signal
import socket
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

import psutil

from container import content, errors
from container.backends import footprint
from container.backends.forkserver import ForkServer
from container.errors import DeviceFault, DeviceOutOfMemory, HandlerError, ModelError, ServeError, WorkerLost
from container.inference import Cancellable
from container.models.cache import total_by_device

log = logging.getLogger(__name__)

_STOP_SECONDS = 5  # a worker asked to stop gets this long before it is killed
# Messages are pickled by plain pickle, not multiprocessing's ForkingPickler (which makes a pickler with
# its reducers per message): both ends are this server's code, and a request's costs 20 µs less.
_PROTOCOL = 5
_forkserver = ForkServer()  # started by the first worker's start


@dataclass(frozen=True)
class WorkerOptions:
    """How user code's processes run (see settings.py): SageMaker's toolkit settings for handler
    models, the timeouts, and the channel a python model's BLS calls reach the server by."""

    program: str = "inference.py"
    default_accept: str = content.JSON
    install_requirements: bool = True
    requirements_cache: str = "/tmp/serve-requirements"
    requirements_cache_size: int = 1 << 32  # bytes the cache keeps after an install, at most
    torch_threads: int = 1  # what a pool's workers share
    handler_workers: int = 1  # worker processes of each handler model, at least
    handler_max_workers: int = 1  # ... and at most, while requests wait for one
    handler_idle_seconds: float = 60.0  # how long a worker beyond the least may stay idle
    cuda_contexts: dict[str, int] = field(default_factory=dict)  # device → what a CUDA context takes there
    log_level: str = "INFO"  # a worker logs to the server's stderr in the server's JSON lines
    load_timeout: float | None = None  # seconds a worker may take to start and load its model
    response_timeout: float | None = None  # seconds a python model's execute may take
    handler_timeout: float | None = None  # seconds a handler model's worker may take over one request
    channel: str = ""  # the model process's channel socket (BLS); empty: no BLS


class WorkerProcess:
    """One worker: `start()` runs `target(connection, *args)` in a new process and returns its first
    reply; `tell(message)` sends it a message and `reply()` reads its replies. Callers take turns (`lock`)."""

    def __init__(self, name: str, target, args: tuple, runtimes: tuple[str, ...] = ()):
        """`runtimes`: those its code will use, which the fork server prepares for every worker to share."""
        self.name = name
        self._target, self._args, self._runtimes = target, args, runtimes
        self.lock = threading.Lock()  # callers are native threads
        self._sending = threading.Lock()  # one message on the socket at a time
        self._process = self._connection = self._poller = None
        self._numbers = itertools.count()  # of the messages that hand it requests
        self._loaded = False  # once it has: a worker lost from then on is started again for the next request

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        return self._process is not None

    def deliver(self, message, start: Callable[[], None]) -> None:
        """Send `message`, first calling `start()` when the process does not run or ended while idle (a
        signal, the OOM killer), which is reaped and logged here rather than met as a closed socket. Nothing
        comes from an idle worker but its end (a look: 0.4 µs); one that sent what it was not asked for (a
        python model's thread answering after its `execute` failed) is ended too, as its message would be
        read as the next request's answer. One that ends between the look and the send had not read the
        message whole, so had begun none of it: it is started again and sent the message once more."""
        if self._process is not None and self._poller.poll(0):
            self._end_idle()
        if self._process is None:
            start()
        try:
            self.tell(message)
        except OSError:
            self._end_idle()
            start()
            self.tell(message)

    def _end_idle(self) -> None:
        process = self._process
        process.kill()
        exit_code = process.wait(_STOP_SECONDS)
        self.stop()
        log.warning("a worker process ended while idle, or sent what it was not asked for; it is started "
                    "again for the next request",
                    extra={"fields": {"model": self.name, "pid": process.pid, "end": _death(exit_code)}})

    def start(self, timeout: float | None = None, doing: str = "loading"):
        parent, child = _socket_pair()
        try:
            process = _forkserver.spawn(child.fileno(), self._runtimes)
        finally:
            child.close()
        self._process, self._connection = process, parent
        self._poller = select.poll()
        self._poller.register(parent.fileno(), select.POLLIN)
        self._poller.register(process.sentinel, select.POLLIN)
        try:
            send(parent, (self._target, self._args))  # what it runs (one that died first says how in its reply)
            loaded = self.reply(doing, timeout)
            self._loaded = True
            return loaded
        except ServeError:
            self.stop()  # a worker that failed to load is of no further use
            raise

    def tell(self, message) -> None:
        """Send `message`; its replies are read with `reply`."""
        data = pickle.dumps(message, _PROTOCOL)
        with self._sending:
            self._connection.send_bytes(data)

    def number(self, requests: list[Cancellable]) -> int:
        """A number for the message that hands the worker `requests`: each of them cancelled from now on is
        told to the worker as (this number, its index), which skips it if its turn has not come (worker_inbox.py)."""
        number = next(self._numbers)
        for index, request in enumerate(requests):
            request.when_cancelled(functools.partial(self.cancel, number, index))
        return number

    def cancel(self, number: int, index: int) -> None:
        """Tell the worker that the request at `index` of its message `number` was cancelled, from any
        thread (the event loop, while the caller holding the worker waits for its reply); a worker that
        is gone has nothing to hear."""
        with self._sending:
            try:
                if self._connection is not None:
                    self._connection.send_bytes(pickle.dumps(("cancel", number, index), _PROTOCOL))
            except OSError:
                pass

    def in_turn(self, turns, message: Callable[[list], object], start: Callable[[], None], doing: str,
                timeout: float | None, answer: Callable[[int, object], None]) -> None:
        """Requests a few at a time as `turns.take()` hands them, (position, request) each, until it hands
        none (direct.py's `_Turns`; the model's other workers take from the same group): each few in one
        message (`message(their requests)`), which the worker runs in turn, replying to each: `answer(position,
        its reply or the error)` as each comes, each within `timeout` of the one before; the next few taken
        once they are done. A worker that dies or hangs fails the request it was running alone, and gives
        back those after it, which it had not begun, for any worker to take; it is started again (`start`,
        as it is when it is not running) for the next. One that cannot be started raises."""
        while taken := turns.take():
            self.deliver(message([request for _, request in taken]), start)
            positions = [position for position, _ in taken]
            for index, position in enumerate(positions):
                try:
                    reply = self.reply(doing, timeout)
                except ServeError as exc:
                    answer(position, exc)
                    if not self.running:
                        turns.give_back(positions[index + 1:])
                        break
                    continue
                answer(position, reply)

    def interrupt(self) -> None:
        """Kill the process now, whoever holds the lock: a start or a request under way ends with the
        worker's death."""
        process = self._process
        if process is not None:
            process.kill()

    def measured(self) -> tuple[int, int]:
        """(its own pages, the most its requests held above its resident set since it loaded); zeros
        when it is not running."""
        try:
            process = psutil.Process(self._process.pid)
            peak = max(footprint.host_peak(process.pid) - process.memory_info().rss, 0)
            return process.memory_full_info().uss, peak
        except (psutil.Error, AttributeError, OSError):
            return 0, 0

    def stop(self, message=None) -> None:
        """Send `message` (the worker's cue to end), give it a moment, then kill it."""
        process, connection = self._process, self._connection
        self._process = self._connection = self._poller = None
        if process is None:
            return
        try:
            connection.send_bytes(pickle.dumps(message, _PROTOCOL))
        except OSError:
            pass
        if process.wait(_STOP_SECONDS) is None:
            process.kill()
            process.wait(None)
        connection.close()
        process.close()

    def reply(self, doing: str, timeout: float | None = None):
        """The worker's next message (a worker may send several for one): its payload, or the error it reports,
        or WorkerLost when it ended or did not answer within `timeout` seconds (then it is killed)."""
        ready = {fd for fd, _ in self._poller.poll(None if timeout is None else timeout * 1000)}
        if not ready:
            pid = self.pid
            self._kill()
            log.error("a worker process ran past its deadline and was killed",
                      extra={"fields": {"model": self.name, "pid": pid, "in": doing, "seconds": timeout}})
            raise WorkerLost(f"model '{self.name}' did not finish {doing} within {timeout:g} s; its worker process "
                             f"was killed, and {self._then()}")
        reply = None
        if self._connection.fileno() in ready:
            try:
                reply = pickle.loads(self._connection.recv_bytes())
            except (EOFError, OSError):
                pass
        if reply is None:
            pid, exit_code = self.pid, self._process.wait(None)
            self.stop()
            log.error("a worker process ended", extra={"fields": {"model": self.name, "pid": pid, "in": doing,
                                                                  "end": _death(exit_code)}})
            raise WorkerLost(f"the worker process of model '{self.name}' {_death(exit_code)} in {doing}; {self._then()}")
        status, payload = reply
        if status == "ok":
            return payload
        if status == "last":  # an error the worker ends after (its CUDA context is broken): it is not asked again
            self.stop()
        raise rebuild(payload)

    def _then(self) -> str:
        """What a client told of a lost worker should expect: a load's first start that failed loaded nothing."""
        return "the next request starts it again" if self._loaded else "the model did not load"

    def _kill(self) -> None:
        self._process.kill()
        self.stop()


def fork_server_bytes() -> int:
    """The fork server's own heap (its imports, shared copy-on-write with the workers, which are
    charged only their own pages); 0 while none runs."""
    return _forkserver.held()


def _socket_pair() -> tuple[Connection, Connection]:
    """Blocking ends, the standard library's: gevent's are non-blocking, and their ends outlive a dead peer
    in this process, so a crash would never read as EOF."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return Connection(a.detach()), Connection(b.detach())


def _death(exit_code: int | None) -> str:
    if exit_code is not None and exit_code < 0:
        return f"was killed by {signal.Signals(-exit_code).name}"
    return f"exited with code {exit_code}"


def charged(workers: list[WorkerProcess], device_bytes: dict[str, int], cuda_contexts: dict[str, int],
            devices: list[str]) -> dict:
    """What `workers` cost, kind → device → bytes: their own pages and GPU bytes with a CUDA context
    each on its GPU (`devices`: each worker's, in order) ("load"), and their activation peaks."""
    sizes = [w.measured() for w in workers]
    contexts = total_by_device({d: cuda_contexts[d]} for d in devices if d in cuda_contexts)
    return {"load": total_by_device([{"cpu": sum(s[0] for s in sizes)}, device_bytes, contexts]),
            "activation_peak": {"cpu": max((s[1] for s in sizes), default=0)}}


def error_reply(exc: BaseException) -> tuple:
    """An exception as plain values, for the parent to raise again."""
    if isinstance(exc, DeviceOutOfMemory):
        return type(exc).__name__, str(exc), exc.status, (exc.device, exc.requested)
    if isinstance(exc, DeviceFault):  # the worker ends, and with it the broken context: the server is fine
        return "ModelError", str(exc), exc.status, None
    if isinstance(exc, ServeError):
        return type(exc).__name__, str(exc), exc.status, None
    return "ModelError", f"{type(exc).__name__}: {exc}", 500, None


def rebuild(described: tuple) -> ServeError:
    kind, message, status, device = described
    if kind == "DeviceOutOfMemory":
        return DeviceOutOfMemory(message, *device)
    if kind == "HandlerError":
        return HandlerError(message, status)
    cls = getattr(errors, kind, None)
    return cls(message) if isinstance(cls, type) and issubclass(cls, ServeError) else ModelError(message)


# -- inside a worker -----------------------------------------------------------------------------------


def send(connection: Connection, message: tuple) -> bool:
    """False when the server has hung up."""
    try:
        connection.send_bytes(pickle.dumps(message, _PROTOCOL))
    except OSError:  # a broken pipe or a reset connection
        return False
    return True


def receive(connection: Connection):
    """The server's next message; raises EOFError or OSError when it has hung up."""
    return pickle.loads(connection.recv_bytes())


def isolate(torch_threads: int) -> None:
    """Be the OOM killer's first choice rather than the server, and keep the pages shared with the
    fork server shared. SIGTERM and SIGINT stay ignored, as in the fork server: the server drains its
    requests first, then the worker goes (with the fork server, at the server's exit)."""
    import torch

    try:
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError:
        pass
    gc.freeze()
    torch.set_num_threads(torch_threads)
