"""The model repository extension: index every model under the model root (loaded or not, with why
a failed load failed), load (or reload, with a config override and files), unload."""

import base64
import binascii

from container import content
from container.api.openapi import EMPTY, NUMBERS, V2, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.core import Core
from container.errors import InvalidRequest, SourceNotFound
from container.limits import check_name


def repository_routes(core: Core) -> list[Route]:
    def index(request: Request) -> Response:
        ready_only = _body(request).get("ready", False)
        if not isinstance(ready_only, bool):
            raise InvalidRequest("'ready' must be true or false")
        entries = []
        for entry in core.index(ready_only):
            if entry.state == "READY":
                entries += [{"name": entry.name, "version": str(v), "state": "READY", "reason": entry.reason}
                            for v in entry.versions]
            else:
                entries.append({"name": entry.name, "state": entry.state, "reason": entry.reason})
        return Response(content.encode_json(entries), content.JSON)

    def load(request: Request) -> Response:
        name = request.params["name"]
        check_name(name)
        parameters = _parameters(_body(request))
        config = parameters.get("config")
        files = {key[len("file:"):]: _decode_file(key, value) for key, value in parameters.items() if key.startswith("file:")}
        if config is not None and not isinstance(config, str):
            raise InvalidRequest("parameter 'config' must be a string holding the model config as JSON")
        if files and config is None:
            raise InvalidRequest("'file:' parameters need the 'config' parameter too")
        try:
            core.reload(name, config, files)
        except SourceNotFound as exc:  # Triton's words, which scripts check, then ours
            raise SourceNotFound(f"failed to load '{name}', failed to poll from model repository ({exc})") from None
        except InvalidRequest as exc:
            raise type(exc)(f"failed to load '{name}', {exc}") from None
        return Response()

    def unload(request: Request) -> Response:
        dependents = _parameters(_body(request)).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidRequest("parameter 'unload_dependents' must be true or false")
        name = request.params["name"]
        if core.state(name) is not None:  # unloading a model that is not loaded succeeds, as in Triton
            core.unload(name)  # no ensembles here, so no model has dependents
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
