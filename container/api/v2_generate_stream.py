"""`POST /v2/models/{name}[/versions/{v}]/generate_stream` (Triton's generate extension, v2_generate.py):
each of a model's responses sent as it comes, as a server-sent event (`data: {…}`), a decoupled model's
tokens as it makes them. The events come from `events`: the model process's own (v2_generate.py), or,
in an HTTP front-end, over the channel, so this module knows no model. A request refused before the
model's first response is an error answer as any other; an error after it is an event `{"error": "…"}`
in a stream that began 200, as Triton sends it."""

import logging
from typing import Callable, Iterator

from container import content
from container.api import compression
from container.api.openapi import V2, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.errors import ServeError

log = logging.getLogger(__name__)
EVENT_STREAM = "text/event-stream; charset=utf-8"
# (name, version, request) → the model's responses as generate documents, or {"error": …}
Events = Callable[[str, str | None, dict], Iterator[dict]]


def stream_routes(events: Events, max_body: int) -> list[Route]:
    def generate_stream(request: Request) -> Response:
        items = events(request.params["name"], request.params.get("version"), generate_request(request, max_body))
        first = next(items, None)  # a request refused before the first response is an error answer
        return Response(content_type=EVENT_STREAM, stream=_server_sent(first, items))

    return [Route("POST", "/v2/models/{name}/generate_stream", generate_stream, "inference", _GENERATE_STREAM),
            Route("POST", "/v2/models/{name}/versions/{version}/generate_stream", generate_stream, "inference",
                  _GENERATE_STREAM)]


def generate_request(request: Request, max_body: int) -> dict:
    """The request's JSON object, its body inflated first when it came gzip or deflate, as V2 infer's."""
    return content.parse_object(compression.inflate(request.body, request.header("content-encoding"), max_body))


def _server_sent(first: dict | None, items: Iterator[dict]) -> Iterator[bytes]:
    try:
        if first is not None:
            yield _event(first)
        for item in items:
            yield _event(item)
    except ServeError as exc:
        yield _event({"error": str(exc)})
    except Exception:
        log.exception("generate_stream failed after its first response")
        yield _event({"error": "internal error; see the server's log"})
    finally:
        items.close()  # a client that left: the model's responses are no longer waited for


def _event(document: dict) -> bytes:
    return b"".join((b"data: ", content.encode_json(document), b"\n\n"))


# The OpenAPI operation of the routes above (api/openapi.py)
REQUEST = json_content(object_schema({"id": {"type": "string"}, "text_input": {"type": "string"},
                                      "parameters": {"type": "object"}}))
_GENERATE_STREAM = operation("generate, each of the model's responses sent as it comes (server-sent events)", V2,
                             {"content": {"text/event-stream": {"schema": {"type": "string"}}}}, REQUEST,
                             errors=(400, 404, 413, 415, 503, 507))
