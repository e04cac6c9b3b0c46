"""Triton / KServe V2 over HTTP: health, metadata, config, inference and statistics. The repository
and shared memory extensions live in v2_repository.py and shared_memory.py."""

from importlib.metadata import version as package_version

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from container import content
from container.api import compression, offload, v2_codec
from container.api.openapi import EMPTY, NUMBERS, V2, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.core import Core, ModelView, State
from container.errors import InvalidRequest, ModelNotFound, Unavailable
from container.inference import InferRequest
from container.limits import whole_number
from container.models.statistics import Duration, Statistics

EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
    "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
    "statistics",
]
SCHEDULING_PARAMETERS = {"sequence_id": (int, str), "sequence_start": (bool,), "sequence_end": (bool,),
                         "priority": (int,), "timeout": (int,)}
PLATFORMS = {"pytorch": "pytorch_libtorch"}


def v2_routes(core: Core, shared_memory, started, max_body: int) -> list[Route]:
    """`started` is set once the models named at start have loaded: the server is ready then."""
    server_metadata = content.encode_json({"name": "container", "version": package_version("container"),
                                           "extensions": EXTENSIONS})

    def live(request: Request) -> Response:
        core.check_health()
        return Response()

    def ready(request: Request) -> Response:
        core.check_health()
        if not started.is_set():
            raise Unavailable("the models named at start are still loading")
        return Response()

    def metadata(request: Request) -> Response:
        return Response(server_metadata, content.JSON)

    def model_metadata(request: Request) -> Response:
        model, number = _model(core, request, default_latest=False)
        versions = [number] if number is not None else sorted(model.versions)
        document = {"name": model.name, "versions": [str(v) for v in versions],
                    "platform": _platform(model), "inputs": [], "outputs": []}
        if model.signature is not None:
            document["inputs"] = [v2_codec.tensor_metadata(s) for s in model.signature.inputs]
            document["outputs"] = [v2_codec.tensor_metadata(s) for s in model.signature.outputs]
        return _json(document)

    def model_ready(request: Request) -> Response:
        name = request.params["name"]
        if core.state(name) is State.LOADING:
            raise Unavailable(f"model '{name}' is still loading")
        _model(core, request)
        return Response()

    def model_config(request: Request) -> Response:
        model, _ = _model(core, request)
        if model.config is None:
            raise InvalidRequest(f"model '{model.name}' is a SageMaker handler model; it has no Triton config")
        return _json(config_document(model))

    def statistics(request: Request) -> Response:
        selected = core.stats(*_model(core, request, default_latest=False)) if "name" in request.params else core.stats()
        return _json({"model_stats": [_model_statistics(m, v, s) for m, v, s in selected]})

    def infer(request: Request) -> Response:
        body = request.body
        coding = request.header("content-encoding")
        if coding:
            body = offload.run(offload.heavy(len(body)), compression.inflate, body, coding, max_body)
        answer, headers = serve_infer(core, shared_memory, request, body)
        coding = compression.negotiate(request.header("accept-encoding"))
        if coding:
            answer = offload.run(offload.heavy(len(answer)), compression.deflate, answer, coding)
            headers["Content-Encoding"] = coding
        return Response(answer, headers=headers)

    return [
        Route("GET", "/v2/health/live", live, "health", _LIVE),
        Route("GET", "/v2/health/ready", ready, "health", _READY),
        Route("GET", "/v2", metadata, "metadata", _SERVER),
        Route("GET", "/v2/models/stats", statistics, "statistics", _ALL_STATS),
        Route("GET", "/v2/models/{name}", model_metadata, "metadata", _METADATA),
        Route("GET", "/v2/models/{name}/versions/{version}", model_metadata, "metadata", _METADATA),
        Route("GET", "/v2/models/{name}/ready", model_ready, "health", _MODEL_READY),
        Route("GET", "/v2/models/{name}/versions/{version}/ready", model_ready, "health", _MODEL_READY),
        Route("GET", "/v2/models/{name}/config", model_config, "model-config", _CONFIG),
        Route("GET", "/v2/models/{name}/versions/{version}/config", model_config, "model-config", _CONFIG),
        Route("GET", "/v2/models/{name}/stats", statistics, "statistics", _STATS),
        Route("GET", "/v2/models/{name}/versions/{version}/stats", statistics, "statistics", _STATS),
        Route("POST", "/v2/models/{name}/infer", infer, "inference", _INFER),
        Route("POST", "/v2/models/{name}/versions/{version}/infer", infer, "inference", _INFER),
    ]


def serve_infer(core: Core, shared_memory, request: Request, body: bytes) -> tuple[bytes, dict[str, str]]:
    """`POST /v2/models/{name}[/versions/{version}]/infer`: the response body and headers."""
    name, version = request.params["name"], request.params.get("version")
    number = _version(version)
    with core.lease(name, number, not_found=lambda _, *version: _unknown(core, name, *version), client=request.client) as lease:
        signature = lease.signature
        header_length = request.header(v2_codec.HEADER_LENGTH)
        heavy = offload.heavy(len(body)) or b"shared_memory_region" in body
        if header_length is not None and whole_number(header_length) == 0:
            document, binary = v2_codec.raw_request(signature, len(body), name), memoryview(body)
        else:
            document, binary = offload.run(heavy, v2_codec.split, body, header_length)
        parameters = _request_parameters(document)
        inputs = offload.run(heavy, v2_codec.decode_inputs, document, binary, signature, shared_memory, core.limits, name)
        requested = v2_codec.requested_outputs(document)
        names = [r["name"] for r in requested] if requested else None
        response = core.infer(lease, InferRequest(inputs, names, parameters))
        answer = {"model_name": name, "model_version": str(response.model_version)}
        if "id" in document:
            answer["id"] = document["id"]
        return offload.encode(_encode, response.outputs, requested, parameters.get("binary_data_output", False),
                              lease.view, shared_memory, answer)


def _encode(outputs: dict, requested, binary: bool, model: ModelView, shared_memory, answer: dict) -> tuple[bytes, dict]:
    entries, chunks = v2_codec.encode_outputs(outputs, requested, binary, model.signature, model.output_labels,
                                              shared_memory)
    return v2_codec.response_body({**answer, "outputs": entries}, chunks)


def _json(value) -> Response:
    return Response(content.encode_json(value), content.JSON)


def _model(core: Core, request: Request, default_latest: bool = True) -> tuple[ModelView, int | None]:
    """The model and the version a request's path names; a miss in Triton's words, which Triton's clients match."""
    name = request.params["name"]
    number = _version(request.params.get("version"))
    model = core.ready_model(name, not_found=lambda _: _unknown(core, name))
    if number is None:
        return model, model.latest if default_latest else None
    if number not in model.versions:
        raise ModelNotFound(f"Request for unknown model: '{name}' version {number} is not found")
    return model, number


def _version(text: str | None) -> int | None:
    if text is None:
        return None
    number = whole_number(text)
    if number is None:
        raise InvalidRequest(f"version {text[:40]!r} must be a whole number in ASCII digits")
    return number


def _unknown(core: Core, name: str, version: int | None = None) -> ModelNotFound:
    """Triton's words for a model, or a version of it, that cannot serve."""
    if version is not None:
        return ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found")
    return ModelNotFound(f"Request for unknown model: '{name}' {'has no available versions' if core.known(name) else 'is not found'}")


def _platform(model: ModelView) -> str:
    if model.config is None:
        return "sagemaker_pytorch"
    return model.config.platform or PLATFORMS.get(model.config.backend, "pytorch_libtorch")


def _request_parameters(document: dict) -> dict:
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidRequest("'parameters' must be an object")
    for key, types in SCHEDULING_PARAMETERS.items():
        value = parameters.get(key)
        if value is not None and (not isinstance(value, types) or (bool not in types and isinstance(value, bool))):
            raise InvalidRequest(f"parameter '{key}' must be {' or '.join(t.__name__ for t in types)}")
        if key in ("priority", "timeout") and value is not None and value < 0:
            raise InvalidRequest(f"parameter '{key}' must not be negative")
    if not isinstance(parameters.get("binary_data_output", False), bool):
        raise InvalidRequest("parameter 'binary_data_output' must be true or false")
    if any(key.startswith("triton_") for key in parameters):
        raise InvalidRequest("parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.")
    return parameters


def config_document(model: ModelView) -> dict:
    """The model's ModelConfig as Triton prints it: proto field names, fields at their default value
    included (a control's `kind` of CONTROL_SEQUENCE_START is the enum's zero), 64-bit integers as numbers."""
    config = type(model.config)()
    config.CopyFrom(model.config)
    config.name = model.name
    config.platform = _platform(model)
    return _int64_as_numbers(json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True), config.DESCRIPTOR)


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64,
          FieldDescriptor.TYPE_SFIXED64, FieldDescriptor.TYPE_SINT64}


def _int64_as_numbers(value, descriptor):
    """protobuf's JSON writes 64-bit integers as strings; Triton's /config writes numbers."""
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                entry = field.message_type.fields_by_name["value"]
                if entry.message_type is not None:
                    value[key] = {k: _int64_as_numbers(v, entry.message_type) for k, v in item.items()}
            elif isinstance(item, list):
                value[key] = [_int64_as_numbers(v, field.message_type) for v in item]
            else:
                value[key] = _int64_as_numbers(item, field.message_type)
        elif field.type in _INT64:
            value[key] = [int(v) for v in item] if isinstance(item, list) else int(item)
    return value


def _model_statistics(model: ModelView, version: int, stats: Statistics) -> dict:
    def duration(d: Duration) -> dict:
        return {"count": d.count, "ns": d.ns}

    phases = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
    inference = {p: duration(getattr(stats, p)) for p in phases}
    inference |= {"cache_hit": duration(Duration()), "cache_miss": duration(Duration())}
    batches = [
        {"batch_size": size, **{p: duration(getattr(b, p)) for p in ("compute_input", "compute_infer", "compute_output")}}
        for size, b in sorted(stats.batches.items())
    ]
    return {"name": model.name, "version": str(version), "last_inference": stats.last_inference_ms,
            "inference_count": stats.inference_count, "execution_count": stats.execution_count,
            "inference_stats": inference, "batch_stats": batches}


# The OpenAPI operations of the routes above (api/openapi.py)
_TENSOR = object_schema({
    "name": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "datatype": {"type": "string", "enum": ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                            "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES"]},
    "data": {}, "parameters": {"type": "object"},
}, ["name", "shape", "datatype"])
_INFER_DOCUMENT = object_schema({
    "id": {"type": "string"}, "parameters": {"type": "object"}, "inputs": {"type": "array", "items": _TENSOR},
    "outputs": {"type": "array", "items": object_schema({"name": {"type": "string"}, "parameters": {"type": "object"}}, ["name"])},
}, ["inputs"])
_ANY_OBJECT = json_content({"type": "object"})
_LIVE = operation("liveness: 503 after a sticky GPU error, while the worker restarts", V2, EMPTY, errors=(503,))
_READY = operation("readiness: the models named at start have loaded", V2, EMPTY, errors=(503,))
_SERVER = operation("server metadata", V2, json_content(object_schema({
    "name": {"type": "string"}, "version": {"type": "string"}, "extensions": {"type": "array", "items": {"type": "string"}}})),
    errors=())
_ALL_STATS = operation("statistics of every loaded model", V2, json_content(object_schema({"model_stats": NUMBERS})), errors=())
_METADATA = operation("model metadata", V2, _ANY_OBJECT)
_MODEL_READY = operation("model readiness", V2, EMPTY, errors=(400, 404, 503))
_CONFIG = operation("the model's Triton config", V2, _ANY_OBJECT)
_STATS = operation("the model's statistics", V2, _ANY_OBJECT)
_INFER = operation("inference; JSON, or JSON followed by binary tensor data", V2, json_content(_INFER_DOCUMENT),
                   json_content(_INFER_DOCUMENT),
                   [{"name": "Inference-Header-Content-Length", "in": "header", "schema": {"type": "string", "pattern": "^[0-9]+$"}}],
                   errors=(400, 404, 413, 507))
