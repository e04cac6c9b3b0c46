"""One JSON log line per request — method, path, model, status, duration, request id (from
X-Request-Id, or made here, and echoed back), SageMaker's target model — and the request id on every
error logged while serving it."""

import logging
import time
import uuid

from flask import Flask, Response, g, request

log = logging.getLogger("container.requests")
REQUEST_ID = "X-Request-Id"
TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"


def register_request_log(app: Flask) -> None:
    @app.before_request
    def start() -> None:
        g.started = time.perf_counter()
        g.request_id = request.headers.get(REQUEST_ID) or new_request_id()

    @app.after_request
    def finish(response: Response) -> Response:
        response.headers[REQUEST_ID] = g.request_id
        model = g.get("model") or (request.view_args or {}).get("name")
        log_request(request.method, request.path, model, response.status_code, g.started, g.request_id,
                    request.headers.get(TARGET_MODEL))
        return response


def log_request(method: str, path: str, model: str | None, status: int, started: float, request_id: str,
                target_model: str | None) -> None:
    if log.isEnabledFor(logging.INFO):
        fields = {"method": method, "path": path, "model": model, "status": status,
                  "duration_ms": round((time.perf_counter() - started) * 1000, 3), "request_id": request_id}
        if target_model is not None:
            fields["target_model"] = target_model
        log.info("request", extra={"fields": fields})


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_id() -> str | None:
    return g.get("request_id")
