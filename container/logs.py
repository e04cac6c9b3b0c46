"""Logs as JSON lines: time, level, logger, message, the record's `fields`, and any traceback — one
object a line, for CloudWatch, Loki and jq alike. gunicorn's own lines (start, workers, signals) and
the exceptions Python and gevent would only print ("Exception ignored in …" during interpreter
shutdown, a greenlet that died) are written the same way, so every line on stderr parses."""

import logging
import sys
from datetime import datetime, timezone

import gevent
import orjson
from gunicorn import glogging

from container.errors import ServeError

# The messages only a fault of the server's own logs (an error nobody answered, or one answered as
# "internal"), whatever the model code did: worth an alert; the tests and the chaos bench fail on them.
SERVER_FAULTS = ("a greenlet failed", "unexpected error", "channel call failed", "channel answer could not be packed",
                 "gRPC call failed", "gRPC stream request failed", "a worker process ended with an error")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            document["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(document, default=str).decode()


def configure_logging(level: str, hub: bool = True) -> None:
    """`hub`: the process runs gevent (the model process), whose failed greenlets are logged here too."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    sys.unraisablehook = _unraisable
    if hub:
        gevent.get_hub().print_exception = _greenlet_failed


def _greenlet_failed(context, kind, value, traceback) -> None:
    """A greenlet that died of an exception: gevent would print it as plain text. What a thread-pool task
    raised (gevent names the task as (thread, function)) reaches the caller of `apply`, which answers or
    logs it, and so does a client's mistake anywhere: no ERROR and no traceback for them here (model code
    that failed says so where it ran: `user_code_failed`)."""
    if isinstance(context, tuple) or (isinstance(value, ServeError) and value.status < 500):
        logging.getLogger("gevent").debug("a task's error reached its caller", extra={"fields": {"error": repr(value)}})
        return
    logging.getLogger("gevent").error("a greenlet failed", exc_info=(kind, value, traceback),
                                      extra={"fields": {"greenlet": repr(context)[:300]}})


def user_code_failed(model: str, doing: str, exc: BaseException) -> None:
    """Code the operator deployed raised (a handler, a python model, a TorchScript or exported program's
    forward), where it ran: its traceback, which the client never sees (its answer names the error), to
    the log once, whatever the protocol and however many requests the call served."""
    _user_code.error("model code raised", exc_info=exc, extra={"fields": {"model": model, "in": doing}})


_user_code = logging.getLogger("container.user_code")


class GunicornLogger(glogging.Logger):
    """gunicorn's error log in the same JSON lines (its access log stays off: the request log is ours)."""

    def setup(self, cfg):
        super().setup(cfg)
        for handler in self.error_log.handlers:
            handler.setFormatter(JsonFormatter())


def _unraisable(unraisable, dumps=orjson.dumps, stderr=sys.stderr, now=datetime.now, utc=timezone.utc,
                finalizing=sys.is_finalizing) -> None:
    """An exception Python cannot raise, as a JSON line; while the interpreter shuts down (modules
    half torn down then) it is only a DEBUG line. It may run with module globals
    gone: everything it needs is bound as a default argument."""
    level = "DEBUG" if finalizing() else "WARNING"
    document = {"time": now(utc).isoformat(timespec="milliseconds"), "level": level, "logger": "python",
                "message": f"exception ignored in {unraisable.object!r}",
                "error": f"{type(unraisable.exc_value).__name__}: {unraisable.exc_value}"}
    stderr.write(dumps(document).decode() + "\n")
