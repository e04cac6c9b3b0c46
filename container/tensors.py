"""Triton datatypes: wire name (`FP32`) ↔ config enum (`TYPE_FP32`) ↔ numpy dtype.

BYTES tensors are numpy object arrays of `bytes`. BF16 has no numpy dtype; it travels as float32 and
the backend narrows it.
"""

import struct

import numpy as np

from container.errors import InvalidInput
from container.limits import MAX_DIMS, too_deep

_LENGTH = struct.Struct("<I")

_TABLE = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(np.float32),
    "BYTES": np.dtype(object),
}
_BY_NUMPY = {dtype: name for name, dtype in _TABLE.items() if name != "BF16"}
DATATYPES = tuple(_TABLE)
_LITTLE_ENDIAN = {name: dtype.newbyteorder("<") for name, dtype in _TABLE.items()}


def numpy_dtype(datatype: str) -> np.dtype:
    return _TABLE[datatype]


def little_endian(datatype: str) -> np.dtype:
    """`datatype`'s numpy dtype in the byte order binary tensor data carries it in."""
    return _LITTLE_ENDIAN[datatype]


def from_config(enum_name: str) -> str:
    """`TYPE_FP32` → `FP32`; Triton's config calls BYTES `TYPE_STRING`."""
    name = enum_name.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def datatype_of(array: np.ndarray) -> str:
    """The array's Triton datatype; numpy's name for a dtype that has none (complex, say)."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    name = _BY_NUMPY.get(array.dtype)
    return str(array.dtype) if name is None else name  # not .get's default: str() of a dtype takes microseconds


def answered_as(array: np.ndarray, declared: str) -> str:
    """The datatype an output is answered in: the declared one, or the array's own where the model gave
    another (a python model's output goes out as it is, as Triton's python backend sends it; the
    TorchScript backends refuse a mismatch, as Triton's libtorch backend does)."""
    return declared if array.dtype == _TABLE[declared] else datatype_of(array)


def as_datatype(name: str, value, datatype: str) -> np.ndarray:
    """Decoded request data (lists, scalars or an array) → an array of `datatype`, refusing lossy casts."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and value.dtype == _TABLE.get(datatype) \
            and value.ndim <= MAX_DIMS:
        return value  # nothing to cast: a front-end's typed JSON data, an NPY body of the model's type
    try:  # strings stay Python objects: numpy would turn a number among them into its digits
        array = np.asarray(value, dtype=object if datatype == "BYTES" and not isinstance(value, np.ndarray) else None)
    except ValueError as exc:  # ragged nesting, or deeper than numpy's 64 dimensions
        raise InvalidInput(too_deep(name) if "maximum number of dimension" in str(exc) else f"input '{name}': {exc}") from None
    if array.ndim > MAX_DIMS:
        raise InvalidInput(too_deep(name))
    if not array.size:  # `[]` parses as float64, which no integer or BOOL input would take
        return np.empty(array.shape, _TABLE[datatype])
    kind = array.dtype.kind
    if datatype == "BYTES":
        if kind not in "OSU":
            raise InvalidInput(f"input '{name}' is BYTES: send strings, got {array.dtype} values")
        return to_bytes_array(array, name)
    target = _TABLE[datatype]
    if kind in "OSU":
        raise InvalidInput(f"input '{name}' is {datatype}: send numbers, got strings")
    if kind not in "biuf":  # complex would lose its imaginary part; dates, records and raw bytes mean nothing
        raise InvalidInput(f"input '{name}' is {datatype}: send numbers, got {_kind_of(array.dtype)} values")
    if kind == "b" and target.kind != "b":  # as Triton refuses them (numpy would read true as 1)
        raise InvalidInput(f"input '{name}' is {datatype}: send numbers, got true/false")
    if kind == "f" and target.kind in "iub":
        raise InvalidInput(f"input '{name}' is {datatype}: got floating-point values")
    if kind in "iu" and target.kind == "b":
        if not np.isin(array, (0, 1)).all():
            raise InvalidInput(f"input '{name}' is BOOL: send true/false (or 0/1)")
    if target.kind in "iu" and array.size and kind in "iu":
        info = np.iinfo(target)
        if array.min() < info.min or array.max() > info.max:
            raise InvalidInput(f"input '{name}' is {datatype}: values outside [{info.min}, {info.max}]")
    if target.kind == "f" and kind in "fiu":
        with np.errstate(over="ignore"):
            narrowed = array.astype(target, copy=False)
        infinite = np.isinf(narrowed)
        if infinite.any() and (infinite & ~np.isinf(array)).any():  # the precise test only where an infinity is
            raise InvalidInput(f"input '{name}' is {datatype}: values outside its range (largest {np.finfo(target).max})")
        return narrowed
    return array.astype(target, copy=False)


def decoded_size(arrays) -> int:
    """Bytes the arrays hold; a BYTES element counts as its reference only — its bytes were checked
    where they were decoded, and summing a million lengths here would hold up the event loop."""
    return sum(a.nbytes for a in arrays)


def to_bytes_array(array: np.ndarray, name: str = "") -> np.ndarray:
    """Any string-ish array → an object array of `bytes` (str is UTF-8 encoded). Other objects are
    refused: `bytes(n)` of an integer would allocate n zero bytes."""
    flat = array.reshape(-1).tolist()
    for index, value in enumerate(flat):
        if isinstance(value, str):
            flat[index] = value.encode(errors="surrogatepass")
        elif not isinstance(value, bytes):
            raise InvalidInput(f"input '{name}' is BYTES: send strings; element {index} is "
                               f"{'null' if value is None else type(value).__name__}")
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(array.shape)


def _kind_of(dtype: np.dtype) -> str:
    names = {"c": "complex", "M": "datetime", "m": "timedelta", "V": "structured or raw", "O": "mixed or null"}
    return names.get(dtype.kind, str(dtype))


def unpack_strings(name: str, data: bytes, count: int) -> np.ndarray:
    """Serialized BYTES elements (each behind a 4-byte little-endian length) as an object array."""
    values, offset = [], 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise InvalidInput(f"input '{name}': BYTES data ends inside an element's 4-byte length")
        (length,) = _LENGTH.unpack_from(data, offset)
        if offset + 4 + length > len(data):
            raise InvalidInput(f"input '{name}': a BYTES element of {length} bytes runs past the data")
        values.append(data[offset + 4: offset + 4 + length])
        offset += 4 + length
    if len(values) != count:
        raise InvalidInput(f"input '{name}': {len(values)} BYTES elements for a shape of {count}")
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def pack_strings(array: np.ndarray) -> bytes:
    """A BYTES tensor serialized: each element behind its 4-byte little-endian length."""
    if array.dtype.kind == "S":
        flat = np.ascontiguousarray(array.reshape(-1))
        return join_fixed_width(flat, np.char.str_len(flat).astype("<u4").view(np.uint8).reshape(-1, 4))
    values = [v.encode() if isinstance(v, str) else bytes(v) for v in array.reshape(-1)]
    return b"".join(_LENGTH.pack(len(v)) + v for v in values)


def join_fixed_width(flat: np.ndarray, before: np.ndarray, after: bytes = b"") -> bytes:
    """The fixed-width byte strings of the 1-D `flat` (what classification makes) in one buffer, each
    behind its row of `before` (uint8, one row a string) and ahead of `after`, without their padding:
    one table and one pass, no Python object per string."""
    width, head = flat.dtype.itemsize, before.shape[1]
    table = np.empty((len(flat), head + width + len(after)), np.uint8)
    table[:, :head] = before
    table[:, head:head + width] = np.ascontiguousarray(flat).view(np.uint8).reshape(-1, width)
    table[:, head + width:] = np.frombuffer(after, np.uint8)
    columns = np.arange(table.shape[1])
    return table[(columns < head + np.char.str_len(flat)[:, None]) | (columns >= head + width)].tobytes()


def zeros(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor of zeros; BYTES zeros are empty strings."""
    if datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, numpy_dtype(datatype))
