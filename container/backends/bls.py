"""A python model's calls to other models (BLS: `pb_utils.InferenceRequest(...).exec()`), made from its
worker process over the model process's channel (channel/), so they go through the server's core as
any client's request does: the same lease, scheduler, statistics and memory rules. The instance thread
that waits for this worker holds nothing the call needs, so a call never deadlocks its caller.

Blocking, as `exec` is; `async_exec` runs calls on threads, each taking a connection of its own."""

import itertools
import socket
import threading

from container.backends import pb_utils
from container.channel import wire

# An error's HTTP status as the TritonError code a BLS response carries
_CODES = {400: pb_utils.TritonError.INVALID_ARG, 404: pb_utils.TritonError.NOT_FOUND,
          409: pb_utils.TritonError.ALREADY_EXISTS, 501: pb_utils.TritonError.UNSUPPORTED,
          503: pb_utils.TritonError.UNAVAILABLE}


class BlsClient:
    def __init__(self, path: str):
        self.path = path
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def exec(self, model: str, version: int, inputs: dict, outputs: list[str] | None, parameters: dict,
             request_id: str = "", timeout_us: int = 0) -> dict | pb_utils.TritonError:
        """The model's outputs, or the error it answered with (as Triton's BLS returns it)."""
        *_, (_, answer) = self._call("bls_infer", model, [model, version, inputs, outputs, parameters, request_id],
                                     timeout_us)
        return answer

    def stream(self, model: str, version: int, inputs: dict, outputs: list[str] | None, parameters: dict,
               request_id: str = "", timeout_us: int = 0):
        """A decoupled call's responses as the model sends them: (outputs, or the error that response
        carries, or None for a final flag alone; final). A call that fails as a whole is one final error."""
        for kind, value in self._call("bls_stream", model, [model, version, inputs, outputs, parameters, request_id],
                                      timeout_us):
            if kind == wire.ITEM:
                outputs, final, error = value
                yield (_error(*error) if error else outputs), final
            elif isinstance(value, pb_utils.TritonError):
                yield value, True

    def control(self, op: str, model: str, args: list):
        """A control-plane call (`model_ready`, `load`, `unload`): its answer, or a TritonError."""
        *_, (_, answer) = self._call(op, model, args, 0)
        return answer

    def _call(self, op: str, model: str, args: list, timeout_us: int):
        """The call's frames as (kind, value): its items, then its answer, or a TritonError for an error
        answer or a failed call. A connection is kept for the next call once its answer is read."""
        call_id = next(self._ids)
        try:
            connection = self._connection()
        except OSError as exc:
            yield wire.ERROR, pb_utils.TritonError(f"the server cannot be reached for a BLS call: {exc.strerror}",
                                                   pb_utils.TritonError.UNAVAILABLE)
            return
        done = False
        try:
            connection.settimeout(timeout_us / 1e6 if timeout_us > 0 else None)
            connection.sendall(wire.pack([call_id, op, args]))
            while (frame := wire.unpack(_frame(connection)))[1] == wire.ITEM:
                yield wire.ITEM, frame[2]
            done = True
        except (OSError, EOFError) as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else "was cut off"
            yield wire.ERROR, pb_utils.TritonError(f"the BLS call to model '{model}' {why}", pb_utils.TritonError.UNAVAILABLE)
            return
        finally:
            if done:
                with self._lock:
                    self._idle.append(connection)
            else:  # failed, or abandoned mid-stream: what is left on it belongs to no call
                connection.close()
        _, kind, result = frame
        yield kind, (_error(*result[1:]) if kind == wire.ERROR else result)

    def _connection(self) -> socket.socket:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(self.path)
        except OSError:
            connection.close()
            raise
        return connection


def _error(message: str, status: int) -> pb_utils.TritonError:
    return pb_utils.TritonError(message, _CODES.get(status, pb_utils.TritonError.INTERNAL))


def _frame(connection: socket.socket) -> bytes:
    (length,) = wire.LENGTH.unpack(_exactly(connection, wire.LENGTH.size))
    return _exactly(connection, length)


def _exactly(connection: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = connection.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError("the server closed the channel")
        data += chunk
    return bytes(data)
