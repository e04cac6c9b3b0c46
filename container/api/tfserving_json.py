"""TF Serving's JSON dialect: `NaN`/`Infinity` as bare tokens both ways, `{"b64": …}` for binary
strings, float32 written at float32 precision, and TF Serving's layout of its documents."""

import base64
import binascii
import json
import math

import numpy as np
import orjson

from container.api.routing import Mount
from container.errors import InvalidRequest
from container.limits import MAX_DIMS, too_deep

_TOKENS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def parse(body: bytes):
    """orjson first; the standard library only for documents holding NaN or Infinity tokens."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        try:
            return json.loads(body)
        except (ValueError, RecursionError):  # the orjson message is the more precise one
            raise InvalidRequest(f"JSON Parse error: {exc}") from None


def decode_b64(value, name: str, depth: int = 0):
    """Nested request values with every `{"b64": "…"}` object replaced by its bytes. Lists nest no
    deeper than a tensor has dimensions, so a hostile document cannot exhaust the stack."""
    if isinstance(value, list):
        if depth >= MAX_DIMS:
            raise InvalidRequest(too_deep(name))
        return [decode_b64(v, name, depth + 1) for v in value]
    if isinstance(value, dict):
        if set(value) != {"b64"} or not isinstance(value["b64"], str):
            raise InvalidRequest(f'input \'{name}\': objects in tensor values must be {{"b64": "<base64>"}}')
        try:
            return base64.b64decode(value["b64"], validate=True)
        except binascii.Error as exc:
            raise InvalidRequest(f"input '{name}': invalid base64: {exc}") from None
    return value


def document(fields: dict[str, str]) -> bytes:
    """A predict/classify/regress answer from values already written as JSON text: one top-level key
    a line, each value on its line."""
    lines = [f"    {json.dumps(key)}: {text}" for key, text in fields.items()]
    return ("{\n" + ",\n".join(lines) + "\n}").encode()


def pretty(fields: dict) -> bytes:
    """Status and metadata answers, laid out as protobuf's JSON printer does (one-space indent)."""
    return json.dumps(fields, indent=1).encode()


def error(message: str) -> bytes:
    return f'{{ "error": {json.dumps(message)} }}'.encode()


# TF Serving's prefix: errors in its spelling, and a URL it does not serve (or a method a URL does not
# take) answered as a malformed request. Here, not in tfserving.py, so that an HTTP front-end renders
# its own refusals the same way without the routes and the core behind them.
MOUNT = Mount("/v1/", error, lambda method, path: InvalidRequest(f"Malformed request: {method} {path}"))


def value(v, binary: bool = False) -> str:
    """JSON text of a response value; `binary` writes strings as `{"b64": …}` (outputs named *_bytes)."""
    if isinstance(v, np.ndarray):
        return _array(v, binary)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {value(x, binary)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x, binary) for x in v) + "]"
    return _scalar(v, binary)


def _array(array: np.ndarray, binary: bool) -> str:
    if array.dtype.kind in "biu" or (array.dtype.kind == "f" and np.isfinite(array).all()):
        try:  # numbers without special values: orjson, at the array's own precision
            return orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY).decode().replace(",", ", ")
        except orjson.JSONEncodeError:  # a dtype orjson does not take (float16) or a strided view
            pass
    if array.ndim == 0:
        return _scalar(array[()], binary)
    if array.ndim == 1:
        return "[" + ", ".join(_scalar(item, binary) for item in array) + "]"
    return "[" + ", ".join(_array(row, binary) for row in array) + "]"


def _scalar(v, binary: bool) -> str:
    if isinstance(v, (bytes, np.bytes_)):
        if not binary:
            try:
                return json.dumps(v.decode(), ensure_ascii=False)
            except UnicodeDecodeError:  # not text: only base64 can carry it
                pass
        return f'{{"b64": "{base64.b64encode(v).decode()}"}}'
    if isinstance(v, (float, np.floating)):
        if not math.isfinite(v):
            return _TOKENS[str(float(v))]
        return str(v) if isinstance(v, np.floating) else repr(v)  # numpy prints float32 at its own precision
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return json.dumps(v, ensure_ascii=False)
