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
        g.request_id = request.headers.get(REQUEST_ID) or uuid.uuid4().hex

    @app.after_request
    def finish(response: Response) -> Response:
        response.headers[REQUEST_ID] = g.request_id
        if log.isEnabledFor(logging.INFO):
            fields = {
                "method": request.method,
                "path": request.path,
                "model": g.get("model") or (request.view_args or {}).get("name"),
                "status": response.status_code,
                "duration_ms": round((time.perf_counter() - g.started) * 1000, 3),
                "request_id": g.request_id,
            }
            if TARGET_MODEL in request.headers:
                fields["target_model"] = request.headers[TARGET_MODEL]
            log.info("request", extra={"fields": fields})
        return response


def request_id() -> str | None:
    return g.get("request_id")
