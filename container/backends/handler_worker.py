"""One worker process per SageMaker handler model, as SageMaker's own container runs them: user code
gets its model directory as cwd, its `code/` on sys.path for its whole life, modules of its own names,
and a crash (a segfault, `os._exit`, the OOM killer) ends only its process.

Workers are forked by multiprocessing's fork server, which imports torch once, so a worker starts in
milliseconds and shares torch's pages with every other. Requests go over a socket pair as bytes: a
handler model takes the request body and returns the response body, so nothing else needs to cross.
The parent waits on native threads (the model's instance threads), never on the event loop.
"""

import atexit
import ctypes
import gc
import multiprocessing
import os
import select
import signal
import socket
import sys
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import psutil
from gevent.monkey import get_original

from container import content, errors
from container.backends import footprint
from container.backends.handler import HandlerModel, HandlerResponse
from container.backends.torch_runtime import release_memory
from container.errors import DeviceFault, DeviceOutOfMemory, HandlerError, ModelError, ServeError
from container.logs import configure_logging
from container.models.cache import total_by_device

_STOP_SECONDS = 5  # a worker asked to stop gets this long before it is killed
_forkserver = None


@dataclass(frozen=True)
class HandlerOptions:
    """The SageMaker toolkit's settings for handler models (see settings.py)."""

    program: str = "inference.py"
    default_accept: str = content.JSON
    install_requirements: bool = True
    requirements_cache: str = "/tmp/serve-requirements"
    torch_threads: int = 1
    cuda_contexts: dict[str, int] = field(default_factory=dict)  # device → what a CUDA context takes there
    log_level: str = "INFO"  # the worker logs to the server's stderr in the server's JSON lines


class HandlerWorker:
    """The server's side of a handler model: starts its process, relays requests, measures and ends it.
    A worker that died is started again (model_fn included) by the next request."""

    own_process = True  # its memory is outside the server's: measured apart

    def __init__(self, name: str, directory: Path, device: str, options: HandlerOptions):
        self.name, self.device = name, device
        self._spec = (name, str(directory), device, options)
        self._options = options
        self._lock = get_original("threading", "Lock")()  # callers are native threads
        self._process = self._connection = None
        self._device_bytes: dict[str, int] = {}
        self._start()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def transform(self, body: bytes, content_type: str | None, accept: str | None, headers: dict[str, str],
                  request_id: str | None = None) -> HandlerResponse:
        with self._lock:
            if self._process is None:
                self._start()
            self._connection.send((body, content_type, accept, headers, request_id))
            response, self._device_bytes = self._receive("serving a request")
            return response

    def memory(self) -> dict[str, int]:
        """The worker's own pages (USS: what ending it gives back) plus the most its requests have held
        above its resident set since it loaded (its activation peak), and torch's peak on its GPU."""
        measured = self.measured()
        return total_by_device([measured["load"], measured["activation_peak"]])

    def measured(self) -> dict[str, dict[str, int]]:
        try:
            process = psutil.Process(self._process.pid)
            peak = max(footprint.host_peak(process.pid) - process.memory_info().rss, 0)
            host = process.memory_full_info().uss
        except (psutil.Error, AttributeError, OSError):  # no process: it died and restarts on demand
            host = peak = 0
        context = {d: self._options.cuda_contexts.get(d, 0) for d in self._device_bytes}  # its own, on its GPU
        return {"load": total_by_device([{"cpu": host}, self._device_bytes, context]), "activation_peak": {"cpu": peak}}

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _start(self) -> None:
        parent, child = _socket_pair()
        process = _processes().Process(target=serve, args=(child, *self._spec), name=f"model-{self.name}")
        try:
            process.start()
        finally:
            child.close()
        self._process, self._connection = process, parent
        self._device_bytes = self._receive("loading")

    def _receive(self, doing: str):
        """The worker's answer, or the error it reports, or a ModelError if it died meanwhile."""
        poller = get_original("select", "poll")()
        poller.register(self._connection.fileno(), select.POLLIN)
        poller.register(self._process.sentinel, select.POLLIN)
        ready = {fd for fd, _ in poller.poll()}
        reply = None
        if self._connection.fileno() in ready:
            try:
                reply = self._connection.recv()
            except (EOFError, OSError):
                pass
        if reply is None:
            self._process.join()
            exit_code = self._process.exitcode
            self._stop()
            raise ModelError(f"the worker process of model '{self.name}' {_death(exit_code)} while {doing}; "
                             f"the next request starts it again")
        status, payload = reply
        if status == "ok":
            return payload
        if doing == "loading":
            self._stop()
        raise _rebuild(payload)

    def _stop(self) -> None:
        process, connection = self._process, self._connection
        self._process = self._connection = None
        if process is None:
            return
        try:
            connection.send(None)
        except OSError:
            pass
        process.join(_STOP_SECONDS)
        if process.exitcode is None:
            process.kill()
            process.join()
        connection.close()
        process.close()


def _processes():
    """The fork server, started on first use; it imports torch and the handler code once."""
    global _forkserver
    if _forkserver is None:
        _forkserver = multiprocessing.get_context("forkserver")
        _forkserver.set_forkserver_preload(["container.backends.forkserver"])
        atexit.register(_kill_workers)  # runs before multiprocessing's own exit hook, which would join them
    return _forkserver


def _kill_workers() -> None:
    """At exit, when the server has drained: workers ignore SIGTERM, so end them for good."""
    for process in multiprocessing.active_children():
        process.kill()
        process.join()


def _socket_pair() -> tuple[Connection, Connection]:
    """Blocking ends from the unpatched `_socket` module: gevent's sockets are non-blocking, and
    their ends outlive a dead peer in this process, so a crash would never read as EOF."""
    import _socket

    a, b = _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return Connection(a.detach()), Connection(b.detach())


def _death(exit_code: int | None) -> str:
    if exit_code is not None and exit_code < 0:
        return f"was killed by {signal.Signals(-exit_code).name}"
    return f"exited with code {exit_code}"


def _error_reply(exc: BaseException) -> tuple:
    """An exception as plain values, for the parent to raise again."""
    if isinstance(exc, DeviceOutOfMemory):
        return type(exc).__name__, str(exc), exc.status, (exc.device, exc.requested)
    if isinstance(exc, DeviceFault):  # the worker ends, and with it the broken context: the server is fine
        return "ModelError", str(exc), exc.status, None
    if isinstance(exc, ServeError):
        return type(exc).__name__, str(exc), exc.status, None
    return "ModelError", f"{type(exc).__name__}: {exc}", 500, None


def _rebuild(described: tuple) -> ServeError:
    kind, message, status, device = described
    if kind == "DeviceOutOfMemory":
        return DeviceOutOfMemory(message, *device)
    if kind == "HandlerError":
        return HandlerError(message, status)
    cls = getattr(errors, kind, None)
    return cls(message) if isinstance(cls, type) and issubclass(cls, ServeError) else ModelError(message)


# -- inside the worker ---------------------------------------------------------------------------------


def serve(connection: Connection, name: str, directory: str, device: str, options: HandlerOptions) -> None:
    """The worker's life: load the model as SageMaker's toolkit would, then answer requests until told
    to stop or the server goes away. A server gone mid-load or mid-request leaves nobody to answer:
    the worker ends without a word, as its stderr is the server's JSON log."""
    _isolate(options.torch_threads)
    configure_logging(options.log_level)
    try:
        model = _load(name, Path(directory), device, options)
        footprint.reset_host_peak()  # from here, the high-water mark is what requests add
        loaded = ("ok", model.device_bytes())
    except BaseException as exc:
        _send(connection, ("error", _error_reply(exc)))
        return
    if not _send(connection, loaded):
        return
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        try:
            reply = ("ok", (model.transform(*request), model.device_bytes()))
        except Exception as exc:
            reply = ("error", _error_reply(exc))
            fault = isinstance(exc, DeviceFault)
            out_of_memory = isinstance(exc, DeviceOutOfMemory)
        else:
            fault = out_of_memory = False
        if not _send(connection, reply) or fault:
            return
        if out_of_memory:  # this process's cached blocks are its own to give back
            release_memory()


def _send(connection: Connection, message: tuple) -> bool:
    """False when the server has hung up."""
    try:
        connection.send(message)
    except OSError:  # a broken pipe or a reset connection
        return False
    return True


def _load(name: str, directory: Path, device: str, options: HandlerOptions) -> HandlerModel:
    from container.backends import requirements

    os.chdir(directory)
    code = directory / "code"
    if code.is_dir():
        sys.path.insert(0, str(code))
        if options.install_requirements and (code / "requirements.txt").is_file():
            # after site-packages: what the image ships wins over a second copy of it
            sys.path.append(str(requirements.install(code / "requirements.txt", options.requirements_cache)))
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(device)
    return HandlerModel(name, directory, options.program, device, options.default_accept)


def _isolate(torch_threads: int) -> None:
    """Die with the fork server (and so with the server), be the OOM killer's first choice rather than
    the server, and keep the pages shared with the fork server shared. SIGTERM and SIGINT stay
    ignored, as in the fork server: the server drains its requests first, then the worker goes."""
    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the fork server restores it for its children
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError:
        pass
    gc.freeze()
    torch.set_num_threads(torch_threads)
