"""SageMaker's invoke routes, wherever the model runs: `/invocations` and `/models/{name}/invoke`, each
answered through `run(request, model name, load it on first use)`. In one process `run` is
sagemaker.invoke; an HTTP front-end's crosses the channel in groups (http_frontend/invocations.py)."""

from typing import Callable

from container import content
from container.api.openapi import JSON_VALUE, SAGEMAKER, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.errors import InvalidRequest
from container.settings import Settings

TARGET_MODEL = "x-amzn-sagemaker-target-model"
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


# The OpenAPI operations of the routes above (api/openapi.py)
_BODIES = {"content": {content.JSON: {"schema": JSON_VALUE}, content.CSV: {"schema": {"type": "string"}},
                       content.NPY: {"schema": {"type": "string", "format": "binary"}}}}
_INVOCATIONS = operation(
    "invoke the model the X-Amzn-SageMaker-Target-Model header names, loading it on first use", SAGEMAKER, _BODIES,
    _BODIES, [{"name": "X-Amzn-SageMaker-Target-Model", "in": "header", "schema": {"type": "string"}}],
    errors=(400, 404, 406, 413, 415, 507))
_INVOKE = operation("invoke a loaded model", SAGEMAKER, _BODIES, _BODIES, errors=(400, 404, 406, 413, 415))
