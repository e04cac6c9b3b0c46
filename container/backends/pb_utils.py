"""`triton_python_backend_utils` as a python-backend `model.py` imports it (`import
triton_python_backend_utils as pb_utils`): the names and behaviour of Triton's python backend, written
for this server. It is importable under that name only inside a python model's worker process
(python_backend.py), where a BLS call reaches the server's core over the channel (bls.py)."""

import asyncio
import json
import logging
import re
import struct

import numpy as np

from container.inference import SCHEDULING_PARAMETERS

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
# What Triton's front-ends make a request's own properties, not parameters its model reads
_PROPERTIES = frozenset({*SCHEDULING_PARAMETERS, "binary_data_output"})

# Triton's data types: config names and their numpy types; the enum values are model_config.proto's
TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
_BY_ENUM = dict(enumerate([np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
                           np.float16, np.float32, np.float64, np.object_], start=1))

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_bls = None  # the worker's BLS client (bls.py): exec(model, version, inputs, outputs, parameters, timeout)
_model_name = ""  # the model this process serves, for the Logger's records


class TritonError:
    """An error a response carries; `code` as Triton's TRITONSERVER_Error codes."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL):
        self._message, self._code = str(message), code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r})"


class TritonModelException(Exception):
    """Raised by `execute` to fail every request of the batch with its message."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


TRITONSERVER_MEMORY_CPU, TRITONSERVER_MEMORY_GPU = 0, 2  # TRITONSERVER_MemoryType's values


class PreferredMemory:
    """Where a BLS call would like its outputs. Accepted for Triton's models' sake: outputs here are
    numpy arrays in the worker's memory, whatever is preferred."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0):
        self.preferred_memory_type, self.preferred_device_id = preferred_memory_type, preferred_device_id


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether the server serves `model_name` (at `model_version`; "" its latest), as a BLS caller asks."""
    return not isinstance(_control("model_ready", model_name, [model_name, model_version or None]), TritonError)


def load_model(model_name: str, config: str = "", files: dict | None = None) -> None:
    """Load or reload `model_name` from the model root, as the repository API's load does: `config` the
    config as JSON, `files` its files as {"file:<path>": bytes} (those only where the server allows model
    files). A load that fails raises TritonModelException with why."""
    parameters = {**({"config": config} if config else {}), **(files or {})}
    answer = _control("load", model_name, [model_name, parameters])
    if isinstance(answer, TritonError):  # Triton's words first
        raise TritonModelException(f"Failed to load model: {answer.message()}")


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload `model_name` once its requests are done; one that is not loaded is no error, as in Triton."""
    answer = _control("unload", model_name, [model_name, {"unload_dependents": unload_dependents}])
    if isinstance(answer, TritonError):
        raise TritonModelException(f"Failed to unload model: {answer.message()}")


def _control(op: str, model_name: str, args: list):
    """A call to the server's control plane over the worker's BLS connection: its answer, or the
    TritonError it failed with."""
    if _bls is None:
        raise TritonModelException("the model loading API is for initialize and execute of a served model")
    return _bls.control(op, _text(model_name), args)


class Tensor:
    def __init__(self, name: str, data):
        if not isinstance(data, np.ndarray):
            raise TritonModelException(f"tensor '{name}' must be a numpy array, got {type(data).__name__}")
        if data.dtype.kind in "SU":
            data = data.astype(np.object_)
        elif numpy_to_triton_type(data.dtype) is None:
            raise TritonModelException(f"tensor '{name}' is {data.dtype}, which no Triton datatype holds")
        self._name, self._data = str(name), data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._data

    def shape(self) -> list[int]:
        return list(self._data.shape)

    def triton_dtype(self) -> int:
        return numpy_to_triton_type(self._data.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self):
        if self._data.dtype == np.object_:
            raise TritonModelException(f"tensor '{self._name}' holds BYTES, which DLPack cannot carry")
        return self._data.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule) -> "Tensor":
        """A DLPack capsule, or an object that makes one (a torch tensor, a numpy array)."""
        import torch.utils.dlpack

        tensor = torch.utils.dlpack.from_dlpack(capsule)
        return Tensor(name, tensor.detach().cpu().numpy())

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._data.dtype}{list(self._data.shape)})"


class InferenceResponse:
    def __init__(self, output_tensors=(), error: TritonError | None = None, parameters=None):
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceRequest:
    """A request `execute` receives, or one a model makes to call another model (BLS: `exec`)."""

    def __init__(self, request_id: str = "", correlation_id=0, inputs=(), requested_output_names=(),
                 model_name: str = "", model_version: int = -1, flags: int = 0, timeout: int = 0,
                 preferred_memory=None, trace=None, parameters=None):
        self._request_id, self._correlation_id, self._flags = request_id, correlation_id, flags
        self._inputs = list(inputs)
        self._outputs = [_text(n) for n in requested_output_names]
        self.model_name, self.model_version, self._timeout = _text(model_name), int(model_version), timeout
        self._given_parameters = parameters  # as JSON text when asked for: most models never ask
        self._sender = None
        self._cancelled = None  # a request `execute` got: whether its client has gone (worker_inbox.py)

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        """Microseconds the request may wait in the model's queue (its `timeout` parameter), 0 for none."""
        return self._timeout

    def requested_output_names(self) -> set[str]:
        """A set, as Triton's is."""
        return set(self._outputs)

    def parameters(self) -> str:
        return _parameters_json(self._given_parameters)

    def is_cancelled(self) -> bool:
        """Whether the client went away (a gRPC call cancelled, or its stream ended), as far as the
        worker has heard: a model may stop early, and answer with TritonError.CANCELLED."""
        return self._cancelled is not None and self._cancelled()

    def get_response_sender(self):
        if self._sender is None:
            raise TritonModelException("get_response_sender is for the requests execute receives, not for one the "
                                       "model makes")
        self._sender._take()
        return self._sender

    def exec(self, decoupled: bool = False):
        """Run this request on the server's model `model_name` and wait for its response; a failure is
        the response's error, as in Triton. `decoupled`: an iterator of the responses, each as the model
        sends it (a final flag sent alone is an empty response)."""
        if _bls is None:
            raise TritonModelException("BLS calls are made from initialize or execute of a served model")
        call = (self.model_name, self.model_version, {t.name(): wire_array(t.as_numpy()) for t in self._inputs},
                self._outputs or None, _server_parameters(self), self._request_id, self._timeout)
        if decoupled:
            return (_response(outcome or {}) for outcome, _ in _bls.stream(*call))
        return _response(_bls.exec(*call))

    async def async_exec(self, decoupled: bool = False):
        """`exec` without blocking the caller's event loop, so that several calls run at once; with
        `decoupled`, the responses once the model has sent its final one."""
        run = (lambda: list(self.exec(True))) if decoupled else self.exec
        return await asyncio.get_running_loop().run_in_executor(None, run)


def received(name: str, array: np.ndarray) -> Tensor:
    """A tensor that came from another process (a request's input, a BLS call's output) as Triton hands
    it: an array of the model's own, which it may change in place. What crossed the pipe is read-only
    (numpy over the message's bytes), and numpy's DLPack export, the way into torch without a copy
    (`from_dlpack(tensor.to_dlpack())`), refuses a read-only array."""
    return Tensor(name, array if array.flags.writeable else array.copy())


def served_request(request_id: str, inputs: list, outputs, parameters: dict) -> InferenceRequest:
    """A request `execute` receives: the client's parameters but those Triton makes the request's own
    properties (a sequence's id and flags, its priority and timeout, the answer's encoding), which its
    `correlation_id()`, `flags()` and `timeout()` give."""
    if not parameters or parameters.keys().isdisjoint(_PROPERTIES):  # most requests
        return InferenceRequest(request_id, inputs=inputs, requested_output_names=outputs, parameters=parameters)
    flags = ((TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if parameters.get("sequence_start") else 0)
             | (TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if parameters.get("sequence_end") else 0))
    return InferenceRequest(request_id, parameters.get("sequence_id", 0), inputs, outputs, flags=flags,
                            timeout=parameters.get("timeout", 0),
                            parameters={k: v for k, v in parameters.items() if k not in _PROPERTIES})


def _server_parameters(request: InferenceRequest) -> dict:
    """A BLS request's parameters as the server reads them: its correlation id and flags among them."""
    parameters = json.loads(request.parameters())
    if request.correlation_id():
        parameters["sequence_id"] = request.correlation_id()
    if request.flags() & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        parameters["sequence_start"] = True
    if request.flags() & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        parameters["sequence_end"] = True
    return parameters


def _response(outcome: "dict | TritonError") -> InferenceResponse:
    if isinstance(outcome, TritonError):
        return InferenceResponse(error=outcome)
    return InferenceResponse([received(name, array) for name, array in outcome.items()])


class ModelConfig:
    """The configuration `auto_complete_config` receives and returns: read it (`as_dict`), and complete
    its batch size, tensors, scheduler and transaction policy."""

    def __init__(self, config: dict):
        self._config = config

    def as_dict(self) -> dict:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if self._config.get("max_batch_size", 0) > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {self._config['max_batch_size']}, but "
                             f"auto_complete_config of model '{self._name}' set {max_batch_size}")
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(f"configuration specified '{other}', but auto_complete_config of model "
                                 f"'{self._name}' sets 'dynamic_batching'")
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, tensor: dict) -> None:
        self._add("input", tensor, ("name", "data_type", "dims", "optional"))

    def add_output(self, tensor: dict) -> None:
        self._add("output", tensor, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, policy: dict) -> None:
        if set(policy) - {"decoupled"}:
            raise ValueError(f"model_transaction_policy of model '{self._name}' takes only 'decoupled'")
        current = self._config.get("model_transaction_policy", {})
        if "decoupled" in current and "decoupled" in policy and current["decoupled"] != policy["decoupled"]:
            raise ValueError(f"configuration specified decoupled {current['decoupled']}, but auto_complete_config "
                             f"of model '{self._name}' set {policy['decoupled']}")
        self._config["model_transaction_policy"] = {**current, **policy}

    @property
    def _name(self) -> str:
        return self._config.get("name", "")

    def _add(self, kind: str, tensor: dict, allowed: tuple) -> None:
        if set(tensor) - set(allowed):
            raise ValueError(f"{kind} {tensor.get('name')!r} of model '{self._name}' may have only {', '.join(allowed)}")
        for key in allowed[:3]:
            if key not in tensor:
                raise ValueError(f"{kind} {tensor.get('name')!r} of model '{self._name}' has no '{key}'")
        tensors = self._config.setdefault(kind, [])
        for existing in tensors:
            if existing["name"] != tensor["name"]:
                continue
            if existing.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(f"model '{self._name}': the configuration says {kind} '{tensor['name']}' is "
                                 f"{existing['data_type']}, the model says {tensor['data_type']}")
            if existing.get("dims") and list(existing["dims"]) != list(tensor["dims"]):
                raise ValueError(f"model '{self._name}': the configuration gives {kind} '{tensor['name']}' dims "
                                 f"{existing['dims']}, the model {tensor['dims']}")
            existing.update(tensor)
            return
        tensors.append(dict(tensor))


class InferenceResponseSender:
    """A decoupled model's way to answer a request with any number of responses, then the final flag;
    another model's, with one. `taken`: called when the model asks for it."""

    def __init__(self, send, is_cancelled, taken=None):
        self._send, self._closed, self._is_cancelled = send, False, is_cancelled
        self._taken = taken

    def _take(self) -> None:
        if self._taken is not None:
            self._taken()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("the response sender is closed: the final flag was sent")
        self._closed = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self._send(response, flags)

    def is_cancelled(self) -> bool:
        """Whether the request's client went away (InferenceRequest.is_cancelled)."""
        return self._is_cancelled()


class LogLevel:
    INFO, WARNING, ERROR, VERBOSE = range(4)


class Logger:
    """Lines in the server's log, marked with the model's name."""

    _levels = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING, LogLevel.ERROR: logging.ERROR,
               LogLevel.VERBOSE: logging.DEBUG}

    @staticmethod
    def log(message, level: int = LogLevel.INFO) -> None:
        logging.getLogger("container.model").log(Logger._levels.get(level, logging.INFO), str(message),
                                                 extra={"fields": {"model": _model_name}})

    @staticmethod
    def log_info(message) -> None:
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message) -> None:
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message) -> None:
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message) -> None:
        Logger.log(message, LogLevel.VERBOSE)


class MetricFamily:
    """A custom metric family, shown in the server's /metrics beside Triton's own."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    families: dict[str, "MetricFamily"] = {}  # every family this process made, by name

    def __init__(self, name: str, description: str, kind: str):
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException(f"metric family '{name}': kind must be COUNTER, GAUGE or HISTOGRAM")
        if not _METRIC_NAME.fullmatch(str(name)):
            raise TritonModelException(f"metric family name {str(name)[:100]!r} is not a Prometheus metric name")
        if name in self.families:
            raise TritonModelException(f"metric family '{name}' already exists")
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[Metric] = []
        self.families[name] = self

    def Metric(self, labels: dict | None = None, buckets: list[float] | None = None) -> "Metric":  # noqa: N802 (Triton's name)
        if (self.kind == self.HISTOGRAM) != (buckets is not None):
            raise TritonModelException(f"metric family '{self.name}': buckets are given for histograms, and only them")
        labels = {str(k): str(v) for k, v in (labels or {}).items()}
        if not all(_LABEL_NAME.fullmatch(k) for k in labels):
            raise TritonModelException(f"metric family '{self.name}': label names must be Prometheus label names")
        metric = Metric(self, labels, buckets)
        self.metrics.append(metric)
        return metric

    @classmethod
    def snapshot(cls) -> list:
        """Every family's metrics now: (name, description, kind, [(labels, value, buckets, counts, sum)])."""
        return [(f.name, f.description, f.kind, [m.state() for m in f.metrics]) for f in cls.families.values()]


class Metric:
    def __init__(self, family: MetricFamily, labels: dict, buckets: list[float] | None):
        self.family, self.labels = family, labels
        self._value = 0.0
        self._buckets = sorted(buckets) if buckets is not None else None
        self._counts = [0] * (len(self._buckets) + 1) if buckets is not None else None

    def increment(self, value: float) -> None:
        if self.family.kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a counter only goes up")
        self._histogram_refuses("increment")
        self._value += value

    def set(self, value: float) -> None:
        if self.family.kind != MetricFamily.GAUGE:
            raise TritonModelException(f"set is for gauges; '{self.family.name}' is a {self.family.kind}")
        self._value = float(value)

    def observe(self, value: float) -> None:
        if self._buckets is None:
            raise TritonModelException(f"observe is for histograms; '{self.family.name}' is a {self.family.kind}")
        self._counts[next((i for i, edge in enumerate(self._buckets) if value <= edge), len(self._buckets))] += 1
        self._value += value

    def value(self) -> float:
        self._histogram_refuses("value")
        return self._value

    def state(self) -> tuple:
        return self.labels, self._value, self._buckets, self._counts

    def _histogram_refuses(self, what: str) -> None:
        if self._buckets is not None:
            raise TritonModelException(f"{what} is not for histograms ('{self.family.name}')")


# -- helpers, as Triton's module has them ---------------------------------------------------------------


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((t for t in model_config.get("input", []) if t["name"] == name), None)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((t for t in model_config.get("output", []) if t["name"] == name), None)


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_to_numpy_type(data_type: int):
    return _BY_ENUM.get(data_type)


def numpy_to_triton_type(data_type) -> int | None:
    kind = np.dtype(data_type)
    if kind.kind in "OSU":
        return 13
    return next((code for code, t in _BY_ENUM.items() if t is not np.object_ and np.dtype(t) == kind), None)


def triton_string_to_numpy(triton_type_string: str):
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray):
    """BYTES elements as Triton's wire has them: a little-endian uint32 length before each."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type is not np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1, order="C"):
        data = item if isinstance(item, bytes) else str(item).encode()
        parts += [struct.pack("<I", len(data)), data]
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    items, offset, data = [], 0, bytes(encoded_tensor)
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        items.append(data[offset + 4: offset + 4 + length])
        offset += 4 + length
    return np.array(items, dtype=np.object_)


def wire_array(array) -> np.ndarray:
    """A tensor as it leaves the model: a BYTES tensor's elements as bytes, as Triton serializes them
    (text as UTF-8, anything else as its str())."""
    array = np.asarray(array)
    if array.dtype != np.object_ or all(isinstance(item, bytes) for item in array.flat):
        return array
    return np.array([item if isinstance(item, bytes) else str(item).encode() for item in array.flat],
                    np.object_).reshape(array.shape)


def _text(value) -> str:
    """Names given as bytes (an element of a BYTES tensor) read as text, as Triton's binding reads them."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _parameters_json(parameters) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        json.loads(parameters)  # a JSON object's text, as Triton takes it
        return parameters
    return json.dumps(parameters, separators=(",", ":"))  # compact, as Triton writes it
