"""Triton's logging and trace extensions: `/v2/logging` and `/v2[/models/{name}]/trace/setting` over
HTTP, and the LogSettings and TraceSetting RPCs (a front-end process, over the channel) answer the same.

The log is fixed at start (SERVE_LOG_LEVEL, JSON lines on stderr) and no request is traced, so a
settings update may restate a value, or clear one (null, as Triton's clients clear a model's trace
setting), but not change it: 501, as Triton answers an update it does not support. A client may not
make the server's log louder."""

from container import content
from container.api import v2_dataplane
from container.api.openapi import V2, json_content, object_schema, operation
from container.api.pipeline import Request, Response
from container.api.routing import Route
from container.core import Core
from container.errors import InvalidRequest, Unsupported

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Triton's HTTP shape: every value a string, but the levels a list of them
_TRACE = {"trace_level": ["OFF"], "trace_rate": "0", "trace_count": "0", "log_frequency": "0", "trace_file": "",
          "trace_mode": "triton"}


def log_settings(log_level: str, update: dict) -> dict:
    """The log's settings in Triton's names, once `update` is found to change none of them."""
    rank = _LEVELS.index(log_level) if log_level in _LEVELS else _LEVELS.index("INFO")
    current = {"log_file": "", "log_info": rank <= 1, "log_warning": rank <= 2, "log_error": rank <= 3,
               "log_verbose_level": int(rank == 0), "log_format": "json"}
    _refuse_changes("log", update, current, "the log is fixed at start (SERVE_LOG_LEVEL)")
    return current


def trace_settings(core: Core, name: str | None, update: dict) -> dict:
    """The trace settings, the server's or a loaded model's (they are the same: nothing is traced)."""
    if name:
        v2_dataplane.check_model_ready(core, name, None)
    _refuse_changes("trace", update, _TRACE,
                    "this server traces no requests; its request log and /metrics say what each request did")
    return {key: list(value) if isinstance(value, list) else value for key, value in _TRACE.items()}


_KINDS = {bool: "a boolean", int: "an integer", str: "a string", list: "a list of strings"}


def _refuse_changes(kind: str, update: dict, current: dict, why: str) -> None:
    for key, value in update.items():
        if key not in current:
            raise InvalidRequest(f"unknown {kind} setting '{key}'; the settings are {', '.join(current)}")
        if value is None:
            continue
        if type(value) is not type(current[key]):
            raise InvalidRequest(f"{kind} setting '{key}' takes {_KINDS[type(current[key])]}, or null")
        if value != current[key]:
            raise Unsupported(f"{kind} setting '{key}' cannot be changed: {why}")


def log_and_trace_routes(core: Core, log_level: str) -> list[Route]:
    def logging(request: Request) -> Response:
        return Response.json(log_settings(log_level, _update(request)))

    def trace(request: Request) -> Response:
        return Response.json(trace_settings(core, request.params.get("name"), _update(request)))

    return [
        Route("GET", "/v2/logging", logging, "logging", _LOG),
        Route("POST", "/v2/logging", logging, "logging", _LOG_UPDATE),
        Route("GET", "/v2/trace/setting", trace, "trace", _TRACE_GET),
        Route("POST", "/v2/trace/setting", trace, "trace", _TRACE_UPDATE),
        Route("GET", "/v2/models/{name}/trace/setting", trace, "trace", _MODEL_TRACE),
        Route("POST", "/v2/models/{name}/trace/setting", trace, "trace", _MODEL_TRACE_UPDATE),
    ]


def _update(request: Request) -> dict:
    return content.parse_object(request.body) if request.method == "POST" else {}


# The OpenAPI operations of the routes above (api/openapi.py)
_LOG_DOCUMENT = json_content(object_schema({
    "log_file": {"type": "string"}, "log_info": {"type": "boolean"}, "log_warning": {"type": "boolean"},
    "log_error": {"type": "boolean"}, "log_verbose_level": {"type": "integer"}, "log_format": {"type": "string"}}))
_TRACE_DOCUMENT = json_content(object_schema({
    "trace_level": {"type": "array", "items": {"type": "string"}}, "trace_rate": {"type": "string"},
    "trace_count": {"type": "string"}, "log_frequency": {"type": "string"}, "trace_file": {"type": "string"},
    "trace_mode": {"type": "string"}}))
_LOG = operation("the log's settings (fixed at start: SERVE_LOG_LEVEL)", V2, _LOG_DOCUMENT, errors=())
_LOG_UPDATE = operation("restate the log's settings; a change is 501", V2, _LOG_DOCUMENT, _LOG_DOCUMENT,
                        errors=(400, 413, 501))
_TRACE_GET = operation("the trace settings: this server traces no requests", V2, _TRACE_DOCUMENT, errors=())
_TRACE_UPDATE = operation("restate the trace settings; a change is 501", V2, _TRACE_DOCUMENT, _TRACE_DOCUMENT,
                          errors=(400, 413, 501))
_MODEL_TRACE = operation("a model's trace settings", V2, _TRACE_DOCUMENT, errors=(400, 404, 503))
_MODEL_TRACE_UPDATE = operation("restate a model's trace settings; a change is 501", V2, _TRACE_DOCUMENT,
                                _TRACE_DOCUMENT, errors=(400, 404, 413, 501, 503))
