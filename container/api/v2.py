"""Triton / KServe V2 over HTTP: health, metadata, config, inference and statistics. The repository
and shared memory extensions live in v2_repository.py and shared_memory.py."""

from container import content
from container.api import v2_dataplane
from container.api.openapi import EMPTY, NUMBERS, V2, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.api.v2_infer import answer_body, infer_routes, parser
from container.core import Core
from container.models.config import config_document
from container.v2 import codec


def v2_routes(core: Core, shared_memory, max_body: int) -> list[Route]:
    server_metadata = content.encode_json(v2_dataplane.server_metadata())

    def live(request: Request) -> Response:
        """The status is the answer (tritonclient reads it); the body says it again for KServe's clients."""
        core.check_health()
        return _json({"live": True})

    def ready(request: Request) -> Response:
        v2_dataplane.check_ready(core)
        return _json({"ready": True})

    def alive(request: Request) -> Response:
        """KServe's V1 liveness, which its client reads at the root."""
        core.check_health()
        return _json({"status": "alive"})

    def metadata(request: Request) -> Response:
        return Response(server_metadata, content.JSON)

    def model_metadata(request: Request) -> Response:
        return _json(v2_dataplane.model_metadata(core, request.params["name"], request.params.get("version")))

    def model_ready(request: Request) -> Response:
        v2_dataplane.check_model_ready(core, request.params["name"], request.params.get("version"))
        return Response()

    def model_config(request: Request) -> Response:
        return _json(config_document(v2_dataplane.model_config(core, request.params["name"], request.params.get("version"))))

    def statistics(request: Request) -> Response:
        return _json(v2_dataplane.statistics(core, request.params.get("name"), request.params.get("version")))

    def infer(request: Request, body: bytes, heavy: bool) -> tuple[bytes, dict[str, str]]:
        name, header_length = request.params["name"], request.header(codec.HEADER_LENGTH)
        answer, chunks = v2_dataplane.infer(core, shared_memory, name, request.params.get("version"),
                                            parser(name, body, header_length, heavy), request.client, heavy)
        return answer_body(answer, chunks, heavy)

    return [
        Route("GET", "/", alive, "health", _ALIVE),
        Route("GET", "/v2/health/live", live, "health", _LIVE),
        Route("GET", "/v2/health/ready", ready, "health", _READY),
        Route("GET", "/v2", metadata, "metadata", _SERVER),
        Route("GET", "/v2/models/stats", statistics, "statistics", _ALL_STATS),
        Route("GET", "/v2/models/{name}", model_metadata, "metadata", _METADATA),
        Route("GET", "/v2/models/{name}/versions/{version}", model_metadata, "metadata", _METADATA),
        Route("GET", "/v2/models/{name}/ready", model_ready, "health", _MODEL_READY),
        Route("GET", "/v2/models/{name}/versions/{version}/ready", model_ready, "health", _MODEL_READY),
        Route("GET", "/v2/models/{name}/config", model_config, "model-config", _CONFIG),
        Route("GET", "/v2/models/{name}/versions/{version}/config", model_config, "model-config", _CONFIG),
        Route("GET", "/v2/models/{name}/stats", statistics, "statistics", _STATS),
        Route("GET", "/v2/models/{name}/versions/{version}/stats", statistics, "statistics", _STATS),
        *infer_routes(infer, max_body),
    ]


def _json(value) -> Response:
    return Response(content.encode_json(value), content.JSON)


# The OpenAPI operations of the routes above (api/openapi.py)
_ANY_OBJECT = json_content({"type": "object"})
_LIVE = operation("liveness: 503 after a sticky GPU error, while the worker restarts", V2,
                  json_content(object_schema({"live": {"const": True}}, ["live"])), errors=(503,))
_READY = operation("readiness: the models named at start have loaded", V2,
                   json_content(object_schema({"ready": {"const": True}}, ["ready"])), errors=(503,))
_ALIVE = operation("KServe V1 liveness", V2, json_content(object_schema({"status": {"const": "alive"}}, ["status"])),
                   errors=(503,))
_SERVER = operation("server metadata", V2, json_content(object_schema({
    "name": {"type": "string"}, "version": {"type": "string"}, "extensions": {"type": "array", "items": {"type": "string"}}})),
    errors=())
_ALL_STATS = operation("statistics of every loaded model", V2, json_content(object_schema({"model_stats": NUMBERS})), errors=())
_METADATA = operation("model metadata", V2, _ANY_OBJECT)
_MODEL_READY = operation("model readiness", V2, EMPTY, errors=(400, 404, 503))
_CONFIG = operation("the model's Triton config", V2, _ANY_OBJECT)
_STATS = operation("the model's statistics", V2, _ANY_OBJECT)
