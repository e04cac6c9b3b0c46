"""The OpenAPI 3.1 document of all three APIs, served at `GET /openapi.json`, made from the route
table: each route carries its operation (`Route.doc`, written with the helpers here beside the route
in its protocol's module), and its path parameters come from its template. A test holds the document
to the routes, and schemathesis sends what it describes to a live server."""

import re

from container import content
from container.api.pipeline import Response
from container.api.routing import Route

SAGEMAKER, V2, TF_SERVING, METRICS = "SageMaker", "Triton / KServe V2", "TensorFlow Serving", "metrics"
ERROR = {"$ref": "#/components/schemas/Error"}
JSON_VALUE: dict = {}  # any JSON value
NUMBERS = {"type": "array", "items": JSON_VALUE}
EMPTY = {"description": "success, with an empty body"}
_PATH_PARAMETERS = {
    "name": {"schema": {"type": "string"}, "description": "a model name"},
    "version": {"schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "label": {"schema": {"type": "string"}, "description": "a version label"},
}
_REGION = {"schema": {"type": "string"}, "description": "a region name"}


def json_content(schema: dict) -> dict:
    return {"content": {content.JSON: {"schema": schema}}}


def operation(summary: str, tag: str, ok: dict | None = None, body: dict | None = None, parameters=(),
              errors=(400, 404), ok_status: str = "200") -> dict:
    """An OpenAPI operation: `ok` the success's content, `body` the request body's, `parameters` those
    beside the path's (headers, queries), `errors` the client errors it may answer."""
    responses = {ok_status: {"description": "success", **(ok or {})}}
    responses |= {str(status): {"description": "a client error; the message says what to fix", **json_content(ERROR)}
                  for status in errors}
    document = {"summary": summary, "tags": [tag], "responses": responses}
    if parameters:
        document["parameters"] = list(parameters)
    if body is not None:
        document["requestBody"] = {"required": False, **body}
    return document


def object_schema(properties: dict, required=()) -> dict:
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def document(version: str, routes: list[Route]) -> dict:
    paths: dict = {}
    for route in routes:
        names = re.findall(r"\{(\w+)\}", route.template)
        own = [_path_parameter(name, route.template) for name in names]
        described = {**route.doc, **({"parameters": own + route.doc.get("parameters", [])} if own else {})}
        paths.setdefault(route.template, {})[route.method.lower()] = described
    return {
        "openapi": "3.1.0",
        "info": {"title": "Multi-model inference container", "version": version,
                 "description": "SageMaker's multi-model contract, Triton/KServe V2 and TensorFlow Serving's REST API over one model cache."},
        "paths": paths,
        "components": {"schemas": {"Error": object_schema({"error": {"type": "string"}}, ["error"])}},
    }


def _path_parameter(name: str, template: str) -> dict:
    spec = _REGION if name == "name" and "/region/" in template else _PATH_PARAMETERS[name]
    return {"name": name, "in": "path", "required": True, **spec}


def openapi_routes(version: str, routes: list[Route]) -> list[Route]:
    """`GET /openapi.json`: the document of `routes` and of itself."""
    body = b""
    own = Route("GET", "/openapi.json", lambda request: Response(body, content.JSON), "metadata",
                operation("this document", METRICS, json_content({"type": "object"}), errors=()))
    body = content.encode_json(document(version, [*routes, own]))
    return [own]
