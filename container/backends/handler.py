"""SageMaker PyTorch layout: weights at the top and an optional `code/inference.py` holding the handler
functions users already write for SageMaker. What the script leaves out behaves as SageMaker's PyTorch
toolkit does (`handler_defaults.py`). This runs inside the model's own worker process
(`handler_worker.py`), so the script is imported under its own name, as the toolkit imports it."""

import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import torch
from sagemaker_inference.errors import BaseInferenceToolkitError

from container import content
from container.backends import handler_defaults
from container.backends.handler_context import Context
from container.backends.torch_runtime import device_error, forward_failed
from container.errors import (
    HandlerError,
    InvalidModel,
    ModelError,
    ServeError,
)
from container.logs import user_code_failed

# Each function's arguments without the optional trailing `context`.
ARITY = {"pre_model_fn": 1, "model_fn": 1, "model_warmup_fn": 2, "input_fn": 2, "predict_fn": 2, "output_fn": 2,
         "transform_fn": 4}


@dataclass
class HandlerResponse:
    body: bytes
    content_type: str
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


class HandlerModel:
    def __init__(self, name: str, directory: Path, program: str, device: str, default_accept: str = content.JSON):
        self.name, self.device, self.default_accept = name, device, default_accept
        self.context = Context(name, str(directory), device)
        self.functions = _import_handlers(name, directory / "code" / program)
        if "transform_fn" in self.functions and self.functions.keys() & {"input_fn", "predict_fn", "output_fn"}:
            raise InvalidModel(f"{program} defines transform_fn together with input_fn/predict_fn/output_fn; keep one style")
        if "pre_model_fn" in self.functions:
            self._call("pre_model_fn", str(directory))
        if "model_fn" in self.functions:
            self.model = self._call("model_fn", str(directory))
        else:
            self.model = self._guard("model_fn", handler_defaults.load_model, directory, device)
        if "model_warmup_fn" in self.functions:
            self._call("model_warmup_fn", str(directory), self.model)

    def transform(self, body: bytes, content_type: str | None, accept: str | None, headers: dict[str, str],
                  request_id: str | None = None) -> HandlerResponse:
        """One request through the handler chain. `content_type` is None when the request has none."""
        self.context.start(request_id, headers)
        user_accept = content.preferred(accept, self.default_accept)
        if "transform_fn" in self.functions:
            result = self._call("transform_fn", self.model, _sagemaker_body(body, content_type), content_type, user_accept)
            return self._respond(*handler_defaults.as_response(result, user_accept))
        envelope = None
        if "input_fn" in self.functions:
            decoded = self._call("input_fn", _sagemaker_body(body, content_type), content_type)
        else:
            decoded, envelope = handler_defaults.decode(body, content_type, self.device)
        if "predict_fn" in self.functions:
            prediction = self._call("predict_fn", decoded, self.model)
        else:
            prediction = self._guard("predict_fn", handler_defaults.predict, decoded, self.model, self.device)
        if "output_fn" in self.functions:
            return self._respond(*handler_defaults.as_response(self._call("output_fn", prediction, user_accept), user_accept))
        response_type = content.negotiate(accept, default=self.default_accept)
        return self._respond(handler_defaults.encode(prediction, response_type, envelope), response_type)

    def device_bytes(self) -> dict[str, int]:
        """The most this process has held on its GPU (torch's peak reservation, activations included);
        its host memory is measured from outside."""
        if not self.device.startswith("cuda"):
            return {}
        return {self.device: torch.cuda.max_memory_reserved(self.device)}

    def _respond(self, body: bytes, content_type: str) -> HandlerResponse:
        response = self.context.response
        return HandlerResponse(body, response.content_type or content_type, response.status, response.headers)

    def _call(self, fn_name: str, *args):
        """A user function, with the context appended when it takes one more argument."""
        fn = self.functions[fn_name]
        if _parameters(fn) == ARITY[fn_name] + 1:
            args = (*args, self.context)
        return self._guard(fn_name, fn, *args)

    def _guard(self, fn_name: str, fn, *args):
        """Errors of user code (and of the defaults it relies on) as the answers they deserve; a device
        failure is raised after the except block, which would keep the failed call's tensors alive."""
        try:
            return fn(*args)
        except ServeError:
            raise
        except Exception as exc:
            failure = device_error(exc, self.device, f"in {fn_name} of '{self.name}'")
            if failure is None:
                raise self._user_error(fn_name, fn, exc) from None
        raise failure

    def _user_error(self, fn_name: str, fn, exc: Exception) -> ServeError:
        """The answer to what user code raised; anything but the client error it chose to answer is logged."""
        status = getattr(exc, "status_code", None)
        if isinstance(exc, BaseInferenceToolkitError) and isinstance(status, int) and 400 <= status < 600:
            if status >= 500:
                user_code_failed(self.name, fn_name, exc)
            return HandlerError(str(getattr(exc, "message", exc)), status)
        if fn is handler_defaults.predict:  # the model's forward raised
            return forward_failed(self.name, exc)
        user_code_failed(self.name, fn_name, exc)
        return ModelError(f"{fn_name} of model '{self.name}' raised {type(exc).__name__}: {exc}")


def _import_handlers(name: str, path: Path) -> dict:
    """The handler functions of the script, imported by its module name as the toolkit imports it
    (its `code/` directory is on sys.path); no script means every default."""
    if not path.is_file():
        return {}
    try:
        module = importlib.import_module(path.stem)
    except Exception as exc:
        user_code_failed(name, f"importing code/{path.name}", exc)
        raise InvalidModel(f"code/{path.name} failed to import: {type(exc).__name__}: {exc}") from None
    if Path(getattr(module, "__file__", "") or "").resolve() != path.resolve():
        raise InvalidModel(f"code/{path.name} is shadowed by an installed module of the same name ({module.__name__}); rename it")
    functions = {n: getattr(module, n) for n in ARITY if callable(getattr(module, n, None))}
    for fn_name, fn in functions.items():
        expected, given = ARITY[fn_name], _parameters(fn)
        if given is not None and given not in (expected, expected + 1):
            raise InvalidModel(f"{fn_name} must take {expected} argument(s), or {expected + 1} with context: "
                               f"{fn_name}{inspect.signature(fn)}")
    return functions


def _parameters(fn) -> int | None:
    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return None


def _sagemaker_body(body: bytes, content_type: str | None) -> str | bytearray:
    """The body as SageMaker's container hands it to user code: JSON and CSV decoded (the toolkit's doing),
    anything else a bytearray, as TorchServe's worker reads it off its socket. A bytearray is writable:
    `np.frombuffer(body, …)` there gives an array the script may change in place, and torch.frombuffer
    shares it without a warning; over bytes both are read-only."""
    return handler_defaults.text(body) if content_type in content.TEXT_TYPES else bytearray(body)
