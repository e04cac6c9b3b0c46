"""The OpenAPI 3.1 document of all three APIs, served at `GET /openapi.json`. A test holds it to the
routes the server really has, and schemathesis sends what it describes to a live server."""

from container import content
from container.api.pipeline import Response
from container.api.routing import Route

_ERROR = {"$ref": "#/components/schemas/Error"}
_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}, "description": "a model name"}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[0-9]+$"}}
_LABEL = {"name": "label", "in": "path", "required": True, "schema": {"type": "string"}, "description": "a version label"}
_REGION = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}, "description": "a region name"}
_JSON_VALUE: dict = {}  # any JSON value
_NUMBERS = {"type": "array", "items": _JSON_VALUE}


def _json(schema: dict) -> dict:
    return {"content": {content.JSON: {"schema": schema}}}


def _operation(summary: str, tag: str, ok: dict | None = None, body: dict | None = None, parameters=(),
               errors=(400, 404), ok_status: str = "200") -> dict:
    responses = {ok_status: {"description": "success", **(ok or {})}}
    responses |= {str(status): {"description": "a client error; the message says what to fix", **_json(_ERROR)} for status in errors}
    operation = {"summary": summary, "tags": [tag], "responses": responses}
    if parameters:
        operation["parameters"] = list(parameters)
    if body is not None:
        operation["requestBody"] = {"required": False, **body}
    return operation


def _object(properties: dict, required=()) -> dict:
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


_TENSOR = _object({
    "name": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "datatype": {"type": "string", "enum": ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                            "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES"]},
    "data": _JSON_VALUE, "parameters": {"type": "object"},
}, ["name", "shape", "datatype"])
_INFER = _object({"id": {"type": "string"}, "parameters": {"type": "object"},
                  "inputs": {"type": "array", "items": _TENSOR},
                  "outputs": {"type": "array", "items": _object({"name": {"type": "string"}, "parameters": {"type": "object"}}, ["name"])}},
                 ["inputs"])
_MODEL = _object({"modelName": {"type": "string"}, "modelUrl": {"type": "string"}})
_INVOKE_BODY = {"content": {content.JSON: {"schema": _JSON_VALUE}, content.CSV: {"schema": {"type": "string"}},
                            content.NPY: {"schema": {"type": "string", "format": "binary"}}}}
_ANY_ANSWER = {"content": {content.JSON: {"schema": _JSON_VALUE}, content.CSV: {"schema": {"type": "string"}},
                           content.NPY: {"schema": {"type": "string", "format": "binary"}}}}
_TF_PREDICT = _object({"signature_name": {"type": "string"}, "instances": _NUMBERS, "inputs": _JSON_VALUE})
_TF_EXAMPLES = _object({"signature_name": {"type": "string"}, "context": {"type": "object"},
                        "examples": {"type": "array", "items": {"type": "object"}}}, ["examples"])
_EMPTY = {"description": "success, with an empty body"}


def _versioned(paths: dict, path: str, operation: dict) -> None:
    """`path` and its `/versions/{version}` twin (V2), the version parameter added to the twin."""
    paths[path] = operation
    twin = {method: {**op, "parameters": [*op.get("parameters", []), _VERSION]} for method, op in operation.items()}
    paths[path.replace("/v2/models/{name}", "/v2/models/{name}/versions/{version}")] = twin


def document(version: str) -> dict:
    sagemaker, v2, tf = "SageMaker", "Triton / KServe V2", "TensorFlow Serving"
    paths: dict = {
        "/ping": {"get": _operation("health: 200 once the server (single-model: the model) is ready", sagemaker, errors=(503,))},
        "/invocations": {"post": _operation(
            "invoke the model the X-Amzn-SageMaker-Target-Model header names, loading it on first use", sagemaker,
            _ANY_ANSWER, _INVOKE_BODY, [{"name": "X-Amzn-SageMaker-Target-Model", "in": "header", "schema": {"type": "string"}}],
            errors=(400, 404, 406, 413, 415, 507))},
        "/models": {
            "get": _operation("list the loaded models, a page at a time", sagemaker, _json(_object({
                "models": {"type": "array", "items": _MODEL}, "nextPageToken": {"type": "string"}})), parameters=[
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                {"name": "next_page_token", "in": "query", "schema": {"type": "string"}}], errors=(400,)),
            "post": _operation("load a model from a directory or archive under the model root", sagemaker, _json(_MODEL),
                               _json(_object({"model_name": {"type": "string"}, "url": {"type": "string"}}, ["model_name", "url"])),
                               errors=(400, 404, 409, 413, 507)),
        },
        "/models/{name}": {
            "get": _operation("describe a loaded model", sagemaker, _json(_MODEL), parameters=[_NAME]),
            "delete": _operation("unload a model once its requests in flight finish", sagemaker, _json(_JSON_VALUE), parameters=[_NAME]),
        },
        "/models/{name}/invoke": {"post": _operation("invoke a loaded model", sagemaker, _ANY_ANSWER, _INVOKE_BODY, [_NAME],
                                                     errors=(400, 404, 406, 413, 415))},
        "/v2": {"get": _operation("server metadata", v2, _json(_object({
            "name": {"type": "string"}, "version": {"type": "string"}, "extensions": {"type": "array", "items": {"type": "string"}}})),
            errors=())},
        "/v2/health/live": {"get": _operation("liveness: 503 after a sticky GPU error, while the worker restarts", v2, _EMPTY, errors=(503,))},
        "/v2/health/ready": {"get": _operation("readiness: the models named at start have loaded", v2, _EMPTY, errors=(503,))},
        "/v2/models/stats": {"get": _operation("statistics of every loaded model", v2, _json(_object({"model_stats": _NUMBERS})), errors=())},
        "/v2/repository/index": {"post": _operation(
            "every model under the model root, loaded or not", v2, _json(_NUMBERS), _json(_object({"ready": {"type": "boolean"}})),
            errors=(400, 413))},
        "/v2/repository/models/{name}/load": {"post": _operation(
            "load or reload a model, optionally with a config override and files", v2, _EMPTY,
            _json(_object({"parameters": {"type": "object"}})), [_NAME], errors=(400, 404, 409, 413, 507))},
        "/v2/repository/models/{name}/unload": {"post": _operation(
            "unload a model", v2, _EMPTY, _json(_object({"parameters": {"type": "object"}})), [_NAME])},
        "/v2/systemsharedmemory/status": {"get": _operation("every registered region", v2, _json(_NUMBERS), errors=())},
        "/v2/systemsharedmemory/region/{name}/status": {"get": _operation("one registered region", v2, _json(_NUMBERS), parameters=[_REGION])},
        "/v2/systemsharedmemory/region/{name}/register": {"post": _operation(
            "register a POSIX shared memory object under /dev/shm", v2, _EMPTY, _json(_object({
                "key": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
                "byte_size": {"type": "integer", "minimum": 0}}, ["key", "byte_size"])), [_REGION], errors=(400,))},
        "/v2/systemsharedmemory/region/{name}/unregister": {"post": _operation("unregister one region", v2, _EMPTY, parameters=[_REGION], errors=())},
        "/v2/systemsharedmemory/unregister": {"post": _operation("unregister every region", v2, _EMPTY, errors=())},
        "/v2/cudasharedmemory/status": {"get": _operation("every registered CUDA region", v2, _json(_NUMBERS), errors=())},
        "/v2/cudasharedmemory/region/{name}/status": {"get": _operation("one registered CUDA region", v2, _json(_NUMBERS), parameters=[_REGION])},
        "/v2/cudasharedmemory/region/{name}/register": {"post": _operation(
            "register CUDA memory a client exported with cudaIpcGetMemHandle (400 without a GPU)", v2, _EMPTY, _json(_object({
                "raw_handle": _object({"b64": {"type": "string"}}, ["b64"]), "device_id": {"type": "integer", "minimum": 0},
                "byte_size": {"type": "integer", "minimum": 0}}, ["raw_handle", "byte_size"])), [_REGION], errors=(400,))},
        "/v2/cudasharedmemory/region/{name}/unregister": {"post": _operation("unregister one CUDA region", v2, _EMPTY, parameters=[_REGION], errors=())},
        "/v2/cudasharedmemory/unregister": {"post": _operation("unregister every CUDA region", v2, _EMPTY, errors=())},
        "/metrics": {"get": _operation("Prometheus metrics (Triton's names, and the server's own)", "metrics",
                                       {"content": {"text/plain": {"schema": {"type": "string"}}}}, errors=())},
        "/openapi.json": {"get": _operation("this document", "metrics", _json({"type": "object"}), errors=())},
    }
    _versioned(paths, "/v2/models/{name}", {"get": _operation("model metadata", v2, _json({"type": "object"}), parameters=[_NAME])})
    _versioned(paths, "/v2/models/{name}/ready", {"get": _operation("model readiness", v2, _EMPTY, parameters=[_NAME], errors=(400, 404, 503))})
    _versioned(paths, "/v2/models/{name}/config", {"get": _operation("the model's Triton config", v2, _json({"type": "object"}), parameters=[_NAME])})
    _versioned(paths, "/v2/models/{name}/stats", {"get": _operation("the model's statistics", v2, _json({"type": "object"}), parameters=[_NAME])})
    _versioned(paths, "/v2/models/{name}/infer", {"post": _operation(
        "inference; JSON, or JSON followed by binary tensor data", v2, _json(_INFER), _json(_INFER),
        [_NAME, {"name": "Inference-Header-Content-Length", "in": "header", "schema": {"type": "string", "pattern": "^[0-9]+$"}}],
        errors=(400, 404, 413, 507))})
    tf_errors, tf_body_errors = (400, 404), (400, 404, 413)
    tf_operations = {
        "": {"get": _operation("model status", tf, _json({"type": "object"}), errors=tf_errors)},
        "/metadata": {"get": _operation("signature metadata", tf, _json({"type": "object"}), errors=tf_errors)},
        ":predict": {"post": _operation("predict (row or columnar format)", tf, _json({"type": "object"}), _json(_TF_PREDICT),
                                        errors=tf_body_errors)},
        ":classify": {"post": _operation("classify tf.Example-style examples", tf, _json({"type": "object"}), _json(_TF_EXAMPLES),
                                         errors=tf_body_errors)},
        ":regress": {"post": _operation("regress tf.Example-style examples", tf, _json({"type": "object"}), _json(_TF_EXAMPLES),
                                        errors=tf_body_errors)},
    }
    for base, parameters in (("/v1/models/{name}", [_NAME]), ("/v1/models/{name}/versions/{version}", [_NAME, _VERSION]),
                             ("/v1/models/{name}/labels/{label}", [_NAME, _LABEL])):
        for suffix, operations in tf_operations.items():
            paths[base + suffix] = {method: {**op, "parameters": parameters} for method, op in operations.items()}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Multi-model inference container", "version": version,
                 "description": "SageMaker's multi-model contract, Triton/KServe V2 and TensorFlow Serving's REST API over one model cache."},
        "paths": paths,
        "components": {"schemas": {"Error": _object({"error": {"type": "string"}}, ["error"])}},
    }


def openapi_routes(version: str) -> list[Route]:
    body = content.encode_json(document(version))
    return [Route("GET", "/openapi.json", lambda request: Response(body, content.JSON), "metadata")]
