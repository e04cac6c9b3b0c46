"""One JSON log line per request — method, path, model, status, duration, request id, SageMaker's target
model — in the same shape as every other log line, from whichever process answers it: an HTTP front-end or
the model process (api/pipeline.py), or a gRPC front-end (grpc_api/status.py). A request only records its
fields; the lines are formatted and written together a moment later, after the responses have gone:
through `logging`, a line costs ~15 µs of a small request's CPU, more than the rest of its logging together."""

import atexit
import logging
import sys
import time
from datetime import datetime, timezone
from typing import Callable

import orjson

log = logging.getLogger("container.requests")
FLUSH_SECONDS = 0.05


class AccessLog:
    def __init__(self, later: Callable[[float, Callable[[], None]], object]):
        """`later(seconds, function)`: how the process's event loop runs `function` a moment later (gevent's
        `spawn_later`, asyncio's `call_later`)."""
        self._later = later
        self._pending: list[tuple] = []
        self._flushing = False  # a flush is due
        atexit.register(self.flush)

    @staticmethod
    def enabled() -> bool:
        return log.isEnabledFor(logging.INFO)

    def record(self, method: str, path: str, model: str | None, status: int, started: float, request_id: str | None,
               target_model: str | None = None) -> None:
        """A request answered with `status`; `started`: its perf_counter at arrival."""
        if not self.enabled():
            return
        self._pending.append((time.time(), method, path, model, status, time.perf_counter() - started, request_id,
                              target_model))
        if not self._flushing:
            self._flushing = True
            self._later(FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        self._flushing, pending, self._pending = False, self._pending, []
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
