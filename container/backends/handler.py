"""SageMaker PyTorch layout: `model.pt` at the top and optional `code/inference.py` with the handler
functions users already write for SageMaker (model_fn, input_fn, predict_fn, output_fn, transform_fn).
Missing functions get the defaults of SageMaker's PyTorch toolkit."""

import importlib.util
import inspect
import itertools
import re
import sys
from pathlib import Path

import numpy as np
import torch
from gevent.monkey import get_original

from container import content
from container.backends.pytorch import (
    is_out_of_memory,
    last_line,
    load_torchscript,
    module_bytes,
)
from container.errors import (
    DeviceOutOfMemory,
    InvalidModel,
    InvalidRequest,
    ModelError,
    NotAcceptable,
    ServeError,
    UnsupportedMediaType,
)

HANDLER_FUNCTIONS = ("model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn")
_ENVELOPES = {"instances": "predictions", "inputs": "outputs"}
_module_ids = itertools.count()
_IDENTIFIER = re.compile(r"\W")
# A real lock: loads run on native threads, where gevent's patched locks must not be used.
_import_lock = get_original("threading", "Lock")()


class HandlerModel:
    def __init__(self, name: str, directory: Path, model_file: Path | None, handler_file: Path | None, device: str):
        self.name = name
        self.device = device
        self.module_name = None
        self.functions = self._import_handlers(handler_file) if handler_file else {}
        try:
            self.model = self._load_model(directory, model_file)
        except BaseException:
            self.close()  # nothing half-loaded stays behind, the imported handler module included
            raise

    def _load_model(self, directory: Path, model_file: Path | None):
        if "transform_fn" in self.functions and self.functions.keys() & {"input_fn", "predict_fn", "output_fn"}:
            raise InvalidModel("inference.py defines transform_fn together with input_fn/predict_fn/output_fn; keep one style")
        if "model_fn" in self.functions:
            return self._call("model_fn", str(directory))
        if model_file:
            return load_torchscript(model_file, self.device)
        raise InvalidModel("code/inference.py has no model_fn and there is no model.pt to load by default")

    def memory(self) -> dict[str, int]:
        """A model_fn may return anything; only torch modules are measured (else the estimate stands)."""
        return module_bytes(self.model) if isinstance(self.model, torch.nn.Module) else {}

    def close(self) -> None:
        self.model = None
        self.functions = {}
        if self.module_name:
            sys.modules.pop(self.module_name, None)

    def transform(self, body: bytes, content_type: str, accept: str | None) -> tuple[bytes, str]:
        """One request through the handler chain; returns the response body and its media type."""
        data = _text(body) if content_type in content.TEXT_TYPES else body
        if "transform_fn" in self.functions:
            response_type = self._user_accept(accept)
            result = self._call("transform_fn", self.model, data, content_type, response_type)
            return _as_response(result, response_type)
        envelope = None
        if "input_fn" in self.functions:
            decoded = self._call("input_fn", data, content_type)
        else:
            decoded, envelope = self._default_input(body, content_type)
        if "predict_fn" in self.functions:
            prediction = self._call("predict_fn", decoded, self.model)
        else:
            prediction = self._default_predict(decoded)
        if "output_fn" in self.functions:
            response_type = self._user_accept(accept)
            return _as_response(self._call("output_fn", prediction, response_type), response_type)
        response_type = content.negotiate(accept)
        return _default_output(prediction, response_type, envelope), response_type

    def _import_handlers(self, path: Path) -> dict:
        """Import inference.py under a name of its own so two models' handlers never collide. Its
        sibling modules (`import helper`) are importable while it loads, then dropped from
        sys.modules so another model's `helper` is its own; one import at a time across loads."""
        self.module_name = f"_model_handler_{next(_module_ids)}_{_IDENTIFIER.sub('_', self.name)}"
        spec = importlib.util.spec_from_file_location(self.module_name, path)
        module = importlib.util.module_from_spec(spec)
        code_dir = str(path.parent)
        with _import_lock:
            before = set(sys.modules)
            sys.modules[self.module_name] = module
            sys.path.insert(0, code_dir)
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                sys.modules.pop(self.module_name, None)
                raise InvalidModel(f"code/inference.py failed to import: {type(exc).__name__}: {exc}") from None
            finally:
                sys.path.remove(code_dir)
                for name in set(sys.modules) - before - {self.module_name}:
                    if (getattr(sys.modules[name], "__file__", None) or "").startswith(code_dir + "/"):
                        del sys.modules[name]
        functions = {n: getattr(module, n) for n in HANDLER_FUNCTIONS if callable(getattr(module, n, None))}
        for fn_name, fn in functions.items():
            _check_arity(fn_name, fn)
        return functions

    def _call(self, fn_name: str, *args):
        try:
            return self.functions[fn_name](*args)
        except ServeError:
            raise
        except Exception as exc:
            if is_out_of_memory(exc):
                raise DeviceOutOfMemory(f"{self.device} ran out of memory in {fn_name} of '{self.name}'", self.device) from exc
            raise ModelError(f"{fn_name} of model '{self.name}' raised {type(exc).__name__}: {exc}") from None

    def _user_accept(self, accept: str | None) -> str:
        """User output functions may speak types we do not: give them the first type asked for."""
        try:
            return content.negotiate(accept)
        except ServeError:
            return content.media_type(accept.split(",", 1)[0])

    def _default_input(self, body: bytes, content_type: str):
        """JSON and CSV become float32 tensors, NPY keeps its dtype (as SageMaker's toolkit does)."""
        envelope = None
        if content_type == content.JSON:
            value = content.parse_json(body)
            if isinstance(value, dict):
                key = next((k for k in _ENVELOPES if k in value), None)
                if key is None:
                    raise InvalidRequest('a JSON object body must hold "instances" or "inputs"')
                value, envelope = value[key], _ENVELOPES[key]
            array = _float_array(value)
        elif content_type == content.CSV:
            array = content.decode_csv(body)
        elif content_type == content.NPY:
            array = content.decode_npy(body)
        else:
            raise UnsupportedMediaType(f"Content-Type {content_type!r} is not supported; send one of {', '.join(content.SUPPORTED)}")
        return torch.from_numpy(np.array(array)).to(self.device), envelope

    def _default_predict(self, data):
        try:
            with torch.inference_mode():
                return self.model(data.to(self.device) if isinstance(data, torch.Tensor) else data)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise DeviceOutOfMemory(f"{self.device} ran out of memory running model '{self.name}'", self.device) from exc
            raise ModelError(f"model '{self.name}' failed: {last_line(exc)}") from None


def _text(body: bytes) -> str:
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise InvalidRequest("the body is not UTF-8 text, as its Content-Type says") from None


def _check_arity(fn_name: str, fn) -> None:
    """Resolve signatures once, at load, so a wrong handler fails there and not on the first request."""
    expected = {"model_fn": 1, "input_fn": 2, "predict_fn": 2, "output_fn": 2, "transform_fn": 4}[fn_name]
    try:
        inspect.signature(fn).bind(*range(expected))
    except TypeError:
        raise InvalidModel(f"{fn_name} must take {expected} argument(s): {fn_name}{inspect.signature(fn)}") from None
    except ValueError:  # builtins without a signature: trust them
        pass


def _float_array(value) -> np.ndarray:
    try:
        return np.asarray(value, dtype=np.float32)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"JSON body must be numbers in a rectangular array: {exc}") from None


def _to_plain(prediction):
    if isinstance(prediction, torch.Tensor):
        prediction = prediction.detach().cpu()
        return (prediction.float() if prediction.dtype == torch.bfloat16 else prediction).numpy()
    if isinstance(prediction, dict):
        return {k: _to_plain(v) for k, v in prediction.items()}
    if isinstance(prediction, (list, tuple)):
        return [_to_plain(v) for v in prediction]
    return prediction


def _default_output(prediction, response_type: str, envelope: str | None) -> bytes:
    value = _to_plain(prediction)
    if response_type == content.JSON:
        return content.encode_json({envelope: value} if envelope else value)
    if not isinstance(value, np.ndarray):
        raise NotAcceptable(f"the model returns {type(prediction).__name__}; only JSON can carry it")
    return content.encode_array(value, response_type)


def _as_response(result, default_type: str) -> tuple[bytes, str]:
    body, response_type = result if isinstance(result, tuple) and len(result) == 2 else (result, default_type)
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise ModelError(f"the handler returned {type(body).__name__}; output_fn must return bytes or str")
    return bytes(body), response_type
