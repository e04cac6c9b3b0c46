"""Triton python-backend models: a `model.py` defining `TritonPythonModel`, run unmodified, one worker
process per instance (worker_process.py), with `triton_python_backend_utils` importable as Triton's
python backend makes it (pb_utils.py).

The server's side (`PythonBackend`) hands each batch the scheduler forms to a free instance as a list
of requests, and gets back one response per request: a response's error fails that request alone.
Tensors cross the socket pair pickled (numpy's out-of-band buffers): both ends are this server's code.
"""

import asyncio
import functools
import importlib.util
import inspect
import json
import os
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from queue import SimpleQueue

from google.protobuf import json_format

from container.backends import footprint, pb_utils
from container.backends.worker_inbox import Inbox
from container.backends.worker_process import (
    WorkerOptions,
    WorkerProcess,
    charged,
    error_reply,
    isolate,
    rebuild,
    send,
)
from container.errors import (
    Cancelled,
    InvalidModel,
    InvalidRequest,
    ModelConflict,
    ModelError,
    ModelNotFound,
    ServeError,
    Unavailable,
    Unsupported,
)
from container.logs import configure_logging, user_code_failed
from container.models.cache import total_by_device
from container.models.config import config_document
from container.models.triton_schema import model_config_pb2 as pb

# A TritonError's code as the error the server answers with (Triton's HTTP statuses for them)
_BY_CODE = {pb_utils.TritonError.NOT_FOUND: ModelNotFound, pb_utils.TritonError.INVALID_ARG: InvalidRequest,
            pb_utils.TritonError.UNAVAILABLE: Unavailable, pb_utils.TritonError.UNSUPPORTED: Unsupported,
            pb_utils.TritonError.ALREADY_EXISTS: ModelConflict, pb_utils.TritonError.CANCELLED: Cancelled}


def complete_config(name: str, path: Path, config, options: WorkerOptions):
    """The config after the model's `auto_complete_config` (when it has one), run in a process of its
    own that ends with it, as Triton runs it. Blocking."""
    worker = WorkerProcess(name, serve_auto_complete, (name, str(path), config_document(config), options))
    try:
        document = worker.start(options.load_timeout, "auto_complete_config")
    finally:
        worker.stop()
    try:
        return json_format.ParseDict(document, pb.ModelConfig())
    except json_format.ParseError as exc:
        raise InvalidModel(f"auto_complete_config of model '{name}' made a config Triton's schema refuses: {exc}") from None


class PythonBackend:
    """One version of a python model: its instances' worker processes, each running `initialize` at
    start and `finalize` at close. A worker that died is started again by its next batch."""

    own_process = True  # its memory is outside the server's: measured apart
    takes_request_lists = True  # execute gets the batch's requests as they came, not concatenated

    def __init__(self, name: str, version: int, path: Path, config, device: str, options: WorkerOptions):
        self.name, self.device = name, device
        self._options = options
        self._decoupled = config.model_transaction_policy.decoupled
        document = config_document(config)
        self._workers = [WorkerProcess(name, serve, (name, version, str(path), document, device, instance, options))
                         for instance in _instances(config, device)]
        self._reported: dict[WorkerProcess, tuple] = {}  # each instance's last (GPU bytes, custom metrics)
        self._free = SimpleQueue()
        try:
            for worker in self._workers:
                self._start(worker)
                self._free.put(worker)
        except BaseException:
            self.close()
            raise

    def execute_requests(self, jobs: list) -> list:
        """On an instance thread: a batch's requests (scheduling.Job: inputs, outputs wanted or None,
        parameters, id) through a free instance's `execute`; each request's outputs, or the error it failed
        with. A decoupled model's responses go to each job's `respond` as they come (InferRequest.respond),
        and its requests' outputs here are empty. A job cancelled while it runs is told to the instance
        (`is_cancelled()` there)."""
        if self._decoupled and any(job.respond is None for job in jobs):
            raise self._needs_stream()
        worker = self._free.get()
        try:
            worker.deliver(self._message("execute", jobs, worker), functools.partial(self._start, worker))
            if self._decoupled:
                return self._stream(worker, jobs)
            replies, self._reported[worker] = worker.reply("execute", self._options.response_timeout)
        finally:
            self._free.put(worker)
        if all(ok is _NOT_RUN for ok, _ in replies):  # all cancelled before their turn: no execution happened
            raise self._outcome(replies[0])
        return [self._outcome(reply) for reply in replies]

    def execute_each(self, turns) -> None:
        """On an instance thread: requests that arrived together (as `execute_requests` takes them), a few at
        a time as `turns.take()` hands them, (position, its job) each, each through an `execute` of its own,
        as Triton's python backend runs requests without a batcher, in one message to one instance
        (`WorkerProcess.in_turn`; the other instances take from the same group); `turns.answer(position, its
        outputs or the error)` as each is done. The instance skips a request cancelled before its turn."""
        if self._decoupled:  # its responses need a stream, which requests that come this way have not
            while taken := turns.take():
                for position, _ in taken:
                    turns.answer(position, self._needs_stream())
            return
        worker = self._free.get()

        def answered(position: int, reply) -> None:
            ran = True
            if not isinstance(reply, ServeError):
                [reply], self._reported[worker] = reply
                ran = reply[0] is not _NOT_RUN
                reply = self._outcome(reply)
            turns.answer(position, reply, ran)

        try:
            worker.in_turn(turns, lambda jobs: self._message("each", jobs, worker), functools.partial(self._start, worker), "execute",
                           self._options.response_timeout, answered)
        finally:
            self._free.put(worker)

    def _start(self, worker: WorkerProcess) -> None:
        self._reported[worker] = worker.start(self._options.load_timeout, "initialize")

    def _message(self, kind: str, jobs: list, worker: WorkerProcess) -> tuple:
        """The message that hands `jobs` to `worker` ("execute": one batch; "each": an execute apiece),
        numbered, so that a job cancelled from now on is told to the worker as (number, its index)."""
        requests = [(job.inputs, job.outputs, job.parameters, job.request_id) for job in jobs]
        return kind, requests, self._decoupled, worker.number(jobs)

    def _needs_stream(self) -> InvalidRequest:
        return InvalidRequest(f"model '{self.name}' is decoupled: it answers over a gRPC stream (ModelStreamInfer), "
                              f"which this request is not")

    def _stream(self, worker: WorkerProcess, jobs: list) -> list:
        """A decoupled batch: each response to its job's `respond` as the worker sends it, until every
        request has had its final flag and `execute` has returned (its responses may come after)."""
        unfinished, executed = set(range(len(jobs))), False
        while True:
            message = worker.reply("execute", self._options.response_timeout)
            if message[0] == "response":
                _, index, reply, final = message
                jobs[index].respond(None if reply is None else self._outcome(reply), final)
                if final:
                    unfinished.discard(index)
            else:
                _, self._reported[worker], failure = message
                executed = True
                if failure:  # execute raised: the requests still open end with its error
                    for index in sorted(unfinished):
                        jobs[index].respond(_error(self.name, failure), True)
                    unfinished.clear()
            if executed and not unfinished:
                return [{} for _ in jobs]

    def _outcome(self, reply: tuple):
        ok, outputs = reply
        return outputs if ok else _error(self.name, outputs)

    def memory(self) -> dict[str, int]:
        measured = self.measured()
        return total_by_device([measured["load"], measured["activation_peak"]])

    def measured(self) -> dict[str, dict[str, int]]:
        gpu = total_by_device([device_bytes for device_bytes, _ in self._reported.values()])
        return charged(self._workers, gpu, self._options.cuda_contexts, [self.device] * len(self._workers))

    def metrics(self) -> list[list]:
        """Each instance's custom metric families, as it reported them last (MetricFamily.snapshot)."""
        return [families for _, families in self._reported.values()]

    def close(self) -> None:
        """Each instance's `finalize`, then its process ends (a worker that hangs there is killed)."""
        for worker in self._workers:
            with worker.lock:
                worker.stop("finalize")


def _error(name: str, described: tuple) -> ServeError:
    kind, message, status, code = described
    if kind == "TritonError":
        return _BY_CODE.get(code, ModelError)(message)
    return rebuild((kind, message, status, code))


# -- inside a worker ---------------------------------------------------------------------------------


def serve_auto_complete(connection: Connection, name: str, path: str, document: dict, options: WorkerOptions) -> None:
    isolate(options.torch_threads)
    configure_logging(options.log_level)
    try:
        model_class = _import_model(name, Path(path))
        complete = getattr(model_class, "auto_complete_config", None)
        if complete is not None:
            completed = complete(pb_utils.ModelConfig(document))
            if not isinstance(completed, pb_utils.ModelConfig):
                raise InvalidModel(f"auto_complete_config of model '{name}' must return the pb_utils.ModelConfig it was given")
            document = completed.as_dict()
        reply = ("ok", document)
    except Exception as exc:
        reply = ("error", error_reply(_load_error(name, "auto_complete_config", exc)))
    send(connection, reply)


def _instances(config, device: str) -> list[tuple[str, str]]:
    """(name, kind) of each instance of a normalised config's groups, as Triton names them to the model:
    `<group>_<n>`, and "GPU" for a GPU group's on `device`."""
    on_gpu = device.startswith("cuda")
    return [(f"{group.name}_{n}", "GPU" if on_gpu and group.kind == pb.ModelInstanceGroup.KIND_GPU else "CPU")
            for group in config.instance_group for n in range(group.count)]


def serve(connection: Connection, name: str, version: int, path: str, document: dict, device: str,
          instance: tuple[str, str], options: WorkerOptions) -> None:
    """An instance's life: import `model.py`, `initialize`, then run `execute` on each batch until
    told to stop (then `finalize`) or the server goes away. `instance`: its name and kind."""
    isolate(options.torch_threads)
    configure_logging(options.log_level)
    pb_utils._model_name = name
    if options.channel:
        from container.backends.bls import BlsClient

        pb_utils._bls = BlsClient(options.channel)
    try:
        model = _import_model(name, Path(path))()
        if device.startswith("cuda"):
            import torch

            torch.cuda.set_device(device)
        if hasattr(model, "initialize"):
            instance_name, kind = instance
            model.initialize({
                "model_config": json.dumps(document), "model_instance_kind": kind, "model_instance_name": instance_name,
                "model_instance_device_id": (device.partition(":")[2] or "0") if kind == "GPU" else "0",
                "model_repository": str(Path(path).parent.parent), "model_version": str(version),
                "model_name": name})
        footprint.reset_host_peak()  # from here, the high-water mark is what requests add
        reply = ("ok", _state(device))
    except Exception as exc:
        reply = ("error", error_reply(_load_error(name, "initialize", exc)))
    if not send(connection, reply) or reply[0] == "error":
        return
    loop = asyncio.new_event_loop()  # for an `async def execute`
    inbox = Inbox(connection)
    declared = [output["name"] for output in document.get("output", [])]
    while True:
        try:
            message = inbox.next()
        except (EOFError, OSError):
            return
        if not isinstance(message, tuple):
            if message == "finalize" and hasattr(model, "finalize"):
                try:
                    model.finalize()
                except Exception as exc:  # the instance ends all the same
                    user_code_failed(name, "finalize", exc)
            return
        kind, requests, decoupled, number = message
        inbox.running(number)
        wanted = [outputs or declared for _, outputs, _, _ in requests]
        wrapped = _wrap(requests, wanted, inbox, number)
        if decoupled:
            _execute_decoupled(name, model, wrapped, wanted, loop, connection, device)
            continue
        batches = [[i] for i in range(len(requests))] if kind == "each" else [list(range(len(requests)))]  # "each": an execute apiece
        for batch in batches:
            if all(inbox.cancelled(number, i) for i in batch):
                replies = [(_NOT_RUN, _CANCELLED)] * len(batch)
            else:
                replies = _execute(name, model, [wrapped[i] for i in batch], [wanted[i] for i in batch], loop)
            if not send(connection, ("ok", (replies, _state(device)))):
                return


def _execute(name: str, model, requests: list, wanted: list, loop) -> list[tuple]:
    """Each request's (True, outputs) or (False, error as plain values): the responses `execute` returns,
    or, where it returns None having taken the requests' response senders, the one each request was sent
    through its sender (from `execute` or a thread of the model after it), as Triton's python backend lets
    a model that is not decoupled answer. The instance waits for them (SERVE_PYTHON_RESPONSE_TIMEOUT)."""
    answers = [_OneResponse(name, outputs) for outputs in wanted]
    for request, answer in zip(requests, answers, strict=True):
        request._sender = pb_utils.InferenceResponseSender(answer.send, request.is_cancelled, answer.take)
    raised = None
    try:
        responses = _call_execute(model, requests, loop)
    except Exception as exc:
        responses, raised = None, exc
    if raised is None and responses is None and any(answer.taken for answer in answers):
        return [answer.wait() for answer in answers]
    for answer in answers:  # a response sent from now on is refused in the model: its request is answered
        answer.close()
    if raised is not None:
        failure = (False, _user_error(name, raised))
        return [failure] * len(requests)
    if not isinstance(responses, list) or len(responses) != len(requests):
        got = f"{len(responses)} responses" if isinstance(responses, list) else type(responses).__name__
        failure = (False, ("ModelError", f"execute of model '{name}' must return a list of one InferenceResponse "
                                         f"per request: {len(requests)} requests, {got}", 500, None))
        return [failure] * len(requests)
    return [_outcome(name, response, outputs) for response, outputs in zip(responses, wanted, strict=True)]


class _OneResponse:
    """What a request to a model that is not decoupled is sent through its response sender: one response,
    with the final flag or before it alone, as Triton's python backend takes them (in its words when not).
    `taken`: whether the model asked for the sender; its lock and event are made only then, as every request
    has one of these and few models ask (they cost 3.4 µs a request)."""

    __slots__ = ("_name", "_wanted", "_reply", "_closed", "_lock", "_final", "taken")

    def __init__(self, name: str, wanted: list[str]):
        self._name, self._wanted = name, wanted
        self._reply, self._closed, self.taken = None, False, False

    def take(self) -> None:
        if not self.taken:
            self._lock, self._final, self.taken = threading.Lock(), threading.Event(), True

    def send(self, response, flags: int) -> None:
        with self._lock:
            if self._closed:
                raise pb_utils.TritonModelException("the response sender is closed: the request was answered")
            if response is not None:
                if self._reply is not None:
                    raise pb_utils.TritonModelException("Unable to send response. Non-decoupled model cannot send more "
                                                        "than one response.")
                self._reply = _outcome(self._name, response, self._wanted)
            if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                if self._reply is None:
                    raise pb_utils.TritonModelException("Unable to send response. Non-decoupled model cannot send "
                                                        "complete final before sending a response.")
                self._closed = True
                self._final.set()

    def wait(self) -> tuple:
        self._final.wait()
        return self._reply

    def close(self) -> None:
        if self.taken:
            with self._lock:
                self._closed = True


_CANCELLED = error_reply(Cancelled())
_NOT_RUN = None  # a reply's `ok` for a request the instance skipped (cancelled before its turn): no execution


def _execute_decoupled(name: str, model, requests: list, wanted: list, loop, connection: Connection, device: str) -> None:
    """A decoupled model's batch: each response is sent as the model sends it (from any thread, after
    `execute` has returned as well), then word that `execute` returned, with its error if it raised. The
    model process then ends the requests still open with that error, so a response a thread of the model
    sends after it raises in the model: sent, it would be read as a later request's."""
    lock, failed = threading.Lock(), False

    def sender(index: int, request):
        def respond(response, flags: int) -> None:
            reply = None if response is None else _outcome(name, response, wanted[index])
            with lock:
                if failed:
                    raise pb_utils.TritonModelException("the response sender is closed: execute raised, and its "
                                                        "requests were answered with its error")
                send(connection, ("ok", ("response", index, reply, bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL))))
        return pb_utils.InferenceResponseSender(respond, request.is_cancelled)

    for index, request in enumerate(requests):
        request._sender = sender(index, request)
    try:
        _call_execute(model, requests, loop)
        failure = None
    except Exception as exc:
        failure = _user_error(name, exc)
    with lock:
        failed = failure is not None
        send(connection, ("ok", ("executed", _state(device), failure)))


def _wrap(requests: list[tuple], wanted: list[list[str]], inbox: Inbox, number: int) -> list:
    """Message `number`'s requests as `execute` takes them, each knowing whether it was cancelled; a
    request's requested_output_names() are those it asked for, else every declared one (Triton's)."""
    wrapped = [pb_utils.served_request(request_id, [pb_utils.received(n, a) for n, a in inputs.items()], outputs, parameters)
               for (inputs, _, parameters, request_id), outputs in zip(requests, wanted, strict=True)]
    for index, request in enumerate(wrapped):
        request._cancelled = functools.partial(inbox.cancelled, number, index)
    return wrapped


def _call_execute(model, requests: list, loop):
    responses = model.execute(requests)
    if inspect.isawaitable(responses):
        responses = loop.run_until_complete(responses)
    return responses


def _outcome(name: str, response, wanted: list[str]) -> tuple:
    if not isinstance(response, pb_utils.InferenceResponse):
        return False, ("ModelError", f"execute of model '{name}' returned {type(response).__name__}, "
                                     f"not pb_utils.InferenceResponse", 500, None)
    if response.has_error():
        error = response.error()
        return False, ("TritonError", error.message(), 0, error.code())
    produced = {t.name(): t.as_numpy() for t in response.output_tensors()}
    # as Triton answers: the wanted outputs the model made, in the order it made them; one it left out is
    # left out of the answer, one the config does not declare is dropped
    return True, {n: pb_utils.wire_array(array) for n, array in produced.items() if n in wanted}



def _user_error(name: str, exc: Exception) -> tuple:
    user_code_failed(name, "execute", exc)
    if isinstance(exc, pb_utils.TritonModelException):
        return "ModelError", exc.message(), 500, None
    return "ModelError", f"execute of model '{name}' raised {type(exc).__name__}: {exc}", 500, None


def _load_error(name: str, doing: str, exc: Exception) -> ServeError:
    if isinstance(exc, ServeError):
        return exc
    user_code_failed(name, doing, exc)
    return InvalidModel(f"{doing} of model '{name}' raised {type(exc).__name__}: {exc}")


def _import_model(name: str, path: Path):
    """`TritonPythonModel` of the version's `model.py`, imported with the version directory on sys.path
    (so the modules beside it import) and the model directory as the working directory."""
    sys.modules["triton_python_backend_utils"] = pb_utils
    os.chdir(path.parent.parent)
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("model", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        user_code_failed(name, f"importing {path.name}", exc)
        raise InvalidModel(f"{path.name} of model '{name}' failed to import: {type(exc).__name__}: {exc}") from None
    model_class = getattr(module, "TritonPythonModel", None)
    if not isinstance(model_class, type):
        raise InvalidModel(f"{path.name} of model '{name}' defines no class TritonPythonModel")
    if not callable(getattr(model_class, "execute", None)):
        raise InvalidModel(f"TritonPythonModel of model '{name}' has no execute(self, requests)")
    return model_class


def _state(device: str) -> tuple:
    """What the server learns after each call: the GPU bytes torch has held here, and custom metrics."""
    device_bytes = {}
    if device.startswith("cuda"):
        import torch

        device_bytes = {device: torch.cuda.max_memory_reserved(device)}
    return device_bytes, pb_utils.MetricFamily.snapshot()
