"""The one translation of the error tree (errors.py) to gRPC status codes, as Triton maps its own, and
the restricted API groups (SERVE_RESTRICTED_API) checked against a call's metadata."""

import functools
import logging

import grpc

from container.errors import InvalidRequest, ServeError
from container.grpc_api.services import Malformed
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
    """A unary RPC of API `group`: refused without the restricted group's metadata, or when its request
    did not parse; its ServeError becomes the call's status and message (never a traceback); anything
    else is a bug, logged."""
    def decorate(method):
        @functools.wraps(method)
        async def serve(self, request, context):
            try:
                check_restricted(self.restrictions, group, context)
                if isinstance(request, Malformed):
                    raise InvalidRequest(request.why)
                return await method(self, request, context)
            except ServeError as exc:
                await context.abort(code_of(exc), str(exc))
            except grpc.aio.AbortError:
                raise
            except Exception:
                log.exception("gRPC call failed", extra={"fields": {"method": method.__name__}})
                await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the server's log")
        return serve
    return decorate


def check_restricted(restrictions: tuple[Restriction, ...], group: str, context) -> None:
    """SERVE_RESTRICTED_API over gRPC: the header is a metadata key, as Triton's --grpc-restricted-protocol."""
    for restriction in restrictions:
        if group in restriction.groups:
            restriction.check(dict(context.invocation_metadata() or ()).get(restriction.header))
