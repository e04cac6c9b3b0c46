"""The handler functions a SageMaker-layout model leaves out, as SageMaker's PyTorch toolkit
(`sagemaker-pytorch-inference` 2.0 over `sagemaker-inference` 1.10) defines them, and the way its model
server turns what a handler returns into a response body. Where this differs, it is on purpose:
NPY answers keep the tensor's dtype, NPY bodies are never unpickled, and client mistakes are 4xx."""

import io
import json
from pathlib import Path

import numpy as np
import torch

from container import content
from container.backends.torch_runtime import load_torchscript
from container.errors import InvalidModel, InvalidRequest, ModelError, NotAcceptable, UnsupportedMediaType

MODEL_SUFFIXES = (".pt", ".pth", ".pt2")
_ENVELOPES = {"instances": "predictions", "inputs": "outputs"}


def model_file(directory: Path) -> Path:
    """`model.pt`, else `model.pt2`, else the one `*.pt`/`*.pth`/`*.pt2` at the top of the model directory."""
    for name in ("model.pt", "model.pt2"):
        if (directory / name).is_file():
            return directory / name
    candidates = sorted(p.name for p in directory.iterdir() if p.suffix in MODEL_SUFFIXES and p.is_file())
    if len(candidates) != 1:
        raise InvalidModel(f"the default model_fn needs exactly one .pt, .pth or .pt2 file in the model directory, found "
                           f"{candidates}; or define model_fn in code/inference.py")
    return directory / candidates[0]


def load_model(directory: Path, device: str):
    """TorchScript, or a `.pt2` (an AOTInductor package or an ExportedProgram) as the function its
    forward was."""
    path = model_file(directory)
    if path.suffix == ".pt2":
        from container.backends.pt2 import callable_program

        return callable_program(path, device)
    return load_torchscript(path, device)


def decode(body, content_type: str | None, device: str):
    """The request as a tensor: JSON and CSV as float32, NPY in its own dtype. A JSON object with
    "instances" or "inputs" is unwrapped, and the answer wrapped to match (the toolkit has no envelope)."""
    envelope = None
    if content_type == content.JSON:
        value = _json(body)
        if isinstance(value, dict):
            key = next((k for k in _ENVELOPES if k in value), None)
            if key is None:
                raise InvalidRequest('a JSON object body must hold "instances" or "inputs"')
            value, envelope = value[key], _ENVELOPES[key]
        tensor = _float_tensor(value)
    elif content_type == content.CSV:
        tensor = _float_tensor(_csv(body))
    elif content_type == content.NPY:
        array = content.decode_npy(body)
        if array.dtype.kind not in "biuf":
            raise UnsupportedMediaType(f"NPY arrays of dtype {array.dtype} have no tensor type; send numbers or booleans")
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    else:
        raise UnsupportedMediaType(f"Content-Type {content_type!r} is not supported by the default input_fn; send one of "
                                   f"{', '.join(content.SUPPORTED)}, or define input_fn in code/inference.py")
    return tensor.to(device), envelope


def predict(data, model, device: str):
    """The model in eval mode without autograd, as the toolkit runs it. Not inference_mode: its
    tensors could not be changed in place by a user's output_fn afterwards."""
    with torch.no_grad():
        if isinstance(model, torch.nn.Module):
            model.eval()
        return model(data.to(device) if isinstance(data, torch.Tensor) else data)


def encode(prediction, accept: str, envelope: str | None) -> bytes:
    """JSON and CSV of the prediction as the toolkit writes them (Python floats, `NaN` tokens, one
    value per line for a 1-D CSV); NPY in the tensor's own dtype."""
    if accept == content.NPY:
        return content.encode_npy(_array(prediction))
    value = prediction.detach().cpu().numpy().tolist() if type(prediction) is torch.Tensor else prediction
    if accept == content.CSV:
        return _csv_text(value).encode()
    return _json_text({envelope: value} if envelope else value).encode()


def as_response(result, content_type: str) -> tuple[bytes, str]:
    """What a user's output_fn or transform_fn returned, as TorchServe sends it: a `(body, type)` tuple
    names its type; str is UTF-8, bytes go as they are, a tensor as `torch.save` writes it, anything
    else as indented JSON."""
    if isinstance(result, tuple) and len(result) == 2:
        result, content_type = result
    if isinstance(result, str):
        return result.encode(), content_type
    if isinstance(result, (bytes, bytearray, memoryview)):
        return bytes(result), content_type
    if isinstance(result, torch.Tensor):
        buffer = io.BytesIO()
        torch.save(result, buffer)
        return buffer.getvalue(), content_type
    try:
        return json.dumps(result, indent=2).encode(), content_type
    except (TypeError, ValueError) as exc:
        raise ModelError(f"the handler returned {type(result).__name__}, which has no response body: {exc}; "
                         f"return bytes, str or JSON-serialisable values") from None


def text(body) -> str:
    if isinstance(body, str):
        return body
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise InvalidRequest("the body is not UTF-8 text, as its Content-Type says") from None


def _json(body):
    try:
        return json.loads(text(body))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidRequest(f"malformed JSON body: {exc}") from None


def _csv(body) -> np.ndarray:
    source = text(body)
    try:
        values = np.genfromtxt(io.StringIO(source), delimiter=",")
    except ValueError as exc:
        raise InvalidRequest(f"malformed CSV body (expected rows of numbers): {exc}") from None
    if np.isnan(values).any():  # genfromtxt reads a header or a word as NaN: never predict on made-up numbers
        _check_numbers(source)
    return values


def _check_numbers(source: str) -> None:
    """A 400 naming the first cell that is not a number (`nan` written out is one)."""
    for row, line in enumerate(source.splitlines(), 1):
        if not line.strip():
            continue
        for column, cell in enumerate(line.split(","), 1):
            try:
                float(cell)
            except ValueError:
                raise InvalidRequest(f"CSV row {row}, column {column}: {cell.strip()[:40]!r} is not a number; send "
                                     f"rows of numbers without a header") from None


def _float_tensor(value) -> torch.Tensor:
    try:
        return torch.as_tensor(np.asarray(value, dtype=np.float32))
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"the body must hold numbers in a rectangular array: {exc}") from None


def _array(prediction) -> np.ndarray:
    if isinstance(prediction, torch.Tensor):
        prediction = prediction.detach().cpu()
        return (prediction.float() if prediction.dtype == torch.bfloat16 else prediction).numpy()
    return np.asarray(prediction)


def _json_text(value) -> str:
    return json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else _unserialisable(v))


def _unserialisable(value):
    raise ModelError(f"the prediction holds {type(value).__name__}, which JSON cannot carry; define output_fn")


def _csv_text(value) -> str:
    array = np.asarray(value)
    if array.ndim > 2 or array.dtype == object:
        raise NotAcceptable(f"text/csv holds numbers in at most 2 dimensions; the prediction has shape {list(array.shape)}")
    out = io.StringIO()
    np.savetxt(out, array.reshape(1) if array.ndim == 0 else value, delimiter=",", fmt="%s")
    return out.getvalue()
