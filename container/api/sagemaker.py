"""SageMaker's container contract: `/ping`, `/invocations`, and the multi-model `/models` API."""

import base64
import binascii
import logging

from container import content
from container.api import invoke_codec, offload
from container.api.openapi import JSON_VALUE, SAGEMAKER, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.core import Core, Lease
from container.errors import InvalidRequest, Unavailable
from container.inference import InferRequest, TransformRequest
from container.limits import check_name, whole_number
from container.settings import Settings

log = logging.getLogger(__name__)

TARGET_MODEL = "x-amzn-sagemaker-target-model"
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"
SINGLE_MODEL_NAME = "model"
DEFAULT_PAGE_SIZE = 100


def sagemaker_routes(core: Core, settings: Settings) -> list[Route]:
    def ping(request: Request) -> Response:
        core.check_health()
        if not settings.multi_model and not core.ready():
            failure = core.failure(SINGLE_MODEL_NAME)
            raise Unavailable(f"the model failed to load: {failure}" if failure else "the model is not loaded yet")
        return Response()

    def load_model(request: Request) -> Response:
        name, url = _load_body(request.body)
        return Response.json(_model_entry(core.load(name, url)))

    def list_models(request: Request) -> Response:
        models, args = core.ready(), request.args()
        limit = _page_size(args.get("limit"))
        token = args.get("next_page_token")
        if token:
            start = _decode_token(token)
            models = [m for m in models if m.name >= start]
        page = {"models": [_model_entry(m) for m in models[:limit]]}
        if len(models) > limit:
            page["nextPageToken"] = base64.urlsafe_b64encode(models[limit].name.encode()).decode()
        return Response.json(page)

    def get_model(request: Request) -> Response:
        return Response.json(_model_entry(core.ready_model(request.params["name"])))

    def unload_model(request: Request) -> Response:
        name = request.params["name"]
        core.unload(name)
        return Response.json({"status": f"model '{name}' unloaded"})

    def invoke(request: Request) -> Response:
        return serve_invoke(core, request, settings.default_accept)

    def invocations(request: Request) -> Response:
        if settings.multi_model:
            target = request.header(TARGET_MODEL)
            if not target:
                raise InvalidRequest("the X-Amzn-SageMaker-Target-Model header must name the model to invoke "
                                     "(a path under the model root)")
            request.model = target
            return _invoke_on_demand(core, request, settings.default_accept)
        request.model = SINGLE_MODEL_NAME
        return serve_invoke(core, request, settings.default_accept)

    return [
        Route("GET", "/ping", ping, "health", _PING),
        Route("POST", "/invocations", invocations, "inference", _INVOCATIONS),
        Route("GET", "/models", list_models, "metadata", _LIST),
        Route("POST", "/models", load_model, "model-repository", _LOAD),
        Route("GET", "/models/{name}", get_model, "metadata", _GET),
        Route("DELETE", "/models/{name}", unload_model, "model-repository", _UNLOAD),
        Route("POST", "/models/{name}/invoke", invoke, "inference", _INVOKE),
    ]


def _invoke_on_demand(core: Core, request: Request, default_accept: str) -> Response:
    """Load the target on first use, and invoke it."""
    with core.lease_loading(request.model, request.model, request.client) as lease:
        return _invoke(core, lease, request, default_accept)


def serve_invoke(core: Core, request: Request, default_accept: str) -> Response:
    """One invoke of the loaded `request.model`."""
    with core.lease(request.model, client=request.client) as lease:
        return _invoke(core, lease, request, default_accept)


def _invoke(core: Core, lease: Lease, request: Request, default_accept: str) -> Response:
    """A handler model gets the body as is; a tensor model's body is decoded for its inputs and its
    outputs encoded as the Accept header asks (`default_accept` for none or `*/*`)."""
    body = request.body
    attributes = request.header(CUSTOM_ATTRIBUTES)
    if attributes is not None:
        log.info("custom attributes", extra={"fields": {"model": lease.name, "custom_attributes": attributes,
                                                         "request_id": request.request_id}})
    accept = request.header("accept")
    if not lease.takes_tensors:
        media_type = content.media_type(request.header("content-type"), default=None)
        transform = TransformRequest(body, media_type, accept, _titled(request.headers), request.request_id)
        response = core.transform(lease, transform)
        return Response(response.body, response.content_type, response.status, dict(response.headers))
    response_type = content.negotiate(accept, default=default_accept)  # a 406 before any work is done
    inputs, envelope = offload.run(offload.heavy(len(body)), invoke_codec.decode, body,
                                   content.media_type(request.header("content-type")), lease.signature)
    outputs = core.infer(lease, InferRequest(inputs)).outputs
    return Response(offload.encode(invoke_codec.encode, outputs, response_type, envelope), response_type)


def _titled(headers: dict[str, str]) -> dict[str, str]:
    """Headers by their names in title case (`Content-Type`, `X-Amzn-Sagemaker-…`), as handlers see them."""
    return {name.title(): value for name, value in headers.items()}


def _model_entry(model) -> dict:
    return {"modelName": model.name, "modelUrl": model.url}


def _load_body(body: bytes) -> tuple[str, str]:
    document = content.parse_json(body)
    if not isinstance(document, dict):
        raise InvalidRequest('the body must be a JSON object: {"model_name": "...", "url": "..."}')
    name, url = document.get("model_name"), document.get("url")
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequest("'model_name' must be a non-empty string")
    check_name(name)
    if not isinstance(url, str) or not url.strip():
        raise InvalidRequest("'url' must be a non-empty string naming a directory or archive under the model root")
    return name, url


def _page_size(text: str | None) -> int:
    if text is None:
        return DEFAULT_PAGE_SIZE
    size = whole_number(text)
    if not size:
        raise InvalidRequest(f"limit={text[:40]!r}: expected a positive whole number")
    return size


def _decode_token(token: str) -> str:
    try:
        return base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequest(f"next_page_token {token!r} was not issued by this server") from None


# The OpenAPI operations of the routes above (api/openapi.py)
_MODEL = object_schema({"modelName": {"type": "string"}, "modelUrl": {"type": "string"}})
_BODIES = {"content": {content.JSON: {"schema": JSON_VALUE}, content.CSV: {"schema": {"type": "string"}},
                       content.NPY: {"schema": {"type": "string", "format": "binary"}}}}
_PING = operation("health: 200 once the server (single-model: the model) is ready", SAGEMAKER, errors=(503,))
_INVOCATIONS = operation(
    "invoke the model the X-Amzn-SageMaker-Target-Model header names, loading it on first use", SAGEMAKER, _BODIES,
    _BODIES, [{"name": "X-Amzn-SageMaker-Target-Model", "in": "header", "schema": {"type": "string"}}],
    errors=(400, 404, 406, 413, 415, 507))
_LIST = operation("list the loaded models, a page at a time", SAGEMAKER, json_content(object_schema({
    "models": {"type": "array", "items": _MODEL}, "nextPageToken": {"type": "string"}})), parameters=[
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
    {"name": "next_page_token", "in": "query", "schema": {"type": "string"}}], errors=(400,))
_LOAD = operation("load a model from a directory or archive under the model root", SAGEMAKER, json_content(_MODEL),
                  json_content(object_schema({"model_name": {"type": "string"}, "url": {"type": "string"}}, ["model_name", "url"])),
                  errors=(400, 404, 409, 413, 507))
_GET = operation("describe a loaded model", SAGEMAKER, json_content(_MODEL))
_UNLOAD = operation("unload a model once its requests in flight finish", SAGEMAKER, json_content(JSON_VALUE))
_INVOKE = operation("invoke a loaded model", SAGEMAKER, _BODIES, _BODIES, errors=(400, 404, 406, 413, 415))
