"""SageMaker's container contract: `/ping`, `/invocations`, and the multi-model `/models` API."""

import base64
import binascii
import logging
import re

import orjson
from flask import Blueprint, Flask, Response, request

from container import content
from container.api import invoke_codec, offload
from container.errors import InvalidRequest, ModelNotFound, Unavailable
from container.inference import InferRequest, TransformRequest
from container.limits import check_name, whole_number
from container.models.registry import Registry, State
from container.settings import Settings

log = logging.getLogger(__name__)

TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
SINGLE_MODEL_NAME = "model"
DEFAULT_PAGE_SIZE = 100


def json_response(value, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status, mimetype=content.JSON)


def register_sagemaker_endpoints(app: Flask, registry: Registry, settings: Settings) -> None:
    api = Blueprint("sagemaker", __name__)

    @api.get("/ping")
    def ping():
        registry.check_health()
        if not settings.multi_model and not registry.ready():
            failure = registry.failures.get(SINGLE_MODEL_NAME)
            raise Unavailable(f"the model failed to load: {failure}" if failure else "the model is not loaded yet")
        return Response(b"", 200)

    @api.post("/models")
    def load_model():
        name, url = _load_body(request.get_data())
        model = registry.load(name, url)
        return json_response(_describe(model))

    @api.get("/models")
    def list_models():
        models = registry.ready()
        limit = _page_size(request.args.get("limit"))
        token = request.args.get("next_page_token")
        if token:
            start = _decode_token(token)
            models = [m for m in models if m.name >= start]
        page = {"models": [_describe(m) for m in models[:limit]]}
        if len(models) > limit:
            page["nextPageToken"] = base64.urlsafe_b64encode(models[limit].name.encode()).decode()
        return json_response(page)

    @api.get("/models/<name>")
    def get_model(name):
        return json_response(_describe(registry.get(name)))

    @api.delete("/models/<name>")
    def unload_model(name):
        registry.unload(name)
        return json_response({"status": f"model '{name}' unloaded"})

    app.register_blueprint(api)


def sagemaker_hot_routes(registry: Registry, settings: Settings) -> list:
    """Invoke and /invocations, served in front of Flask (hot_paths.py) because they are the hot path."""

    def invoke(call):
        return serve_invoke(registry, call, settings.default_accept)

    def invocations(call):
        if settings.multi_model:
            target = call.header(TARGET_MODEL)
            if not target:
                raise InvalidRequest(f"the {TARGET_MODEL} header must name the model to invoke (a path under the model root)")
            call.model = target
            return _invoke_on_demand(registry, call, settings.default_accept)
        call.model = SINGLE_MODEL_NAME
        return serve_invoke(registry, call, settings.default_accept)

    return [(re.compile(r"/models/(?P<name>[^/]+)/invoke"), invoke), (re.compile(r"/invocations"), invocations)]


def _invoke_on_demand(registry: Registry, call, default_accept: str):
    """Load the target on first use. A target evicted or unloaded between its load and its request's
    lease is loaded again: the platform sent the request expecting exactly that."""
    for _ in range(3):
        model = registry.ensure_loaded(call.model, call.model)
        try:
            return serve_invoke(registry, call, default_accept)
        except ModelNotFound:
            if model.state is State.READY and registry.models.get(call.model) is model:
                raise  # not a race: the model is there and serving
    raise Unavailable(f"model '{call.model}' was evicted three times before it could serve; retry")


def serve_invoke(registry: Registry, call, default_accept: str) -> tuple[bytes, dict[str, str], int]:
    """One invoke of `call.model`: a handler model gets the body as is; a tensor model's body is
    decoded for its inputs and its outputs encoded as the Accept header asks (`default_accept` for
    none or `*/*`)."""
    name = call.model
    attributes = call.header(CUSTOM_ATTRIBUTES)
    if attributes is not None:
        log.info("custom attributes", extra={"fields": {"model": name, "custom_attributes": attributes,
                                                         "request_id": call.request_id}})
    model = registry.get(name)
    accept = call.header("Accept")
    if model.signature is None:
        media_type = content.media_type(call.header("Content-Type"), default=None)
        response = registry.transform(TransformRequest(name, call.body, media_type, accept, call.headers(), call.request_id))
        return response.body, {**response.headers, "Content-Type": response.content_type}, response.status
    response_type = content.negotiate(accept, default=default_accept)  # a 406 before any work is done
    inputs, envelope = offload.run(offload.heavy(len(call.body)), invoke_codec.decode, call.body,
                                   content.media_type(call.header("Content-Type")), model.signature)
    outputs = registry.infer(InferRequest(name, inputs)).outputs
    body = offload.encode(invoke_codec.encode, outputs, response_type, envelope)
    return body, {"Content-Type": response_type}, 200


def _describe(model) -> dict:
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
