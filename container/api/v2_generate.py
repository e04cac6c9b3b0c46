"""Triton's generate extension: `POST /v2/models/{name}[/versions/{v}]/generate` answers one flat JSON
object for one (`{"text_input": "…", "max_tokens": 20}` → `{"text_output": "…"}`), and `…/generate_stream`
sends each of a model's responses as it comes, as server-sent events (`data: {…}`): a decoupled model's
tokens as it makes them.

A request key that names one of the model's inputs is that input, a value or a flat list of them,
shaped by the model's dims: fixed dimensions take their share of the values, the innermost variable
one takes the rest, any other variable one is 1. Any other key, and every key of `parameters`, is a
request parameter (a string, number or boolean); `id` is the request's id. An answer holds `id`,
`model_name`, `model_version` and each output under its name: a lone value as itself, more as a flat
list. `/generate` takes exactly one response. A request refused before the model's first response is an
error answer as any other; an error after it is an event `{"error": "…"}` in a stream that began 200."""

import logging
import math
from typing import Callable, Iterator

from container import content
from container.api import v2_dataplane
from container.api.openapi import V2, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.core import Core
from container.errors import InvalidRequest, ModelError, ServeError
from container.models.signature import Signature

log = logging.getLogger(__name__)
EVENT_STREAM = "text/event-stream; charset=utf-8"
_RESERVED = ("id", "parameters")
_SCALARS = (str, int, float, bool)
# (name, version, request) → the model's responses as generate documents, or {"error": …}
Events = Callable[[str, str | None, dict], Iterator[dict]]


def generate_routes(core: Core, shared_memory) -> list[Route]:
    def generate(request: Request) -> Response:
        documents = list(generate_events(core, shared_memory, request.params["name"], request.params.get("version"),
                                         content.parse_object(request.body)))
        if errors := [d["error"] for d in documents if "error" in d]:
            raise ModelError(errors[0])
        if len(documents) != 1:
            raise InvalidRequest(f"model '{request.params['name']}' sent {len(documents)} responses to the request; "
                                 "/generate answers with exactly one (generate_stream sends each)")
        return Response(content.encode_json(documents[0]), content.JSON)

    return [
        Route("POST", "/v2/models/{name}/generate", generate, "inference", _GENERATE),
        Route("POST", "/v2/models/{name}/versions/{version}/generate", generate, "inference", _GENERATE),
        *stream_routes(lambda name, version, body: generate_events(core, shared_memory, name, version, body)),
    ]


def stream_routes(events: Events) -> list[Route]:
    """`…/generate_stream`, its events from `events`: the model process's own, or (an HTTP front-end) over
    the channel."""

    def generate_stream(request: Request) -> Response:
        items = events(request.params["name"], request.params.get("version"), content.parse_object(request.body))
        first = next(items, None)  # a request refused before the first response is an error answer
        return Response(content_type=EVENT_STREAM, stream=_server_sent(first, items))

    return [Route("POST", "/v2/models/{name}/generate_stream", generate_stream, "inference", _GENERATE_STREAM),
            Route("POST", "/v2/models/{name}/versions/{version}/generate_stream", generate_stream, "inference",
                  _GENERATE_STREAM)]


def generate_events(core: Core, shared_memory, name: str, version: str | None, body: dict) -> Iterator[dict]:
    for answer, _, _, error in v2_dataplane.infer_stream(core, shared_memory, name, version,
                                                          lambda signature: (infer_document(signature, name, body), b"")):
        if error is not None:
            yield {"error": error}
        elif answer is not None:  # None: a decoupled model's final flag alone
            yield generate_document(answer)


def _server_sent(first: dict | None, items: Iterator[dict]) -> Iterator[bytes]:
    try:
        if first is not None:
            yield _event(first)
        for item in items:
            yield _event(item)
    except ServeError as exc:
        yield _event({"error": str(exc)})
    except Exception:
        log.exception("generate_stream failed after its first response")
        yield _event({"error": "internal error; see the server's log"})
    finally:
        items.close()  # a client that left: the model's responses are no longer waited for


def _event(document: dict) -> bytes:
    return b"".join((b"data: ", content.encode_json(document), b"\n\n"))


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
    document = {key: answer[key] for key in ("id", "model_name", "model_version") if key in answer}
    for output in answer["outputs"]:
        data = output["data"]
        document[output["name"]] = data[0] if len(data) == 1 else data
    return document


# The OpenAPI operations of the routes above (api/openapi.py)
_REQUEST = json_content(object_schema({"id": {"type": "string"}, "text_input": {"type": "string"},
                                       "parameters": {"type": "object"}}))
_GENERATE = operation("one inference as a flat JSON object: keys that name inputs are inputs, any other a parameter",
                      V2, json_content({"type": "object"}), _REQUEST, errors=(400, 404, 413, 503, 507))
_GENERATE_STREAM = operation("generate, each of the model's responses sent as it comes (server-sent events)", V2,
                             {"content": {"text/event-stream": {"schema": {"type": "string"}}}}, _REQUEST,
                             errors=(400, 404, 413, 503, 507))
