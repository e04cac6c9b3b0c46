"""One JSON log line per request — method, path, model, status, duration, request id (from
X-Request-Id, or made by the pipeline, and echoed back), SageMaker's target model. Nothing is formatted
when INFO is off for `container.requests`."""

import logging
import time

log = logging.getLogger("container.requests")


def log_request(request, status: int, started: float) -> None:
    """`request`: pipeline.Request."""
    if log.isEnabledFor(logging.INFO):
        fields = {"method": request.method, "path": request.path, "model": request.model, "status": status,
                  "duration_ms": round((time.perf_counter() - started) * 1000, 3), "request_id": request.request_id}
        target_model = request.headers.get("x-amzn-sagemaker-target-model")
        if target_model is not None:
            fields["target_model"] = target_model
        log.info("request", extra={"fields": fields})
