"""Triton's generate extension: `POST /v2/models/{name}[/versions/{v}]/generate` answers one flat JSON
object for one (`{"text_input": "…", "max_tokens": 20}` → `{"text_output": "…"}`), and `…/generate_stream`
sends each of a model's responses as it comes, as server-sent events (`data: {…}`): a decoupled model's
tokens as it makes them.

A request key that names one of the model's inputs is that input, a value or a flat list of them,
shaped by the model's dims: fixed dimensions take their share of the values, the innermost variable
one takes the rest, any other variable one is 1. Any other key, and every key of `parameters`, is a
request parameter (a string, number or boolean); `id` is the request's id. An answer holds `id`,
`model_name`, `model_version` and each output under its name: a lone value as itself, more as a flat
list. `/generate` takes exactly one response; `generate_stream` is v2_generate_stream.py, which the
HTTP front-ends serve too, with these events over the channel."""

import math
from typing import Iterator

from container import content
from container.api import v2_dataplane
from container.api.openapi import V2, json_content, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.api.v2_generate_stream import REQUEST, generate_request, stream_routes
from container.core import Core
from container.errors import InvalidRequest, ModelError, ServeError
from container.models.signature import Signature

_RESERVED = ("id", "parameters")
_SCALARS = (str, int, float, bool)


def generate_routes(core: Core, shared_memory, max_body: int) -> list[Route]:
    def generate(request: Request) -> Response:
        documents = list(_responses(core, shared_memory, request.params["name"], request.params.get("version"),
                                    generate_request(request, max_body)))
        error = next((d for d in documents if isinstance(d, Exception)), None)
        if error is not None:  # the model's own error, with its status
            raise error if isinstance(error, ServeError) else ModelError(str(error))
        if len(documents) != 1:
            raise InvalidRequest(f"model '{request.params['name']}' sent {len(documents)} responses to the request; "
                                 "/generate answers with exactly one (generate_stream sends each)")
        return Response(content.encode_json(documents[0]), content.JSON)

    return [
        Route("POST", "/v2/models/{name}/generate", generate, "inference", _GENERATE),
        Route("POST", "/v2/models/{name}/versions/{version}/generate", generate, "inference", _GENERATE),
        *stream_routes(lambda name, version, body: generate_events(core, shared_memory, name, version, body), max_body),
    ]


def generate_events(core: Core, shared_memory, name: str, version: str | None, body: dict) -> Iterator[list]:
    """[document, status] of each response: 200, or the status of the error it carries as {"error": …}."""
    for response in _responses(core, shared_memory, name, version, body):
        if isinstance(response, Exception):
            yield [{"error": str(response)}, response.status if isinstance(response, ServeError) else 500]
        else:
            yield [response, 200]


def _responses(core: Core, shared_memory, name: str, version: str | None, body: dict) -> Iterator[dict | Exception]:
    """Each of the model's responses as a generate document, or the error it carries."""
    for answer, _, _, error in v2_dataplane.infer_stream(core, shared_memory, name, version,
                                                          lambda signature: (infer_document(signature, name, body), b"")):
        if error is not None:
            yield error
        elif answer is not None:  # None: a decoupled model's final flag alone
            yield generate_document(answer)


def infer_document(signature: Signature | None, name: str, body: dict) -> dict:
    """The V2 inference document of a generate request (its outputs all as JSON)."""
    if signature is None:
        raise InvalidRequest(f"model '{name}' is a SageMaker handler model; /generate serves Triton models")
    inputs = {spec.name: spec for spec in signature.inputs}
    if "parameters" in inputs:
        raise InvalidRequest("key 'parameters' holds the request's parameters; it cannot also be an input's name")
    document: dict = {"inputs": [], "parameters": {}}
    if "id" in body:
        if not isinstance(body["id"], str):
            raise InvalidRequest("'id' must be a string")
        document["id"] = body["id"]
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidRequest("'parameters' must be an object")
    for key, value in [*((k, v) for k, v in body.items() if k not in _RESERVED), *parameters.items()]:
        spec = inputs.get(key)
        if spec is not None:
            values = value if isinstance(value, list) else [value]
            if not all(isinstance(v, _SCALARS) for v in values):
                raise InvalidRequest(f"input '{key}' takes a value or a flat list of values")
            document["inputs"].append({"name": key, "datatype": spec.datatype, "data": values,
                                       "shape": _shape(key, spec.shape, len(values))})
        elif isinstance(value, _SCALARS):
            document["parameters"][key] = value
        else:
            raise InvalidRequest(f"'{key}' is not an input of model '{name}', so it is a parameter, which takes a "
                                 "string, number or boolean")
    if not document["inputs"] and inputs:
        raise InvalidRequest(f"the request names none of model '{name}''s inputs: {', '.join(inputs)}")
    return document


def _shape(name: str, dims: tuple[int, ...], count: int) -> list[int]:
    """The shape `count` values fill: each fixed dimension takes its share, the innermost variable one the
    rest, any other variable one 1 (Triton's rule)."""
    fixed = math.prod(d for d in dims if d != -1)
    variable = [i for i, d in enumerate(dims) if d == -1]
    if (fixed and count % fixed) or (not variable and count != fixed) or (fixed == 0 and count):
        raise InvalidRequest(f"input '{name}': {count} value(s) do not fill its shape {list(dims)}")
    shape = [1 if d == -1 else d for d in dims]
    if variable:
        shape[variable[-1]] = count // fixed if fixed else 0
    return shape


def generate_document(answer: dict) -> dict:
    """Its keys in order, as Triton writes them (measured on tritonserver 2.51: `{"Y": …, "id": …, "model_name": …}`)."""
    document = {key: answer[key] for key in ("id", "model_name", "model_version") if key in answer}
    for output in answer["outputs"]:
        data = output["data"]
        document[output["name"]] = data[0] if len(data) == 1 else data
    return dict(sorted(document.items()))


# The OpenAPI operation of the routes above (api/openapi.py)
_GENERATE = operation("one inference as a flat JSON object: keys that name inputs are inputs, any other a parameter",
                      V2, json_content({"type": "object"}), REQUEST, errors=(400, 404, 413, 415, 503, 507))
