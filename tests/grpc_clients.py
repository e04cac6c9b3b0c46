"""tritonclient's gRPC clients, with a deadline on every call and stream that does not give its own:
tritonclient gives none by default, so a server that never answered would hold a test for ever (its
HTTP client, and KServe's, default to 60 s, as `Server.request` does)."""

import functools
import inspect

import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_aio

DEADLINE = 60  # seconds
_DEADLINES = ("client_timeout", "stream_timeout")  # a call's; a stream's, for as long as it lives


def _deadlined(client_class: type) -> type:
    """A subclass of `client_class` whose public methods default their deadline to DEADLINE."""
    methods = {}
    for name, method in inspect.getmembers(client_class, inspect.isfunction):
        parameters = list(inspect.signature(method).parameters)
        deadline = next((key for key in _DEADLINES if key in parameters), None)
        if deadline and not name.startswith("_"):
            methods[name] = _defaulting(method, deadline, parameters.index(deadline))
    if "infer" not in methods:  # a tritonclient that named its deadline otherwise: fail here, not hang in a test
        raise TypeError(f"{client_class.__module__}.{client_class.__name__}.infer takes none of {_DEADLINES}")
    return type(client_class.__name__, (client_class,), methods)


def _defaulting(method, deadline: str, position: int):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if deadline not in kwargs and len(args) < position:  # (`position` counts self)
            kwargs[deadline] = DEADLINE
        return method(self, *args, **kwargs)
    return call


InferenceServerClient = _deadlined(triton_grpc.InferenceServerClient)
AsyncInferenceServerClient = _deadlined(triton_aio.InferenceServerClient)
