"""V2's inference route over HTTP, wherever the model runs: the body inflated and the answer compressed
here; the inference itself is `run(request, body, heavy)` → (the answer's body, its headers). In one
process `run` is v2_dataplane's; an HTTP front-end's crosses the channel, so that the model process is
spared the HTTP pipeline and the request's JSON (http_frontend/server.py). The answer's body is made
where the inference ran (`answer_body`): a large one on a thread there, and across the channel as one
piece of shared memory, never as a million values for the channel to pack on the event loop."""

from typing import Callable

from container.api import compression, offload
from container.api.openapi import V2, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.limits import whole_number
from container.v2 import codec

Run = Callable[[Request, bytes, bool], tuple[bytes, dict[str, str]]]


def infer_routes(run: Run, max_body: int) -> list[Route]:
    """`POST /v2/models/{name}[/versions/{version}]/infer`, answered through `run`."""

    def infer(request: Request) -> Response:
        body = request.body
        coding = request.header("content-encoding")
        if coding:
            body = offload.run(offload.heavy(len(body)), compression.inflate, body, coding, max_body)
        heavy = offload.heavy(len(body))
        answer, headers = run(request, body, heavy)
        coding = compression.negotiate(request.header("accept-encoding"))
        if coding:
            answer = offload.run(offload.heavy(len(answer)), compression.deflate, answer, coding)
            headers["Content-Encoding"] = coding
        return Response(answer, headers=headers)

    return [Route("POST", "/v2/models/{name}/infer", infer, "inference", _INFER),
            Route("POST", "/v2/models/{name}/versions/{version}/infer", infer, "inference", _INFER)]


def answer_body(answer: dict, chunks: list, heavy: bool) -> tuple[bytes, dict[str, str]]:
    """The body and headers of v2_dataplane's answer; made on a thread when the request or the answer is large."""
    size = sum(map(len, chunks)) + sum(e["data"].nbytes for e in answer["outputs"] if "data" in e)
    return offload.run(heavy or offload.heavy(size), codec.response_body, answer, chunks)


def is_raw(header_length: str | None) -> bool:
    """A raw binary request (`Inference-Header-Content-Length: 0`): the model's signature gives its shape."""
    return header_length is not None and whole_number(header_length) == 0


def parser(name: str, body, header_length: str | None, heavy: bool):
    """`parse(signature)` for v2_dataplane.infer: the document and binary data of `body`. It runs once the
    model is leased, so a request to a model that is not there is a 404 whatever its body holds."""

    def parse(signature):
        if is_raw(header_length):
            return codec.raw_request(signature, len(body), name), memoryview(body)
        return offload.run(heavy, codec.split, body, header_length)

    return parse


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
_INFER = operation("inference; JSON, or JSON followed by binary tensor data", V2, json_content(_INFER_DOCUMENT),
                   json_content(_INFER_DOCUMENT),
                   [{"name": "Inference-Header-Content-Length", "in": "header", "schema": {"type": "string", "pattern": "^[0-9]+$"}}],
                   errors=(400, 404, 413, 501, 507))
