"""SageMaker's invoke routes, wherever the model runs: `/invocations` and `/models/{name}/invoke`, each
answered through `run(request, model name, load it on first use)`. In one process `run` is
sagemaker.invoke; an HTTP front-end's crosses the channel in groups (http_frontend/invocations.py).
A tensor model's body is decoded, and its answer encoded, by `tensors` in either process."""

import logging
from typing import Callable

from container import content
from container.api import invoke_codec, offload
from container.api.openapi import JSON_VALUE, SAGEMAKER, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.errors import InvalidRequest
from container.models.signature import Signature
from container.settings import Settings

log = logging.getLogger(__name__)

TARGET_MODEL = "x-amzn-sagemaker-target-model"
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"
SINGLE_MODEL_NAME = "model"

Run = Callable[[Request, str, bool], Response]


def invoke_routes(run: Run, settings: Settings) -> list[Route]:
    """`/invocations` (the model the target header names in a multi-model endpoint, loaded on first use;
    else the one model) and `/models/{name}/invoke`."""

    def invoke(request: Request) -> Response:
        return run(request, request.params["name"], False)

    def invocations(request: Request) -> Response:
        if settings.multi_model:
            target = request.header(TARGET_MODEL)
            if not target:
                raise InvalidRequest("the X-Amzn-SageMaker-Target-Model header must name the model to invoke "
                                     "(a path under the model root)")
            request.model = target
            return run(request, target, True)
        request.model = SINGLE_MODEL_NAME
        return run(request, SINGLE_MODEL_NAME, False)

    return [Route("POST", "/invocations", invocations, "inference", _INVOCATIONS),
            Route("POST", "/models/{name}/invoke", invoke, "inference", _INVOKE)]


def tensors(body: bytes, headers: dict[str, str], signature: Signature,
            default_accept: str) -> tuple[dict, Callable[[dict], Response]]:
    """A tensor model's invoke: the inputs its body holds for `signature`, and `finish(outputs)`, the
    answer in the type the Accept header asks for (`default_accept` for none or `*/*`). A 406 comes before
    any work is done."""
    response_type = content.negotiate(headers.get("accept"), default=default_accept)
    inputs, envelope = offload.run(offload.heavy(len(body)), invoke_codec.decode, body,
                                   content.media_type(headers.get("content-type")), signature)

    def finish(outputs: dict) -> Response:
        return Response(offload.encode(invoke_codec.encode, outputs, response_type, envelope), response_type)

    return inputs, finish


def log_attributes(name: str, attributes: str | None, request_id: str) -> None:
    """The X-Amzn-SageMaker-Custom-Attributes header of an invoke of a model that is there, logged."""
    if attributes is not None:
        log.info("custom attributes", extra={"fields": {"model": name, "custom_attributes": attributes,
                                                         "request_id": request_id}})


# The OpenAPI operations of the routes above (api/openapi.py)
_BODIES = {"content": {content.JSON: {"schema": JSON_VALUE}, content.CSV: {"schema": {"type": "string"}},
                       content.NPY: {"schema": {"type": "string", "format": "binary"}}}}
_INVOCATIONS = operation(
    "invoke the model the X-Amzn-SageMaker-Target-Model header names, loading it on first use", SAGEMAKER, _BODIES,
    _BODIES, [{"name": "X-Amzn-SageMaker-Target-Model", "in": "header", "schema": {"type": "string"}}],
    errors=(400, 404, 406, 413, 415, 507))
_INVOKE = operation("invoke a loaded model", SAGEMAKER, _BODIES, _BODIES, errors=(400, 404, 406, 413, 415))
