"""One JSON log line per request — method, path, model, status, duration, request id (from
X-Request-Id, or made by the pipeline, and echoed back), SageMaker's target model — in the same shape
as every other log line. A request only records its fields; the lines are formatted and written
together a moment later, after the responses have gone: through `logging`, a line costs ~15 µs of a
small request's CPU, more than the rest of its logging together."""

import atexit
import logging
import sys
import time
from datetime import datetime, timezone

import gevent
import orjson

log = logging.getLogger("container.requests")
FLUSH_SECONDS = 0.05


class AccessLog:
    def __init__(self):
        self._pending: list[tuple] = []
        self._flush = None  # the greenlet that writes the pending lines
        atexit.register(self.flush)

    def record(self, request, status: int, started: float) -> None:
        """`request`: pipeline.Request, answered with `status`; `started`: its perf_counter at arrival."""
        if not log.isEnabledFor(logging.INFO):
            return
        self._pending.append((time.time(), request.method, request.path, request.model, status,
                              time.perf_counter() - started, request.request_id,
                              request.headers.get("x-amzn-sagemaker-target-model")))
        if self._flush is None:
            self._flush = gevent.spawn_later(FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        self._flush, pending, self._pending = None, self._pending, []
        if pending:
            sys.stderr.write("".join(map(_line, pending)))
            sys.stderr.flush()


def _line(entry: tuple) -> str:
    at, method, path, model, status, seconds, request_id, target_model = entry
    document = {"time": datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds"), "level": "INFO",
                "logger": log.name, "message": "request", "method": method, "path": path, "model": model,
                "status": status, "duration_ms": round(seconds * 1000, 3), "request_id": request_id}
    if target_model is not None:
        document["target_model"] = target_model
    return orjson.dumps(document).decode() + "\n"


ACCESS_LOG = AccessLog()  # one per process: its lines go to the one stderr
