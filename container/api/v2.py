"""Triton / KServe V2 over HTTP: health, metadata, config, inference and statistics. The repository
and shared memory extensions live in v2_repository.py and shared_memory.py."""

import re
from importlib.metadata import version as package_version

from flask import Blueprint, Flask, Response
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from container import content
from container.api import compression, offload, v2_codec
from container.errors import InvalidRequest, ModelNotFound, Unavailable
from container.inference import InferRequest
from container.limits import whole_number
from container.models.registry import Model, Registry, State
from container.models.statistics import Duration, Statistics

EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
    "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
    "statistics",
]
SCHEDULING_PARAMETERS = {"sequence_id": (int, str), "sequence_start": (bool,), "sequence_end": (bool,),
                         "priority": (int,), "timeout": (int,)}
PLATFORMS = {"pytorch": "pytorch_libtorch"}


def register_v2_endpoints(app: Flask, registry: Registry, shared_memory, started) -> None:
    """`started` is set once the models named at start have loaded: the server is ready then."""
    api = Blueprint("v2", __name__)

    @api.get("/v2/health/live")
    def live():
        registry.check_health()
        return Response(b"", 200)

    @api.get("/v2/health/ready")
    def ready():
        registry.check_health()
        if not started.is_set():
            raise Unavailable("the models named at start are still loading")
        return Response(b"", 200)

    @api.get("/v2")
    def server_metadata():
        return _json({"name": "container", "version": package_version("container"), "extensions": EXTENSIONS})

    @api.get("/v2/models/<name>")
    @api.get("/v2/models/<name>/versions/<version>")
    def model_metadata(name, version=None):
        model, number = _model(registry, name, version, default_latest=False)
        versions = [number] if number is not None else sorted(model.versions)
        metadata = {"name": model.name, "versions": [str(v) for v in versions],
                    "platform": _platform(model), "inputs": [], "outputs": []}
        if model.signature is not None:
            metadata["inputs"] = [v2_codec.tensor_metadata(s) for s in model.signature.inputs]
            metadata["outputs"] = [v2_codec.tensor_metadata(s) for s in model.signature.outputs]
        return _json(metadata)

    @api.get("/v2/models/<name>/ready")
    @api.get("/v2/models/<name>/versions/<version>/ready")
    def model_ready(name, version=None):
        model = registry.models.get(name)
        if model is not None and model.state is State.LOADING:
            raise Unavailable(f"model '{name}' is still loading")
        _model(registry, name, version)
        return Response(b"", 200)

    @api.get("/v2/models/<name>/config")
    @api.get("/v2/models/<name>/versions/<version>/config")
    def model_config(name, version=None):
        model, _ = _model(registry, name, version)
        if model.config is None:
            raise InvalidRequest(f"model '{name}' is a SageMaker handler model; it has no Triton config")
        return _json(config_document(model))

    @api.get("/v2/models/stats")
    @api.get("/v2/models/<name>/stats")
    @api.get("/v2/models/<name>/versions/<version>/stats")
    def statistics(name=None, version=None):
        if name is None:
            selected = [(m, v) for m in registry.ready() for v in sorted(m.versions)]
        else:
            model, number = _model(registry, name, version, default_latest=False)
            selected = [(model, v) for v in ([number] if number is not None else sorted(model.versions))]
        return _json({"model_stats": [_model_statistics(m, v, m.statistics[v]) for m, v in selected]})

    app.register_blueprint(api)


def v2_hot_routes(registry: Registry, shared_memory, max_body: int) -> list:
    """Infer, served in front of Flask (hot_paths.py) because it is the hot path."""
    def infer(call):
        body = call.body
        coding = call.header("Content-Encoding")
        if coding:
            body = offload.run(offload.heavy(len(body)), compression.inflate, body, coding, max_body)
        answer, headers = serve_infer(registry, shared_memory, call.match["name"], call.match["version"], body,
                                      call.header(v2_codec.HEADER_LENGTH))
        coding = compression.negotiate(call.header("Accept-Encoding"))
        if coding:
            answer = offload.run(offload.heavy(len(answer)), compression.deflate, answer, coding)
            headers["Content-Encoding"] = coding
        return answer, headers

    return [(re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer"), infer)]


def serve_infer(registry: Registry, shared_memory, name: str, version: str | None, body: bytes,
                header_length: str | None) -> tuple[bytes, dict[str, str]]:
    """`POST /v2/models/{name}[/versions/{version}]/infer`: the response body and headers."""
    model, number = _model(registry, name, version, default_latest=False)
    if model.signature is None:
        raise InvalidRequest(f"model '{name}' is a SageMaker handler model; invoke it through /models/{name}/invoke")
    heavy = offload.heavy(len(body)) or b"shared_memory_region" in body
    if header_length is not None and whole_number(header_length) == 0:
        document, binary = v2_codec.raw_request(model.signature, len(body)), memoryview(body)
    else:
        document, binary = offload.run(heavy, v2_codec.split, body, header_length)
    parameters = _request_parameters(document)
    inputs = offload.run(heavy, v2_codec.decode_inputs, document, binary, model.signature, shared_memory, registry.limits)
    requested = v2_codec.requested_outputs(document)
    names = [r["name"] for r in requested] if requested else None
    response = registry.infer(InferRequest(name, inputs, number, names, parameters))
    answer = {"model_name": name, "model_version": str(response.model_version)}
    if "id" in document:
        answer["id"] = document["id"]
    return offload.encode(_encode, response.outputs, requested, parameters.get("binary_data_output", False), model,
                          shared_memory, answer)


def _encode(outputs: dict, requested, binary: bool, model: Model, shared_memory, answer: dict) -> tuple[bytes, dict]:
    entries, chunks = v2_codec.encode_outputs(outputs, requested, binary, model.signature, model.output_labels,
                                              shared_memory)
    return v2_codec.response_body({**answer, "outputs": entries}, chunks)


def _json(value) -> Response:
    return Response(content.encode_json(value), 200, mimetype=content.JSON)


def _model(registry: Registry, name: str, version: str | None, default_latest: bool = True) -> tuple[Model, int | None]:
    """The model and the version asked for; a miss in Triton's words, which Triton's clients match."""
    try:
        model = registry.get(name)
    except ModelNotFound:
        known = name in registry.models or name in registry.failures
        raise ModelNotFound(f"Request for unknown model: '{name}' "
                            f"{'has no available versions' if known else 'is not found'}") from None
    if version is None:
        return model, model.version() if default_latest else None
    number = whole_number(version)
    if number is None:
        raise InvalidRequest(f"version {version[:40]!r} must be a whole number in ASCII digits")
    if number not in model.versions:
        raise ModelNotFound(f"Request for unknown model: '{name}' version {number} is not found")
    return model, number


def _platform(model: Model) -> str:
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


def config_document(model: Model) -> dict:
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


def _model_statistics(model: Model, version: int, stats: Statistics) -> dict:
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
