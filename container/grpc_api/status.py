"""The one translation of the error tree (errors.py) to gRPC status codes, as Triton maps its own, and
the restricted API groups (SERVE_RESTRICTED_API) checked against a call's metadata."""

import asyncio
import functools
import logging
import time

import grpc

from container.errors import Forbidden, InvalidRequest, ServeError
from container.grpc_api.services import Malformed
from container.request_log import AccessLog
from container.settings import Restriction

log = logging.getLogger(__name__)

_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 403: grpc.StatusCode.PERMISSION_DENIED,
          404: grpc.StatusCode.NOT_FOUND, 406: grpc.StatusCode.INVALID_ARGUMENT, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
          409: grpc.StatusCode.ALREADY_EXISTS, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
          415: grpc.StatusCode.INVALID_ARGUMENT, 499: grpc.StatusCode.CANCELLED, 501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE,
          507: grpc.StatusCode.RESOURCE_EXHAUSTED}


def code_of(exc: ServeError) -> grpc.StatusCode:
    if exc.status in _CODES:
        return _CODES[exc.status]
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= exc.status < 500 else grpc.StatusCode.INTERNAL


def answered(group: str):
    """A unary RPC of API `group` of the servicer's `SERVICE`: refused without the restricted group's
    metadata, or when its request did not parse; its ServeError becomes the call's status and message
    (never a traceback); anything else is a bug, logged. Each call has its line in the access log, its
    status as HTTP would have answered (the status table maps it to gRPC's codes)."""
    def decorate(method):
        @functools.wraps(method)
        async def serve(self, request, context):
            started, status = time.perf_counter(), 200
            try:
                check_restricted(self.restrictions, group, context)
                if isinstance(request, Malformed):
                    raise InvalidRequest(request.why)
                return await method(self, request, context)
            except ServeError as exc:
                status = exc.status
                return set_error(context, code_of(exc), str(exc))
            except asyncio.CancelledError:  # the client went away, or its deadline passed
                status = 499
                raise
            except Exception:
                status = 500
                log.exception("gRPC call failed", extra={"fields": {"method": method.__name__}})
                return set_error(context, grpc.StatusCode.INTERNAL, "internal error; see the server's log")
            finally:
                logged(f"/{self.SERVICE}/{method.__name__}", request, status, started, context)
        return serve
    return decorate


def set_error(context, code: grpc.StatusCode, details: str) -> None:
    """The call's status, set rather than raised (`context.abort`): an AbortError raised while an error is
    handled holds it, and grpcio keeps the AbortError in a reference cycle with the call's frames, which
    held the call's request (~50 objects a failed call left to the garbage collector, measured)."""
    context.set_code(code)
    context.set_details(details)


def logged(path: str, request, status: int, started: float, context=None) -> None:
    """The access log's line for a gRPC request: the model its message names, and its id: the client's
    `x-request-id` metadata, else the request's own `id`."""
    if not ACCESS_LOG.enabled():
        return
    model = next((value for field in _MODEL_FIELDS if (value := getattr(request, field, ""))), None)
    request_id = dict(context.invocation_metadata() or ()).get("x-request-id") if context is not None else None
    ACCESS_LOG.record("gRPC", path, model, status, started, request_id or getattr(request, "id", None) or None)


_MODEL_FIELDS = ("model_name", "name", "modelId")  # where V2's, the repository's and ModelMesh's messages name it
ACCESS_LOG = AccessLog(lambda seconds, function: asyncio.get_running_loop().call_later(seconds, function))


def check_restricted(restrictions: tuple[Restriction, ...], group: str, context) -> None:
    """SERVE_RESTRICTED_API over gRPC: the header is a metadata key, bare or as Triton's
    --grpc-restricted-protocol names it (`triton-grpc-protocol-<header>`), so that Triton's clients pass too."""
    for restriction in restrictions:
        if group in restriction.groups:
            metadata = dict(context.invocation_metadata() or ())
            restriction.check(metadata.get(restriction.header, metadata.get(_TRITON_PREFIX + restriction.header)))


def refused(restrictions: tuple[Restriction, ...], group: str, context) -> bool:
    """Whether a streaming call is refused for want of its restricted group's metadata, its status then set."""
    try:
        check_restricted(restrictions, group, context)
    except Forbidden as exc:
        set_error(context, code_of(exc), str(exc))
        return True
    return False


_TRITON_PREFIX = "triton-grpc-protocol-"
