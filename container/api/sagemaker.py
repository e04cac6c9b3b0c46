"""SageMaker's container contract: `/ping`, `/invocations`, and the multi-model `/models` API."""

import base64
import binascii
from typing import Callable, Iterator

from container import content
from container.api.leased import serve_leased, serve_one
from container.api.openapi import JSON_VALUE, SAGEMAKER, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.api.sagemaker_invoke import CUSTOM_ATTRIBUTES, SINGLE_MODEL_NAME, invoke_routes, log_attributes, tensors
from container.core import Core, Lease
from container.errors import InvalidRequest, ModelNotFound, Unavailable
from container.inference import InferRequest, TransformRequest
from container.limits import check_name, whole_number
from container.settings import Settings

DEFAULT_PAGE_SIZE = 100
BATCH_PAYLOAD_BOUND_MB = 100  # SageMaker Batch Transform's bound on MaxPayloadInMB × MaxConcurrentTransforms


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

    def execution_parameters(request: Request) -> Response:
        if settings.multi_model:
            raise ModelNotFound("execution parameters describe a single-model endpoint's model, as SageMaker Batch "
                                "Transform runs it; this is a multi-model endpoint")
        return Response.json(batch_parameters(core.ready_model(SINGLE_MODEL_NAME).instances, settings.max_payload_mb))

    def run(request: Request, name: str, on_demand: bool) -> Response:
        return invoke(core, name, on_demand, request, settings.default_accept)

    invocations, invoke_route = invoke_routes(run, settings)
    return [
        Route("GET", "/ping", ping, "health", _PING),
        Route("GET", "/execution-parameters", execution_parameters, "metadata", _EXECUTION_PARAMETERS),
        invocations,
        Route("GET", "/models", list_models, "metadata", _LIST),
        Route("POST", "/models", load_model, "model-repository", _LOAD),
        Route("GET", "/models/{name}", get_model, "metadata", _GET),
        Route("DELETE", "/models/{name}", unload_model, "model-repository", _UNLOAD),
        invoke_route,
    ]


def batch_parameters(instances: int, max_payload_mb: float) -> dict:
    """What SageMaker Batch Transform asks a container for where the job sets none (its defaults: one
    request at a time, 6 MB): a request as large as the server takes (a whole MB, 100 at most), and as
    many at once as the model runs (its `instances`), within SageMaker's bound on their product (100 MB)."""
    payload = min(max(int(max_payload_mb), 1), BATCH_PAYLOAD_BOUND_MB)
    return {"MaxConcurrentTransforms": max(min(instances, BATCH_PAYLOAD_BOUND_MB // payload), 1),
            "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": payload}


def invoke(core: Core, name: str, on_demand: bool, request: Request, default_accept: str) -> Response:
    """One invoke, served in this process."""
    decode = body_decoder(request.body, request.headers, request.request_id, default_accept)
    [lease] = core.leases(name, None, [request.client], loading=name if on_demand else None)
    return serve_one(lease, decode, core.infer if lease.takes_tensors else core.transform)


def invoke_group(core: Core, name: str, on_demand: bool, calls: list[tuple[Callable, object]]) -> Iterator[tuple[int, object]]:
    """Invokes of one model that arrived together, each (its `decode` for serve_leased, its client): the
    model leased once for them all (loaded first when `on_demand` and not loaded), and their requests
    handed to the core together (api/leased.py), a tensor model's to infer, a handler model's to transform.
    Yields (position, Response or the exception it failed with) for each, as each is done."""
    try:
        leases = core.leases(name, None, [client for _, client in calls], loading=name if on_demand else None)
    except Exception as exc:  # the model is not there, or did not load: each request is told
        yield from ((position, exc) for position in range(len(calls)))
        return
    run_all = core.infer_all if leases[0].takes_tensors else core.transform_all
    yield from serve_leased(leases, [decode for decode, _ in calls], run_all)


def body_decoder(body: bytes, headers: dict[str, str], request_id: str, default_accept: str) -> Callable:
    """`decode` for invoke_group of an invoke's body (headers by lower-case name): a handler model gets it
    as it is; a tensor model's is decoded for its inputs, and its outputs encoded as the Accept header
    asks (`default_accept` for none or `*/*`)."""

    def decode(lease: Lease):
        log_attributes(lease.name, headers.get(CUSTOM_ATTRIBUTES), request_id)
        if lease.takes_tensors:
            inputs, finish = tensors(body, headers, lease.signature, default_accept)
            return InferRequest(inputs), lambda response: finish(response.outputs)
        media_type = content.media_type(headers.get("content-type"), default=None)
        request = TransformRequest(body, media_type, headers.get("accept"), _titled(headers), request_id)
        return request, lambda response: Response(response.body, response.content_type, response.status, dict(response.headers))

    return decode


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
_PING = operation("health: 200 once the server (single-model: the model) is ready", SAGEMAKER, errors=(503,))
_LIST = operation("list the loaded models, a page at a time", SAGEMAKER, json_content(object_schema({
    "models": {"type": "array", "items": _MODEL}, "nextPageToken": {"type": "string"}})), parameters=[
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
    {"name": "next_page_token", "in": "query", "schema": {"type": "string"}}], errors=(400,))
_LOAD = operation("load a model from a directory or archive under the model root", SAGEMAKER, json_content(_MODEL),
                  json_content(object_schema({"model_name": {"type": "string"}, "url": {"type": "string"}}, ["model_name", "url"])),
                  errors=(400, 404, 409, 413, 507))
_GET = operation("describe a loaded model", SAGEMAKER, json_content(_MODEL))
_EXECUTION_PARAMETERS = operation(
    "SageMaker Batch Transform's execution parameters for the single model", SAGEMAKER, json_content(object_schema({
        "MaxConcurrentTransforms": {"type": "integer", "minimum": 1}, "BatchStrategy": {"type": "string"},
        "MaxPayloadInMB": {"type": "integer", "minimum": 1}})), errors=(404, 503))
_UNLOAD = operation("unload a model once its requests in flight finish", SAGEMAKER, json_content(JSON_VALUE))
