"""The model repository extension: index every model under the model root (loaded or not, with why
a failed load failed), load (or reload, with a config override and files), unload."""

import base64
import binascii

import gevent
from flask import Blueprint, Flask, Response, request

from container import content
from container.errors import InvalidRequest
from container.limits import check_name
from container.models.overrides import build_override
from container.models.registry import Registry, State
from container.models.s3 import is_s3
from container.models.source import resolve_url


def register_repository_endpoints(app: Flask, registry: Registry) -> None:
    api = Blueprint("v2_repository", __name__)

    @api.post("/v2/repository/index")
    def index():
        ready_only = _body().get("ready", False)
        if not isinstance(ready_only, bool):
            raise InvalidRequest("'ready' must be true or false")
        entries = []
        names = sorted({name for name, _ in registry.entries()} | set(registry.models))
        for name in names:
            model = registry.models.get(name)
            if model is not None and model.state is State.READY:
                entries += [{"name": name, "version": str(v), "state": "READY", "reason": model.placement}
                            for v in sorted(model.versions)]
            elif not ready_only:
                entries.append(_not_ready(registry, name))
        return Response(content.encode_json(entries), 200, mimetype=content.JSON)

    @api.post("/v2/repository/models/<name>/load")
    def load(name):
        check_name(name)
        parameters = _parameters(_body())
        config = parameters.get("config")
        files = {key[len("file:"):]: _decode_file(key, value) for key, value in parameters.items() if key.startswith("file:")}
        directory = None
        if config is not None:
            if not isinstance(config, str):
                raise InvalidRequest("parameter 'config' must be a string holding the model config as JSON")
            if not files and is_s3(registry.model_root):
                raise InvalidRequest("a config override of a model in S3 needs the model's files as 'file:' parameters")
            base = None if files else resolve_url(registry.model_root, registry.locate(name))
            directory = gevent.get_hub().threadpool.apply(build_override, (config, files, base))
        elif files:
            raise InvalidRequest("'file:' parameters need the 'config' parameter too")
        registry.load(name, registry.locate(name), reload=True, directory=directory)
        return Response(b"", 200)

    @api.post("/v2/repository/models/<name>/unload")
    def unload(name):
        dependents = _parameters(_body()).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidRequest("parameter 'unload_dependents' must be true or false")
        registry.unload(name)  # no ensembles here, so no model has dependents
        return Response(b"", 200)

    app.register_blueprint(api)


def _not_ready(registry: Registry, name: str) -> dict:
    model = registry.models.get(name)
    if model is not None:
        return {"name": name, "state": model.state.value, "reason": ""}
    return {"name": name, "state": "UNAVAILABLE", "reason": registry.failures.get(name, "unloaded")}


def _body() -> dict:
    return content.parse_object(request.get_data())


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
