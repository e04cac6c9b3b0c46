"""TensorFlow Serving's REST API, `/v1/models/{m}[/versions/{v}|/labels/{l}][/metadata|:predict|
:classify|:regress]`, over the same registry as the other front-ends. Signatures are derived from the
model's Triton config: `serving_default` always; `regress` when the one output holds one value per
example; `classify` when it holds a score per class."""

import json
from typing import Iterator

import numpy as np

from container.api import offload
from container.api import tfserving_json as tfjson
from container.api.leased import serve_leased
from container.api.openapi import TF_SERVING, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.api.tfserving_infer import ANSWER, answer, infer_routes
from container.core import Core, Lease, ModelView
from container.errors import InvalidInput, InvalidRequest, ModelNotFound
from container.inference import InferRequest
from container.limits import whole_number
from container.models.signature import Signature, TensorSpec
from container.tensors import as_datatype

PREDICT, REGRESS, CLASSIFY = ("tensorflow/serving/predict", "tensorflow/serving/regress", "tensorflow/serving/classify")
DEFAULT_SIGNATURE = {":predict": "serving_default", ":regress": REGRESS, ":classify": CLASSIFY}
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
    params = request.params
    [(_, result)] = infer_group(core, params["name"], params.get("version"), params.get("label"), verb,
                                [(request.body, request.client)])
    if isinstance(result, Exception):
        raise result
    return result


def infer_group(core: Core, name: str, version: str | None, label: str | None, verb: str,
                calls: list[tuple]) -> Iterator[tuple[int, object]]:
    """Inferences of one verb to one model, version or label that arrived together, each (body, client):
    the model leased once for them all, each body decoded against it, and the requests handed to the
    core together (api/leased.py). Yields (position, Response or the exception it failed with) for each,
    as each is done."""
    try:
        asked = _version(core.ready_model(name, not_found=lambda _: _servable_not_found(name)), label, version) \
            if label is not None else _version_number(version)  # a label is the model's to resolve
        leases = core.leases(name, asked, [client for _, client in calls],
                             not_found=lambda _, *number: _servable_not_found(name, *number))
    except Exception as exc:  # the model is not there: each request is told
        yield from ((position, exc) for position in range(len(calls)))
        return
    yield from serve_leased(leases, [_decoder(body, verb) for body, _ in calls], core.infer_all)


def _decoder(body: bytes, verb: str):
    """`decode` for serve_leased: the request's tensors, checked against the leased model's signature,
    and `finish(its response)`: the answer in TF Serving's JSON."""

    def decode(lease: Lease):
        signature, heavy = lease.signature, offload.heavy(len(body))
        document = offload.run(heavy, _parse, body)
        _check_signature(signature, document, verb)
        if verb == ":predict":
            inputs, key = offload.run(heavy, _predict_inputs, signature, document)
            return InferRequest(inputs), lambda response: answer(offload.encode(_predictions, response.outputs, key))
        inputs = offload.run(heavy, _examples, document, signature)
        encode = _regressions if verb == ":regress" else _classes
        return InferRequest(inputs), lambda response: answer(offload.encode(encode, response.outputs, document, lease.view))

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
        for name, method in signatures(signature).items()
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


def signatures(signature: Signature) -> dict[str, str]:
    """Signature name → method, as TF Serving would list them for this model."""
    found = {"serving_default": PREDICT}
    if len(signature.outputs) == 1 and signature.outputs[0].datatype.startswith(("FP", "BF")):
        per_example = _per_example_shape(signature, signature.outputs[0])
        if per_example in ((), (1,)):
            found[REGRESS] = REGRESS
        elif len(per_example) == 1:
            found[CLASSIFY] = CLASSIFY
    return found


def _per_example_shape(signature: Signature, spec: TensorSpec) -> tuple[int, ...]:
    """The shape of one example's slice: without the batch dimension, or the first one when not batching."""
    return spec.shape[1:] if signature.max_batch_size or spec.shape[:1] == (-1,) else spec.shape


def _tensor_signature(model: ModelView) -> Signature:
    if model.signature is None:
        raise InvalidRequest(f"model '{model.name}' is a SageMaker handler model; this API needs a model with a Triton config")
    return model.signature


def _parse(body: bytes) -> dict:
    document = tfjson.parse(body)
    if not isinstance(document, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return document


def _check_signature(signature: Signature, document: dict, verb: str) -> None:
    name = document.get("signature_name") or DEFAULT_SIGNATURE[verb]
    available = signatures(signature)
    if not isinstance(name, str) or name not in available:
        raise InvalidRequest(f'Serving signature name: "{name}" not found in signature def')
    wanted = {":regress": REGRESS, ":classify": CLASSIFY}.get(verb)
    if wanted and available[name] != wanted:
        raise InvalidRequest(f"Expected {verb[1:]} signature method_name to be {wanted}. Was: {available[name]}")


def _predict_inputs(signature: Signature, document: dict) -> tuple[dict[str, np.ndarray], str]:
    """The input tensors of a predict request, and the key its answer goes under."""
    if "instances" in document and "inputs" in document:
        raise InvalidRequest("Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist")
    if "instances" in document:
        return _rows(document["instances"], signature), "predictions"
    if "inputs" in document:
        return _columns(document["inputs"], signature), "outputs"
    raise InvalidRequest("Missing 'inputs' or 'instances' key")


def _predictions(outputs: dict[str, np.ndarray], key: str) -> bytes:
    if len(outputs) == 1:
        (name, array), = outputs.items()
        return tfjson.document({key: tfjson.value(array, _binary(name))})
    if key == "outputs":
        return tfjson.document({key: _named(outputs)})
    batch = {len(array) if array.ndim else None for array in outputs.values()}
    if len(batch) != 1 or None in batch:
        raise InvalidRequest("the outputs do not share a batch dimension; send the columnar 'inputs' format")
    rows = [_named({n: a[i] for n, a in outputs.items()}) for i in range(batch.pop())]
    return tfjson.document({key: "[" + ", ".join(rows) + "]"})


def _named(outputs: dict) -> str:
    return "{" + ", ".join(f"{json.dumps(n)}: {tfjson.value(a, _binary(n))}" for n, a in outputs.items()) + "}"


def _binary(name: str) -> bool:
    return name.endswith("_bytes")


def _rows(instances, signature: Signature) -> dict[str, np.ndarray]:
    if not isinstance(instances, list) or not instances:
        raise InvalidRequest("'instances' must be a non-empty list, one entry per example")
    if all(isinstance(row, dict) and set(row) != {"b64"} for row in instances):
        required, names = [spec.name for spec in signature.inputs if not spec.optional], sorted(instances[0])
        for index, row in enumerate(instances):
            if sorted(row) != names or not set(required) <= set(row):
                optional = [spec.name for spec in signature.inputs if spec.optional]
                raise InvalidInput(f"instance {index} names {sorted(row)}; every instance must name the inputs {required}"
                                   + (f", and the same of the optional {optional}" if optional else ""))
        columns = {name: [row[name] for row in instances] for name in names}
    else:
        columns = {_only_input(signature).name: instances}
    return {name: _tensor(name, value, signature) for name, value in columns.items()}


def _columns(inputs, signature: Signature) -> dict[str, np.ndarray]:
    if isinstance(inputs, dict) and set(inputs) != {"b64"}:
        return {name: _tensor(name, value, signature) for name, value in inputs.items()}
    return {_only_input(signature).name: _tensor(_only_input(signature).name, inputs, signature)}


def _only_input(signature: Signature) -> TensorSpec:
    spec = signature.sole_input()
    if spec is None:
        names = [spec.name for spec in signature.inputs]
        raise InvalidInput(f"the model takes {len(names)} inputs {names}: name each one")
    return spec


def _tensor(name: str, value, signature: Signature) -> np.ndarray:
    datatype = signature.input(name).datatype
    if datatype != "BYTES":
        try:  # numbers hold no {"b64": …} object: no Python walk over every value (1,024 of them: 110 µs)
            return as_datatype(name, value, datatype)
        except InvalidInput:
            pass  # the walk below finds what a b64 object or a bad value says
    return as_datatype(name, tfjson.decode_b64(value, name), datatype)


def _regressions(outputs: dict[str, np.ndarray], document: dict, model: ModelView) -> bytes:
    (array,) = outputs.values()
    count = len(document["examples"])
    if array.size != count:
        raise InvalidRequest(f"the model gave {array.size} values for {count} examples")
    return tfjson.document({"results": tfjson.value(array.reshape(count))})


def _classes(outputs: dict[str, np.ndarray], document: dict, model: ModelView) -> bytes:
    (name, array), = outputs.items()
    count = len(document["examples"])
    scores = array.reshape(count, -1)
    labels = model.output_labels.get(name, [])
    results = [[[labels[i] if i < len(labels) else "", score] for i, score in enumerate(row)] for row in scores]
    return tfjson.document({"results": tfjson.value(results)})


def _examples(document: dict, signature: Signature) -> dict[str, np.ndarray]:
    """tf.Example-style `examples` (plus shared `context`) → one stacked tensor per input."""
    examples, context = document.get("examples"), document.get("context", {})
    if not isinstance(examples, list) or not examples or not all(isinstance(e, dict) for e in examples):
        raise InvalidRequest("'examples' must be a non-empty list of objects, one per example")
    if not isinstance(context, dict):
        raise InvalidRequest("'context' must be an object of features shared by every example")
    inputs = {}
    for spec in signature.inputs:
        if spec.optional and spec.name not in context and not any(spec.name in e for e in examples):
            continue  # an optional feature no example has: left out, as a request may leave it
        values = []
        for index, example in enumerate(examples):
            if spec.name in example and spec.name in context:
                raise InvalidRequest(f"feature '{spec.name}' is in both 'context' and example {index}")
            if spec.name not in example and spec.name not in context:
                raise InvalidInput(f"example {index} lacks feature '{spec.name}'")
            values.append(example.get(spec.name, context.get(spec.name)))
        array = _tensor(spec.name, values, signature)
        inner = _per_example_shape(signature, spec)
        if -1 not in inner and array.size == len(examples) * int(np.prod(inner)):
            array = array.reshape((len(examples), *inner))  # a feature is a flat list per example
        inputs[spec.name] = array
    known = {spec.name for spec in signature.inputs}
    unknown = sorted({k for e in examples for k in e} - known)
    if unknown:
        raise InvalidInput(f"unknown feature(s) {unknown}; the model takes {sorted(known)}")
    return inputs


# The OpenAPI operations of the routes above (api/openapi.py)
_STATUS = operation("model status", TF_SERVING, ANSWER)
_METADATA = operation("signature metadata", TF_SERVING, ANSWER)
