"""Media types the SageMaker-style APIs speak: JSON, CSV and NPY bodies ↔ numpy arrays, and Accept
negotiation. Used by the `/invocations` front-end and by the default handlers of SageMaker-layout models."""

import io
import math

import numpy as np
import orjson

from container.errors import InvalidRequest, NotAcceptable
from container.tensors import join_fixed_width

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
SUPPORTED = (JSON, CSV, NPY)
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
TEXT_TYPES = (JSON, CSV)  # decoded to str before a user's input_fn sees them, as SageMaker's toolkit does


def media_type(header: str | None, default: str | None = JSON) -> str | None:
    """`application/json; charset=utf-8` → `application/json`; none → `default`."""
    if not header:
        return default
    return header.split(";", 1)[0].strip().lower() or default


def preferences(accept: str | None) -> tuple[list[str], set[str]]:
    """The media ranges of an Accept header, most preferred first (RFC 9110 §12.5.1: by q-value, then
    the more specific range, then the order written), and the ones refused with q=0."""
    ranked, refused = [], set()
    for position, part in enumerate((accept or "").split(",")):
        name, *parameters = [p.strip() for p in part.split(";")]
        q = 1.0
        for parameter in parameters:
            key, _, value = parameter.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if name and q > 0:
            ranked.append((-q, name.count("*"), position, name.lower()))
        elif name:
            refused.add(name.lower())
    return [name for *_, name in sorted(ranked)], refused


def negotiate(accept: str | None, supported=SUPPORTED, default: str = JSON) -> str:
    """The most preferred supported type; no Accept, or a wildcard reached first, means `default`
    (unless refused)."""
    ranked, refused = preferences(accept)
    for entry in ranked or ["*/*"]:
        if entry in supported:
            return entry
        if entry.endswith("/*"):
            candidates = (t for t in (default, *supported) if t in supported and t not in refused)
            match = next((t for t in candidates if entry == "*/*" or t.startswith(entry[:-1])), None)
            if match:
                return match
    raise NotAcceptable(f"cannot answer with {accept!r}: supported response types are {', '.join(supported)}")


def preferred(accept: str | None, default: str = JSON) -> str:
    """The most preferred concrete type, whatever it is (for user code, which may speak any); `default`
    when Accept is missing or names only wildcards."""
    return next((entry for entry in preferences(accept)[0] if "*" not in entry), default)


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
    if not body.strip():
        raise InvalidRequest("empty CSV body: send rows of numbers")
    try:
        return np.loadtxt(io.StringIO(body.decode()), delimiter=",", dtype=dtype, ndmin=2)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"malformed CSV body (expected rows of numbers): {exc}") from None


def decode_npy(body: bytes) -> np.ndarray:
    """The array, after its header is checked against the body: numpy would allocate the whole shape
    the header claims before it finds the data missing."""
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        if version not in _NPY_HEADERS:
            raise ValueError(f"NPY format version {version} is not supported; write version 1.0 or 2.0")
        shape, _, dtype = _NPY_HEADERS[version](stream)
        if dtype.hasobject:
            raise ValueError("object arrays are refused (they would need unpickling)")
        claimed, present = math.prod(shape) * dtype.itemsize, len(body) - stream.tell()
        if claimed != present:
            raise ValueError(f"the header claims shape {shape} of {dtype} ({claimed} bytes); the body holds {present}")
        stream.seek(0)
        return np.load(stream, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InvalidRequest(f"malformed NPY body: {exc}") from None


def encode_json(value) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY, default=_jsonable)


def _jsonable(value):
    if isinstance(value, np.ndarray):  # dtypes orjson cannot take natively (float16, object, bytes)
        if value.dtype.kind == "S":
            return _json_strings(value)
        return [_jsonable(v) for v in value] if value.dtype == object else value.tolist()
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _json_strings(array: np.ndarray):
    """Fixed-width byte strings (a classification's) as JSON strings: written straight into the answer
    when they are printable ASCII without quotes or backslashes, as a classification's values and
    indices are; else decoded one by one."""
    if array.ndim == 1 and len(array) and array.dtype.itemsize:
        codes = np.ascontiguousarray(array).view(np.uint8).reshape(len(array), -1)
        escaped = codes < 0x20  # in place from here: a 1.5 M-class answer makes tables of tens of MiB
        escaped |= codes >= 0x7F
        escaped |= codes == ord('"')
        escaped |= codes == ord("\\")
        escaped &= np.arange(codes.shape[1]) < np.char.str_len(array)[:, None]  # the padding is no character
        if not escaped.any():
            body = join_fixed_width(array, np.full((len(array), 1), ord('"'), np.uint8), b'",')
            return orjson.Fragment(b"".join((b"[", memoryview(body)[:-1], b"]")))
    return np.char.decode(array, errors="replace").tolist()


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
