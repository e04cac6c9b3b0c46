"""Media types the SageMaker-style APIs speak: JSON, CSV and NPY bodies ↔ numpy arrays, and Accept
negotiation. Used by the `/invocations` front-end and by the default handlers of SageMaker-layout models."""

import io

import numpy as np
import orjson

from container.errors import InvalidRequest, NotAcceptable

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
SUPPORTED = (JSON, CSV, NPY)
TEXT_TYPES = (JSON, CSV)  # decoded to str before a user's input_fn sees them, as SageMaker's toolkit does


def media_type(header: str | None, default: str = JSON) -> str:
    """`application/json; charset=utf-8` → `application/json`; none → `default`."""
    if not header:
        return default
    return header.split(";", 1)[0].strip().lower() or default


def negotiate(accept: str | None, supported=SUPPORTED) -> str:
    """The first entry of Accept that is supported; none or `*/*` means JSON."""
    if not accept:
        return JSON
    entries = [media_type(part) for part in accept.split(",")]
    for entry in entries:
        if entry in ("*/*", "application/*"):
            return JSON
        if entry in supported:
            return entry
    raise NotAcceptable(f"cannot answer with {accept!r}: supported response types are {', '.join(supported)}")


def parse_json(body: bytes):
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"malformed JSON body: {exc}") from None


def parse_object(body: bytes, what: str = "the request body") -> dict:
    """A JSON object, or {} for an empty body (tritonclient sends some requests with none)."""
    document = parse_json(body) if body.strip() else {}
    if not isinstance(document, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return document


def decode_csv(body: bytes, dtype=np.float32) -> np.ndarray:
    try:
        return np.loadtxt(io.StringIO(body.decode()), delimiter=",", dtype=dtype, ndmin=2)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"malformed CSV body (expected rows of numbers): {exc}") from None


def decode_npy(body: bytes) -> np.ndarray:
    try:
        return np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InvalidRequest(f"malformed NPY body (object arrays are refused): {exc}") from None


def encode_json(value) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY, default=_jsonable)


def _jsonable(value):
    if isinstance(value, np.ndarray):  # dtypes orjson cannot take natively (float16, object)
        return [_jsonable(v) for v in value] if value.dtype == object else value.tolist()
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_csv(array: np.ndarray) -> bytes:
    array = np.asarray(array)
    if array.ndim > 2:
        raise NotAcceptable(f"text/csv holds at most 2 dimensions; the output has shape {list(array.shape)}")
    out = io.StringIO()
    np.savetxt(out, np.atleast_2d(array) if array.ndim else array.reshape(1, 1), delimiter=",", fmt="%s")
    return out.getvalue().encode()


def encode_npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, np.asarray(array), allow_pickle=False)
    return out.getvalue()


def encode_array(array: np.ndarray, accept: str) -> bytes:
    if accept == CSV:
        return encode_csv(array)
    if accept == NPY:
        return encode_npy(array)
    return encode_json(array)
