"""One worker process per SageMaker handler model, as SageMaker's own container runs them: user code
gets its model directory as cwd, its `code/` on sys.path for its whole life, modules of its own names,
and a crash (a segfault, `os._exit`, the OOM killer) ends only its process.

The process itself is a `worker_process.WorkerProcess`. Requests go over its socket pair as bytes: a
handler model takes the request body and returns the response body, so nothing else needs to cross.
"""

import os
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from container.backends import footprint
from container.backends.handler import HandlerModel, HandlerResponse
from container.backends.torch_runtime import release_memory
from container.backends.worker_process import WorkerOptions, WorkerProcess, charged, error_reply, isolate, receive, send
from container.errors import DeviceFault, DeviceOutOfMemory
from container.logs import configure_logging
from container.models.cache import total_by_device


class HandlerWorker:
    """The server's side of a handler model: starts its process, relays requests, measures and ends it.
    A worker that died is started again (model_fn included) by the next request."""

    own_process = True  # its memory is outside the server's: measured apart

    def __init__(self, name: str, directory: Path, device: str, options: WorkerOptions):
        self.name, self.device = name, device
        self._options = options
        self._worker = WorkerProcess(name, serve, (name, str(directory), device, options))
        self._device_bytes: dict[str, int] = self._worker.start(options.load_timeout, "model_fn")

    @property
    def pid(self) -> int | None:
        return self._worker.pid

    def transform(self, body: bytes, content_type: str | None, accept: str | None, headers: dict[str, str],
                  request_id: str | None = None) -> HandlerResponse:
        with self._worker.lock:
            if not self._worker.running:
                self._device_bytes = self._worker.start(self._options.load_timeout, "model_fn")
            response, self._device_bytes = self._worker.ask((body, content_type, accept, headers, request_id),
                                                            "a request")
            return response

    def memory(self) -> dict[str, int]:
        """The worker's own pages (USS: what ending it gives back) plus the most its requests have held
        above its resident set since it loaded (its activation peak), and torch's peak on its GPU."""
        measured = self.measured()
        return total_by_device([measured["load"], measured["activation_peak"]])

    def measured(self) -> dict[str, dict[str, int]]:
        return charged([self._worker], self._device_bytes, self._options.cuda_contexts)

    def close(self) -> None:
        with self._worker.lock:
            self._worker.stop()


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
    while True:
        try:
            request = receive(connection)
        except (EOFError, OSError):
            return
        if request is None:
            return
        try:
            reply = ("ok", (model.transform(*request), model.device_bytes()))
        except Exception as exc:
            reply = ("error", error_reply(exc))
            fault = isinstance(exc, DeviceFault)
            out_of_memory = isinstance(exc, DeviceOutOfMemory)
        else:
            fault = out_of_memory = False
        if not send(connection, reply) or fault:
            return
        if out_of_memory:  # this process's cached blocks are its own to give back
            release_memory()


def _load(name: str, directory: Path, device: str, options: WorkerOptions) -> HandlerModel:
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
