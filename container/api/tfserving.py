"""TensorFlow Serving's REST API, `/v1/models/{m}[/versions/{v}|/labels/{l}][/metadata|:predict|
:classify|:regress]`, over the same registry as the other front-ends: status and metadata here, and the
inferences' versions and labels resolved here; their bodies are tfserving_codec.py's."""

from typing import Callable, Iterator

from container.api import tfserving_codec
from container.api import tfserving_json as tfjson
from container.api.leased import serve_leased, serve_one
from container.api.openapi import TF_SERVING, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.api.tfserving_infer import ANSWER, answer, infer_routes
from container.core import Core, Lease, ModelView
from container.errors import InvalidRequest, ModelNotFound
from container.inference import InferRequest
from container.limits import whole_number
from container.models.signature import Signature, TensorSpec

_TF_DTYPES = {
    "BOOL": "DT_BOOL", "UINT8": "DT_UINT8", "UINT16": "DT_UINT16", "UINT32": "DT_UINT32", "UINT64": "DT_UINT64",
    "INT8": "DT_INT8", "INT16": "DT_INT16", "INT32": "DT_INT32", "INT64": "DT_INT64", "FP16": "DT_HALF",
    "FP32": "DT_FLOAT", "FP64": "DT_DOUBLE", "BF16": "DT_BFLOAT16", "BYTES": "DT_STRING",
}


def tfserving_routes(core: Core) -> list[Route]:
    def status(request: Request) -> Response:
        model, version = _resolve(core, request, status=True)
        specific = "version" in request.params or "label" in request.params
        return answer(tfjson.pretty(_status(model, version if specific else None)))

    def metadata(request: Request) -> Response:
        model, version = _resolve(core, request, status=False)
        return answer(tfjson.pretty(_metadata(model, version)))

    return [
        Route("GET", "/v1/models/{name}", status, "metadata", _STATUS),
        Route("GET", "/v1/models/{name}/versions/{version}", status, "metadata", _STATUS),
        Route("GET", "/v1/models/{name}/labels/{label}", status, "metadata", _STATUS),
        Route("GET", "/v1/models/{name}/metadata", metadata, "metadata", _METADATA),
        Route("GET", "/v1/models/{name}/versions/{version}/metadata", metadata, "metadata", _METADATA),
        Route("GET", "/v1/models/{name}/labels/{label}/metadata", metadata, "metadata", _METADATA),
        *infer_routes(lambda request, verb: infer(core, request, verb)),
    ]


def infer(core: Core, request: Request, verb: str) -> Response:
    """One `:predict`, `:classify` or `:regress`, served in this process."""
    params, name = request.params, request.params["name"]
    lease = core.lease(name, _asked(core, name, params.get("version"), params.get("label")), client=request.client,
                       not_found=lambda _, *number: _servable_not_found(name, *number))
    return serve_one(lease, decoder(request.body, verb), core.infer)


def infer_group(core: Core, name: str, version: str | None, label: str | None,
                calls: list[tuple[Callable, object]]) -> Iterator[tuple[int, object]]:
    """Inferences to one model, version or label (as their path names them) that arrived together, each
    (its `decode` for serve_leased, its client): the model leased once for them all, each decoded against
    it, and the requests handed to the core together (api/leased.py). Yields (position, the answer or the
    exception it failed with) for each, as each is done."""
    try:
        leases = core.leases(name, _asked(core, name, version, label), [client for _, client in calls],
                             not_found=lambda _, *number: _servable_not_found(name, *number))
    except Exception as exc:  # the model is not there: each request is told
        yield from ((position, exc) for position in range(len(calls)))
        return
    yield from serve_leased(leases, [decode for decode, _ in calls], core.infer_all)


def _asked(core: Core, name: str, version: str | None, label: str | None) -> int | None:
    """The version a path names, by number or by label (a label is the model's to resolve)."""
    if label is not None:
        return _version(core.ready_model(name, not_found=lambda _: _servable_not_found(name)), label, version)
    return _version_number(version)


def decoder(body: bytes, verb: str) -> Callable:
    """`decode` for infer_group of a request's body: its tensors, decoded against the leased model's
    signature, and `finish(its response)`: the answer in TF Serving's JSON."""

    def decode(lease: Lease):
        inputs, encode = tfserving_codec.decode(lease.signature, lease.view.output_labels, body, verb)
        return InferRequest(inputs), lambda response: answer(encode(response.outputs))

    return decode


def _resolve(core: Core, request: Request, status: bool) -> tuple[ModelView, int]:
    """The model and version a status or metadata request names."""
    name = request.params["name"]
    if ":" in name:
        raise InvalidRequest(f"Malformed request: {request.method} {request.path}")
    missing = (lambda _: ModelNotFound(f"Could not find any versions of model {name}")) if status else \
        (lambda _: _servable_not_found(name))
    model = core.ready_model(name, not_found=missing)
    version = _version(model, request.params.get("label"), request.params.get("version"))
    if version not in model.versions:
        raise ModelNotFound(f"Could not find version {version} of model {name}" if status
                            else f"Servable not found for request: Specific({name}, {version})")
    return model, version


def _version(model: ModelView, label: str | None, number: str | None) -> int:
    """The version a path's label or number names, or the latest."""
    if label is None:
        version = _version_number(number)
        return model.latest if version is None else version
    if label not in model.version_labels:
        raise InvalidRequest(f"Unrecognized servable version label: {label}")
    return model.version_labels[label]


def _version_number(text: str | None) -> int | None:
    """The version number a path names (None: none)."""
    if text is None:
        return None
    version = whole_number(text)
    if version is None:
        raise InvalidRequest(f"Failed to convert version: {text} to numeric.")
    return version


def _servable_not_found(name: str, version: int | None = None) -> ModelNotFound:
    if version is not None:
        return ModelNotFound(f"Servable not found for request: Specific({name}, {version})")
    return ModelNotFound(f"Servable not found for request: Latest({name})")


def _status(model: ModelView, version: int | None) -> dict:
    """TF Serving's status, then what KServe's V1 client reads (`name`, `ready`): a TF Serving client
    reads the first key only."""
    versions = [version] if version is not None else sorted(model.versions, reverse=True)
    available = {"state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    return {"model_version_status": [{"version": str(v), **available} for v in versions], "name": model.name, "ready": True}


def _metadata(model: ModelView, version: int) -> dict:
    signature = _tensor_signature(model)
    definitions = {
        name: {"inputs": _tensor_infos(signature.inputs), "outputs": _tensor_infos(signature.outputs), "method_name": method}
        for name, method in tfserving_codec.signatures(signature).items()
    }
    return {
        "model_spec": {"name": model.name, "signature_name": "", "version": str(version)},
        "metadata": {"signature_def": {"signature_def": definitions}},
    }


def _tensor_infos(specs: tuple[TensorSpec, ...]) -> dict:
    def info(spec):
        dims = [{"size": str(d), "name": ""} for d in spec.shape]
        return {"dtype": _TF_DTYPES[spec.datatype], "tensor_shape": {"dim": dims, "unknown_rank": False}, "name": spec.name}

    return {spec.name: info(spec) for spec in specs}


def _tensor_signature(model: ModelView) -> Signature:
    if model.signature is None:
        raise InvalidRequest(f"model '{model.name}' is a SageMaker handler model; this API needs a model with a Triton config")
    return model.signature


# The OpenAPI operations of the routes above (api/openapi.py)
_STATUS = operation("model status", TF_SERVING, ANSWER)
_METADATA = operation("signature metadata", TF_SERVING, ANSWER)
