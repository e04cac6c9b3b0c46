"""TF Serving's inference routes, wherever the model runs: `:predict`, `:classify` and `:regress` of a
model, a version or a label, each answered through `run(request, verb)`. In one process `run` is
tfserving.infer; an HTTP front-end's crosses the channel in groups (http_frontend/tfserving.py)."""

from typing import Callable

from container.api.openapi import TF_SERVING, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route

Run = Callable[[Request, str], Response]
ANSWER = json_content({"type": "object"})


def answer(body: bytes) -> Response:
    """TF Serving's answer: its JSON body."""
    return Response(body, "application/json")


def infer_routes(run: Run) -> list[Route]:
    routes = []
    for verb, described in ((":predict", _PREDICT), (":classify", _CLASSIFY), (":regress", _REGRESS)):
        serve = _serving(run, verb)
        routes += [Route("POST", f"/v1/models/{{name}}{path}{verb}", serve, "inference", described)
                   for path in ("", "/versions/{version}", "/labels/{label}")]
    return routes


def _serving(run: Run, verb: str):
    return lambda request: run(request, verb)


# The OpenAPI operations of the routes above (api/openapi.py)
_EXAMPLES = json_content(object_schema({"signature_name": {"type": "string"}, "context": {"type": "object"},
                                        "examples": {"type": "array", "items": {"type": "object"}}}, ["examples"]))
_PREDICT = operation("predict (row or columnar format)", TF_SERVING, ANSWER, json_content(object_schema({
    "signature_name": {"type": "string"}, "instances": {"type": "array", "items": {}}, "inputs": {}})),
    errors=(400, 404, 413))
_CLASSIFY = operation("classify tf.Example-style examples", TF_SERVING, ANSWER, _EXAMPLES, errors=(400, 404, 413))
_REGRESS = operation("regress tf.Example-style examples", TF_SERVING, ANSWER, _EXAMPLES, errors=(400, 404, 413))
