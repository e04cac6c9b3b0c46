"""The model repository extension: index every model under the model root (loaded or not, with why
a failed load failed), load (or reload, with a config override and files), unload."""

import base64
import binascii

from container import content
from container.api import v2_dataplane
from container.api.openapi import EMPTY, NUMBERS, V2, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.core import Core
from container.errors import InvalidRequest


def repository_routes(core: Core) -> list[Route]:
    def index(request: Request) -> Response:
        entries = v2_dataplane.repository_index(core, _body(request).get("ready", False))
        return Response(content.encode_json(entries), content.JSON)

    def load(request: Request) -> Response:
        parameters = _parameters(_body(request))
        files = {key: _decode_file(key, value) for key, value in parameters.items() if key.startswith("file:")}
        v2_dataplane.load(core, request.params["name"], {**parameters, **files})
        return Response()

    def unload(request: Request) -> Response:
        v2_dataplane.unload(core, request.params["name"], _parameters(_body(request)))
        return Response()

    return [
        Route("POST", "/v2/repository/index", index, "model-repository", _INDEX),
        Route("POST", "/v2/repository/models/{name}/load", load, "model-repository", _LOAD),
        Route("POST", "/v2/repository/models/{name}/unload", unload, "model-repository", _UNLOAD),
    ]


# The OpenAPI operations of the routes above (api/openapi.py)
_PARAMETERS = json_content(object_schema({"parameters": {"type": "object"}}))
_INDEX = operation("every model under the model root, loaded or not", V2, json_content(NUMBERS),
                   json_content(object_schema({"ready": {"type": "boolean"}})), errors=(400, 413))
_LOAD = operation("load or reload a model, optionally with a config override and files", V2, EMPTY, _PARAMETERS,
                  errors=(400, 404, 409, 413, 507))
_UNLOAD = operation("unload a model", V2, EMPTY, _PARAMETERS)


def _body(request: Request) -> dict:
    return content.parse_object(request.body)


def _parameters(document: dict) -> dict:
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidRequest("'parameters' must be an object")
    return parameters


def _decode_file(key: str, value) -> bytes:
    if not isinstance(value, str):
        raise InvalidRequest(f"parameter '{key}' must hold the file's content in base64")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise InvalidRequest(f"parameter '{key}' is not valid base64: {exc}") from None
