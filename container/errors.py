"""The one exception hierarchy. Every class owns its HTTP status; front-ends render `{"error": str(exc)}`.

ServeError (500)
├── InvalidRequest (400)                a client mistake: body, shape, dtype, name, url
│   ├── InvalidInput (400)              an input tensor that does not match the model
│   └── InvalidModel (400)              model files or config that cannot be served
├── Forbidden (403)                     not this caller's to ask: a restricted API, model files, an S3 url
│                                       outside the allowed roots; or the model's storage (S3) refused access
├── ModelNotFound (404)                 no such model is loaded (or no such version)
├── RegionNotFound (404)                no shared-memory region of that name is registered
├── SourceNotFound (404)                the url to load from does not exist
├── ModelConflict (409)                 the name is already loaded or loading
├── RequestTimeout (408)                the request head or body arrived too slowly (the HTTP worker's)
├── PayloadTooLarge (413)
├── UriTooLong (414)                    the request line is past gunicorn's limit (the HTTP worker's)
├── HeadersTooLarge (431)               too many header fields, or a field or the head too large
├── UnsupportedMediaType (415)
├── NotAcceptable (406)
├── Unavailable (503)                   a server state: not ready, shutting down (has Retry-After)
│   ├── QueueFull (503)                 a request found its priority level's queue full: refused as it came
│   └── QueueTimeout (503)              a request waited out its queue timeout, or for a sequence slot
├── Cancelled (499)                    the client cancelled the request, or its gRPC stream ended: nobody hears
│                                       the answer (gRPC's CANCELLED; 499 as nginx logs a client that left)
├── Unsupported (501)                   a feature this server does not have (gRPC's UNIMPLEMENTED)
├── InsufficientStorage (507)           a download does not fit the disk budget, even after eviction; a disk is full
├── InsufficientMemory (507)            the model does not fit, even after eviction
│   └── DeviceOutOfMemory (507)         a device ran out of memory; the scheduler frees room, retries, splits
├── ModelError (500)                    user code (model_fn, predict_fn, forward) raised, or its worker died
│   ├── WorkerLost (500)                its worker died or hung (and was killed): the code did not finish
│   └── DeviceFault (500)               a sticky CUDA error: the device is unusable until the process restarts
└── HandlerError (any)                  user code chose the status (SageMaker's BaseInferenceToolkitError)
"""

import errno


class ServeError(Exception):
    status = 500
    headers: dict[str, str] = {}

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidRequest(ServeError):
    status = 400


class InvalidInput(InvalidRequest):
    pass


class InvalidModel(InvalidRequest):
    pass


class Forbidden(ServeError):
    status = 403


class ModelNotFound(ServeError):
    status = 404


class RegionNotFound(ServeError):
    status = 404


class SourceNotFound(ServeError):
    status = 404


class ServiceNotFound(ServeError):  # a gRPC health check's service
    status = 404


class ModelConflict(ServeError):
    status = 409


class NotAcceptable(ServeError):
    status = 406


class RequestTimeout(ServeError):
    status = 408


class PayloadTooLarge(ServeError):
    status = 413


class UriTooLong(ServeError):
    status = 414


class HeadersTooLarge(ServeError):
    status = 431


class UnsupportedMediaType(ServeError):
    status = 415


class Unavailable(ServeError):
    status = 503
    headers = {"Retry-After": "1"}


class QueueFull(Unavailable):
    pass


class QueueTimeout(Unavailable):
    pass


class Cancelled(ServeError):
    status = 499

    def __init__(self, message: str = "the request was cancelled: its client went away before it ran"):
        super().__init__(message)


class Unsupported(ServeError):
    status = 501


class InsufficientMemory(ServeError):
    status = 507


class InsufficientStorage(ServeError):
    status = 507


class ModelError(ServeError):
    status = 500


class WorkerLost(ModelError):
    """A worker process died or did not answer in time: what it ran did not finish, so no execution
    is counted for it (as Triton counts none when a python model's stub dies)."""


class DeviceOutOfMemory(InsufficientMemory):
    """A device ran out of memory during a load or an execution. `requested`: the bytes of the allocation
    that failed, when the allocator said (0: unknown)."""

    def __init__(self, message: str, device: str, requested: int = 0):
        super().__init__(message)
        self.device = device
        self.requested = requested


class DeviceFault(ModelError):
    """A CUDA error that poisons the process's context (an illegal address, a device-side assert): every
    later call on the device fails too, so the worker process must be replaced."""


class HandlerError(ServeError):
    """A SageMaker handler raised the toolkit's own error, which carries the status to answer."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # the disk, a quota, the process's file size limit


def no_room(exc: OSError, what: str) -> InsufficientStorage | None:
    """A 507 when a write of `what` failed for want of room, in words that name no path of the server's;
    None when it failed otherwise."""
    if exc.errno not in _NO_ROOM:
        return None
    return InsufficientStorage(f"no room to write {what}: {exc.strerror}; free the server's disk or give it more")


def forget_frames(error: ServeError) -> None:
    """An error that is a request's answer lets go of the frames it was raised through, and so do the errors
    it came from (user code's has been logged where it ran): those frames hold the request's job, which
    holds its error, a cycle that only the garbage collector would free, with the request's tensors."""
    chain, seen = [error], set()
    while chain:
        error = chain.pop()
        if error is not None and id(error) not in seen:
            seen.add(id(error))
            error.__traceback__ = None
            chain += error.__cause__, error.__context__
