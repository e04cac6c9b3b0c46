"""SageMaker invoke bodies for tensor models: JSON/CSV/NPY ↔ the model's named input and output tensors.

JSON forms: `{"instances": rows}` → `{"predictions": …}`, `{"inputs": tensor or {name: tensor}}` →
`{"outputs": …}`, a bare array → a bare array. Rows may be objects keyed by input name. A model with
several outputs answers an object keyed by output name.
"""

import numpy as np

from container import content
from container.errors import (
    InvalidInput,
    InvalidRequest,
    NotAcceptable,
    UnsupportedMediaType,
)
from container.models.signature import Signature
from container.tensors import as_datatype, numpy_dtype

_ENVELOPES = {"instances": "predictions", "inputs": "outputs"}


def decode(body: bytes, media_type: str, signature: Signature) -> tuple[dict[str, np.ndarray], str | None]:
    """The request's input tensors and the JSON envelope the answer goes in (None for a bare answer)."""
    if media_type == content.JSON:
        return _decode_json(content.parse_json(body), signature)
    if media_type == content.CSV:
        spec = _only_input(signature)
        dtype = numpy_dtype(spec.datatype)
        if dtype == object:
            raise InvalidInput(f"input '{spec.name}' is BYTES; send it as JSON strings, not CSV")
        rows = content.decode_csv(body, dtype)
        if len(spec.shape) == 1 and 1 in rows.shape:  # a vector input: one row or one column of values is it
            rows = rows.reshape(-1)
        return {spec.name: rows}, None
    if media_type == content.NPY:
        spec = _only_input(signature)
        return {spec.name: as_datatype(spec.name, content.decode_npy(body), spec.datatype)}, None
    raise UnsupportedMediaType(f"Content-Type {media_type!r} is not supported; send one of {', '.join(content.SUPPORTED)}")


def encode(outputs: dict[str, np.ndarray], response_type: str, envelope: str | None) -> bytes:
    if response_type == content.JSON:
        value = next(iter(outputs.values())) if len(outputs) == 1 else outputs
        return content.encode_json({envelope: value} if envelope else value)
    if len(outputs) != 1:
        raise NotAcceptable(f"the model has {len(outputs)} outputs; only application/json carries several")
    return content.encode_array(next(iter(outputs.values())), response_type)


def _decode_json(value, signature: Signature):
    envelope = None
    if isinstance(value, dict):
        key = next((k for k in _ENVELOPES if k in value), None)
        if key is None:
            raise InvalidRequest('a JSON object body must hold "instances" or "inputs"')
        value, envelope = value[key], _ENVELOPES[key]
        if key == "instances" and isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            value = _columns(value)
    if isinstance(value, dict):
        return {name: as_datatype(name, v, signature.input(name).datatype) for name, v in value.items()}, envelope
    spec = _only_input(signature)
    return {spec.name: as_datatype(spec.name, value, spec.datatype)}, envelope


def _columns(rows: list[dict]) -> dict[str, list]:
    names = list(rows[0])
    if any(list(r) != names for r in rows):
        raise InvalidRequest("every instance must name the same inputs")
    return {n: [r[n] for r in rows] for n in names}


def _only_input(signature: Signature):
    spec = signature.sole_input()
    if spec is None:
        names = [s.name for s in signature.inputs]
        raise InvalidInput(f'the model takes {len(names)} inputs {names}: send {{"inputs": {{name: value, …}}}} as JSON')
    return spec
