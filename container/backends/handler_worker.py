"""Worker processes of SageMaker handler models, as SageMaker's own container runs them: user code
gets its model directory as cwd, its `code/` on sys.path for its whole life, modules of its own names,
and a crash (a segfault, `os._exit`, the OOM killer) ends only its process.

The process itself is a `worker_process.WorkerProcess`. Requests go over its socket pair as bytes: a
handler model takes the request body and returns the response body, so nothing else needs to cross.
"""

import logging
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from queue import Empty, SimpleQueue

from container.backends import footprint, pt2
from container.backends.handler import HandlerModel
from container.backends.torch_runtime import release_memory
from container.backends.worker_inbox import Inbox
from container.backends.worker_process import (
    WorkerOptions,
    WorkerProcess,
    charged,
    error_reply,
    isolate,
    send,
)
from container.errors import Cancelled, DeviceFault, DeviceOutOfMemory, ServeError
from container.inference import Cancellable
from container.logs import configure_logging
from container.models.cache import total_by_device

log = logging.getLogger(__name__)


class HandlerWorker:
    """The server's side of a handler model: a pool of worker processes, each with the model loaded,
    as SageMaker's container runs several TorchServe workers per model. Each request takes an idle
    worker; each worker's torch gets its share of the cores (the cores over the most workers the pool
    may have, so a full pool never oversubscribes them). A worker that died is started again
    (model_fn included) by the next request that takes it.

    Beyond TorchServe, the pool follows the load between its least and most workers: a request that
    finds no idle worker starts one more, while the memory budget allows (`allow`), and a worker
    beyond the least that stays idle `idle_seconds` ends, as do idle extra workers when the server
    needs their memory (`shed`)."""

    own_process = True  # its memory is outside the server's: measured apart

    def __init__(self, name: str, directory: Path, device: str, options: WorkerOptions):
        self.name, self.device = name, device
        self._least = options.handler_workers
        self._most = max(options.handler_max_workers, self._least)
        self._options = replace(options, torch_threads=max(1, options.torch_threads // self._most))
        self._devices = spread(device, list(options.cuda_contexts))
        self._device_of: dict[WorkerProcess, str] = {}
        self._directory = str(directory)
        # an ExportedProgram beside the code (the default model_fn's): torch.export's modules shared, not each worker's
        self._runtimes = (pt2.EXPORT_RUNTIME,) if pt2.needs_export_runtime(directory.glob("*.pt2")) else ()
        self._workers = [self._new_worker() for _ in range(self._least)]
        self._device_bytes: dict[WorkerProcess, dict[str, int]] = {}
        self._last_used: dict[WorkerProcess, float] = {}
        self._idle = SimpleQueue()
        self._members = threading.Lock()  # guards _workers: instance threads grow it, the reaper shrinks it
        self._allowed = 0  # extra workers the budget has room for: none until the registry says
        self._closing = False
        self._closed = threading.Lock()
        self._closed.acquire()  # released by close(): the reaper's sleep ends at once
        self.resized = False  # set when workers come or go, so the registry measures the pool again
        try:
            self._start(self._workers[0])
        except BaseException:
            self.close()
            raise
        # the model serves once its first worker has loaded it; the others join as they load it too
        _spawn(self._start_others, self._workers[1:])
        if self._most > self._least:
            _spawn(self._reap_idle)

    def _new_worker(self) -> WorkerProcess:
        """A worker on the GPU with the fewest of the pool's workers (on a GPU server), or on the model's device."""
        held = Counter(self._device_of.values())
        device = min(self._devices, key=lambda d: held[d])  # the first of the least held: the model's own GPU first
        worker = WorkerProcess(self.name, serve, (self.name, self._directory, device, self._options), self._runtimes)
        self._device_of[worker] = device
        return worker

    def _start(self, worker: WorkerProcess) -> None:
        with worker.lock:
            if self._closing:
                return
            self._device_bytes[worker] = worker.start(self._options.load_timeout, "model_fn")
        self._last_used[worker] = time.monotonic()
        self.resized = True
        self._idle.put(worker)

    def _start_others(self, workers: list[WorkerProcess]) -> None:
        for worker in workers:
            try:
                self._start(worker)
            except ServeError as exc:  # the pool serves on with the workers it has
                if len(self._workers) > self._least:  # one it grew by: a request may start it later otherwise
                    self._forget(worker)
                if not self._closing:
                    log.warning("a worker of a handler model did not start", extra={"fields": {"model": self.name,
                                                                                                 "error": str(exc)}})

    @property
    def instances(self) -> int:
        """Requests it serves at once: one a worker, as many as it may grow to."""
        return self._most

    @property
    def workers(self) -> int:
        """Workers that have started (what the pool's measured size is the size of)."""
        return len(self._device_bytes)

    def allow(self, extra: int) -> None:
        """How many workers beyond its least the memory budget has room for now (the registry's word)."""
        self._allowed = max(0, min(extra, self._most - self._least))

    def transform_all(self, turns) -> None:
        """On an instance thread: requests that arrived together, a few at a time as `turns.take()` hands
        them, (position, (its Ticket, `HandlerModel.transform`'s arguments)) each, to one worker in one
        message, which runs them in turn (`WorkerProcess.in_turn`; the other workers take from the same
        group); `turns.answer(position, response or the error)` as each is answered, and
        `turns.answer(position, Cancelled, False)` for one the worker skipped, as it was cancelled before its
        turn."""
        worker = self._take()

        def start() -> None:
            self._device_bytes[worker] = worker.start(self._options.load_timeout, "model_fn")

        def message(requests: list[tuple[Cancellable, tuple]]) -> tuple[int, list[tuple]]:
            return worker.number([ticket for ticket, _ in requests]), [arguments for _, arguments in requests]

        def answered(position: int, reply) -> None:
            if reply is _NOT_RUN:
                turns.answer(position, Cancelled(), False)
                return
            if not isinstance(reply, ServeError):
                reply, self._device_bytes[worker] = reply
            turns.answer(position, reply)

        try:
            worker.in_turn(turns, message, start, "a request", self._options.handler_timeout, answered)
        finally:
            self._last_used[worker] = time.monotonic()
            self._idle.put(worker)

    def _take(self) -> WorkerProcess:
        """An idle worker; when there is none, one more is started (room allowing) and the request
        takes whichever worker comes free first."""
        try:
            return self._idle.get(block=False)
        except Empty:
            pass
        with self._members:  # the reaper holds it while idle workers are out of the queue for a look
            try:
                return self._idle.get(block=False)
            except Empty:
                pass
            if not self._closing and len(self._workers) < self._least + self._allowed:
                worker = self._new_worker()
                self._workers.append(worker)
                _spawn(self._start_others, [worker])
        return self._idle.get()

    def shed(self) -> int:
        """End the idle workers beyond the least, for their memory; returns how many ended."""
        return self._end_idle(0.0)

    def _reap_idle(self) -> None:
        seconds = self._options.handler_idle_seconds
        while not self._closed.acquire(timeout=seconds / 2):
            self._end_idle(seconds)

    def _end_idle(self, seconds: float) -> int:
        """End the workers beyond the least that have been idle `seconds` or longer."""
        ending = []
        with self._members:
            taken = []
            while True:
                try:
                    taken.append(self._idle.get(block=False))
                except Empty:
                    break
            now = time.monotonic()
            for worker in sorted(taken, key=lambda w: self._last_used.get(w, now)):  # the longest idle first
                if len(self._workers) > self._least and now - self._last_used.get(worker, now) >= seconds:
                    self._workers.remove(worker)
                    ending.append(worker)
                else:
                    self._idle.put(worker)
        for worker in ending:
            self._forget(worker)
            with worker.lock:
                worker.stop()
        return len(ending)

    def _forget(self, worker: WorkerProcess) -> None:
        with self._members:
            if worker in self._workers:
                self._workers.remove(worker)
        self._device_bytes.pop(worker, None)
        self._last_used.pop(worker, None)
        self._device_of.pop(worker, None)
        self.resized = True

    def memory(self) -> dict[str, int]:
        """Each worker's own pages (USS: what ending it gives back) plus the most one's requests have
        held above its resident set since it loaded (their activation peak), and torch's peak on the GPU."""
        measured = self.measured()
        return total_by_device([measured["load"], measured["activation_peak"]])

    def measured(self) -> dict[str, dict[str, int]]:
        self.resized = False
        workers = list(self._workers)
        return charged(workers, total_by_device([self._device_bytes.get(w, {}) for w in workers]), self._options.cuda_contexts,
                       [self._device_of.get(w, self.device) for w in workers])

    def close(self) -> None:
        """Every worker ends; one still loading the model is killed at once."""
        if not self._closing:
            self._closing = True
            self._closed.release()
        with self._members:
            workers = list(self._workers)
        for worker in workers:
            worker.interrupt()  # a start under way holds the worker's lock until its model_fn returns
        for worker in workers:
            with worker.lock:
                worker.stop()


def spread(device: str, gpus: list[str]) -> list[str]:
    """The devices a pool's workers take in turn: every GPU of the server from the one the model was
    placed on (so each GPU's context and copy of the model is charged where it is), or `device` alone."""
    if not device.startswith("cuda") or device not in gpus:
        return [device]
    ordered = sorted(gpus, key=lambda d: int(d.split(":")[1]))
    start = ordered.index(device)
    return ordered[start:] + ordered[:start]


def _spawn(function, *args) -> None:
    threading.Thread(target=function, args=args, daemon=True).start()


# -- inside the worker ---------------------------------------------------------------------------------


def serve(connection: Connection, name: str, directory: str, device: str, options: WorkerOptions) -> None:
    """The worker's life: load the model as SageMaker's toolkit would, then answer requests until told
    to stop or the server goes away. A server gone mid-load or mid-request leaves nobody to answer:
    the worker ends without a word, as its stderr is the server's JSON log."""
    isolate(options.torch_threads)
    configure_logging(options.log_level)
    try:
        model = _load(name, Path(directory), device, options)
        footprint.reset_host_peak()  # from here, the high-water mark is what requests add
        loaded = ("ok", model.device_bytes())
    except BaseException as exc:
        send(connection, ("error", error_reply(exc)))
        return
    if not send(connection, loaded):
        return
    inbox = Inbox(connection)
    while True:
        try:
            message = inbox.next()
        except (EOFError, OSError):
            return
        if message is None:
            return
        number, requests = message  # requests that arrived together, each answered as it is done
        inbox.running(number)
        for index, request in enumerate(requests):
            if inbox.cancelled(number, index):
                answered = send(connection, ("ok", _NOT_RUN))
            else:
                answered = _answer(connection, model, request)
            if not answered:
                return


_NOT_RUN = None  # the reply for a request the worker skipped, as it was cancelled before its turn


def _answer(connection: Connection, model: HandlerModel, request: tuple) -> bool:
    """One request's reply; False when the worker must end (the server hung up, or the device failed)."""
    try:
        reply = ("ok", (model.transform(*request), model.device_bytes()))
    except DeviceFault as exc:  # the CUDA context is broken: this process ends, and the server starts another
        send(connection, ("last", error_reply(exc)))
        return False
    except Exception as exc:
        if not send(connection, ("error", error_reply(exc))):
            return False
        if isinstance(exc, DeviceOutOfMemory):  # this process's cached blocks are its own to give back
            release_memory()
        return True
    return send(connection, reply)


def _load(name: str, directory: Path, device: str, options: WorkerOptions) -> HandlerModel:
    from container.backends import requirements

    os.chdir(directory)
    code = directory / "code"
    if code.is_dir():
        sys.path.insert(0, str(code))
        if options.install_requirements and (code / "requirements.txt").is_file():
            # after site-packages: what the image ships wins over a second copy of it
            installed = requirements.install(code / "requirements.txt", options.requirements_cache, options.requirements_cache_size)
            sys.path.append(str(installed))
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(device)
    return HandlerModel(name, directory, options.program, device, options.default_accept)
