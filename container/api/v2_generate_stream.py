"""`POST /v2/models/{name}[/versions/{v}]/generate_stream` (Triton's generate extension, v2_generate.py):
each of a model's responses sent as it comes, as a server-sent event (`data: {…}`), a decoupled model's
tokens as it makes them. The events come from `events`: the model process's own (v2_generate.py), or,
in an HTTP front-end, over the channel, so this module knows no model. A request refused before the
model's first response is an error answer as any other. An error the model sends is an event
`{"error": "…"}`: the stream's status is its first response's, as Triton sets it, so a stream whose
first response is an error carries that error's status."""

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
# (name, version, request) → [document, status] of each of the model's responses: 200, or an error's status
# with {"error": …}
Events = Callable[[str, str | None, dict], Iterator[list]]


def stream_routes(events: Events, max_body: int) -> list[Route]:
    def generate_stream(request: Request) -> Response:
        items = events(request.params["name"], request.params.get("version"), generate_request(request, max_body))
        first = next(items, None)  # a request refused before the first response is an error answer
        # the stream's status is its first response's, as Triton sets it: an error there is its own status
        return Response(content_type=EVENT_STREAM, status=first[1] if first else 200,
                        stream=_server_sent(first and first[0], items))

    return [Route("POST", "/v2/models/{name}/generate_stream", generate_stream, "inference", _GENERATE_STREAM),
            Route("POST", "/v2/models/{name}/versions/{version}/generate_stream", generate_stream, "inference",
                  _GENERATE_STREAM)]


def generate_request(request: Request, max_body: int) -> dict:
    """The request's JSON object, its body inflated first when it came gzip or deflate, as V2 infer's."""
    return content.parse_object(compression.inflate(request.body, request.header("content-encoding"), max_body))


def _server_sent(first: dict | None, items: Iterator[list]) -> Iterator[bytes]:
    try:
        if first is not None:
            yield _event(first)
        for document, _ in items:
            yield _event(document)
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
