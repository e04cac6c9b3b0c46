"""V2 inference bodies: the JSON document, the binary tensor data extension (raw little-endian
tensors after a JSON header of `Inference-Header-Content-Length` bytes; BYTES elements each behind a
4-byte length), shared-memory inputs and outputs, and the classification extension."""

import math

import numpy as np

from container import content
from container.errors import InvalidInput, InvalidRequest
from container.limits import MAX_DIMS, MAX_JSON_NESTING, Limits, too_deep, whole_number
from container.models.signature import Signature, TensorSpec
from container.tensors import DATATYPES, answered_as, as_datatype, little_endian, numpy_dtype, pack_strings, unpack_strings

_NUMERIC = frozenset(DATATYPES) - {"BYTES"}

HEADER_LENGTH = "Inference-Header-Content-Length"
_CLASSES_PER_CALL = 1 << 13  # classes a classification turns into text per numpy call (one GIL hold: ~5 ms)


def split(body: bytes, header_length: str | None) -> tuple[dict, memoryview]:
    """The JSON document and the binary data that follows it."""
    if header_length is None:
        json_part, binary = body, memoryview(b"")
    else:
        length = whole_number(header_length)
        if length is None or length > len(body):
            raise InvalidRequest(f"{HEADER_LENGTH}: {header_length[:40]!r} is not a length within the {len(body)}-byte body")
        json_part, binary = body[:length], memoryview(body)[length:]
    return content.parse_object(json_part, "the request"), binary


def typed_data(document: dict) -> dict:
    """`document` with each numeric input's JSON `data` made the array that decoding makes of it: an HTTP
    front-end's work, which spares the model process's one core. Data that does not convert is left as
    it is, for decoding to refuse once the model is leased: in one process's order, and its words."""
    entries = document.get("inputs")
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("data"), list) and entry.get("datatype") in _NUMERIC:
            try:
                entry["data"] = as_datatype(str(entry.get("name")), entry["data"], entry["datatype"])
            except Exception:  # whatever it is, decoding raises it again after the checks that come first
                pass
    return document


def decode_inputs(document: dict, binary: memoryview, signature: Signature, shared_memory,
                  limits: Limits, model: str = "") -> dict[str, np.ndarray]:
    """The input tensors of a request to `model`; each one's decoded size is checked against the limit
    before it is allocated."""
    entries = document.get("inputs")
    if not isinstance(entries, list):  # empty for a python model that takes none; the signature says what is missing
        raise InvalidRequest("'inputs' must be a list of tensors")
    inputs, offset, decoded = {}, 0, 0
    for entry in entries:
        name, shape, datatype, parameters = _tensor_header(entry)
        decoded += _claimed_bytes(name, shape, datatype, parameters)
        limits.check_decoded(decoded)
        spec = signature.input(name)
        if datatype != spec.datatype:
            raise InvalidInput(f"input '{name}' is {spec.datatype}; the request says {datatype}")
        if name in inputs:
            raise InvalidInput(f"input '{name}' appears twice")
        if "binary_data_size" in parameters:
            size = _size(parameters, "binary_data_size", name)
            if offset + size > len(binary):
                raise InvalidInput(f"input '{name}' claims {size} bytes of binary data; only {len(binary) - offset} remain")
            inputs[name] = from_binary(name, binary[offset: offset + size], datatype, shape, model)
            offset += size
        elif "shared_memory_region" in parameters:
            region, region_offset, size = _shared_memory_parameters(parameters, name)
            expected = _wire_size(datatype, shape)
            if datatype != "BYTES" and size != expected:  # Triton's words; checked before a byte of the region is read
                raise InvalidInput(f"unexpected total byte size {size} for input '{name}', expecting {expected}")
            inputs[name] = from_binary(name, shared_memory.read(region, region_offset, size), datatype, shape, model)
        elif "data" in entry:
            inputs[name] = _from_json(name, entry["data"], datatype, shape)
        else:
            raise InvalidInput(f"input '{name}' has no 'data', binary_data_size or shared_memory_region")
    if offset != len(binary):
        raise InvalidRequest(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    return inputs


_INT64_MAX = (1 << 63) - 1


def _claimed_bytes(name: str, shape: list[int], datatype: str, parameters: dict) -> int:
    """What an input will occupy once decoded: its shape's worth of elements, or for BYTES the data
    that carries them (the elements cannot outgrow it)."""
    if datatype == "BYTES":
        return max(_size(parameters, "binary_data_size", name), _size(parameters, "shared_memory_byte_size", name))
    count = math.prod(shape)
    if count > _INT64_MAX:  # Triton's words: its element count is an int64
        raise InvalidInput(f"input '{name}' shape {shape} causes total element count to exceed maximum size of {_INT64_MAX}")
    size = count * numpy_dtype(datatype).itemsize  # BF16 decodes to float32
    if size > _INT64_MAX:
        raise InvalidInput(f"byte size overflow for input '{name}'")
    return size


def raw_request(signature: Signature, size: int, model: str = "") -> dict:
    """The document a raw binary request (`Inference-Header-Content-Length: 0`) stands for: the whole
    body is the one input's data, a batch of one, its variable dimension (at most one) taken from the
    body's size; every output comes back as binary data."""
    if len(signature.inputs) != 1:
        raise InvalidRequest(f"Raw request must only have 1 input (found 1) to be deduced but got "  # Triton's words
                             f"{len(signature.inputs)} inputs in '{model}' model configuration")
    spec = signature.inputs[0]
    dims = list(spec.shape[1:] if signature.max_batch_size else spec.shape)
    if dims.count(-1) > 1:  # Triton's words, here and below
        raise InvalidRequest(f"The shape of the raw input '{spec.name}' can not be deduced because there are more than "
                             f"one variable-sized dimension")
    if spec.datatype == "BYTES":
        if -1 in dims or math.prod(dims) != 1:
            raise InvalidRequest(f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
    elif -1 in dims:
        fixed = math.prod(d for d in dims if d != -1) * _wire_itemsize(spec.datatype)
        if size % fixed:
            raise InvalidInput(f"input '{spec.name}': {size} bytes are not a whole number of {spec.datatype}{dims} rows")
        dims[dims.index(-1)] = size // fixed
    shape = [1, *dims] if signature.max_batch_size else dims
    return {"inputs": [{"name": spec.name, "shape": shape, "datatype": spec.datatype,
                        "parameters": {"binary_data_size": size}}],
            "parameters": {"binary_data_output": True}}


def requested_outputs(document: dict) -> list[dict] | None:
    entries = document.get("outputs")
    if entries is None:
        return None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries):
        raise InvalidRequest("'outputs' must be a list of objects with a 'name'")
    seen = set()
    for entry in entries:
        parameters = entry.get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidRequest(f"output '{entry['name']}': 'parameters' must be an object")
        if not isinstance(parameters.get("binary_data", False), bool):
            raise InvalidRequest(f"output '{entry['name']}': 'binary_data' must be true or false")
        if entry["name"] in seen:
            raise InvalidRequest(f"output '{entry['name']}' already exists in request")
        seen.add(entry["name"])
    return entries


def encode_outputs(outputs: dict[str, np.ndarray], requested: list[dict] | None, binary_default: bool,
                   signature: Signature, labels: dict[str, list[str]], shared_memory) -> tuple[list[dict], list[bytes]]:
    """The response's output entries, and the binary chunks that follow the JSON (in entry order). The entries
    come in the order the model gave its outputs (a python model's own, a TorchScript model's config's),
    those the request names, as Triton answers, whatever order the request names them in; an output a
    python model left out is left out."""
    entries, chunks = [], []
    asked = {request["name"]: request for request in requested} if requested else None
    declared = signature.output_types
    for name, array in outputs.items():
        if name not in declared or (asked is not None and name not in asked):
            continue
        parameters = asked[name].get("parameters", {}) if asked is not None else {}
        datatype = answered_as(array, declared[name])
        if "classification" in parameters:
            array, datatype = classify(name, array, parameters["classification"], labels.get(name, []), signature), "BYTES"
        entry = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if "shared_memory_region" in parameters:  # no parameters, as Triton writes it: perf_analyzer's HTTP client
            region, region_offset, size = _shared_memory_parameters(parameters, name)  # reads any as binary data's
            shared_memory.write(region, region_offset, size, to_binary(array, datatype))
        elif parameters.get("binary_data", binary_default):
            chunks.append(to_binary(array, datatype))
            entry["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            entry["data"] = np.ascontiguousarray(array).reshape(-1)
        entries.append(entry)
    return entries, chunks


def response_body(document: dict, chunks: list[bytes]) -> tuple[bytes, dict[str, str]]:
    header = content.encode_json(document)
    if not chunks:
        return header, {"Content-Type": content.JSON}
    return b"".join([header, *chunks]), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}


def from_binary(name: str, data, datatype: str, shape: list[int], model: str = "") -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        return unpack_strings(name, bytes(data), count).reshape(shape)
    _check_size(name, len(data), datatype, shape, model)
    if datatype == "BF16":  # bfloat16 is the upper half of a float32
        return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(data, little_endian(datatype)).reshape(shape)


def _wire_size(datatype: str, shape: list[int]) -> int:
    return math.prod(shape) * _wire_itemsize(datatype)


def _check_size(name: str, size: int, datatype: str, shape: list[int], model: str) -> None:
    expected = _wire_size(datatype, shape)
    if size != expected:  # Triton's words, which its clients' tests match
        raise InvalidInput(f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, "
                           f"got {size} (the data of {datatype}{shape})")


def to_binary(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """The tensor's binary data; a numeric tensor already in its wire layout as a view of its own memory,
    not a copy (the answer's body or shared memory copies it once, promptly)."""
    if datatype == "BYTES":
        return pack_strings(array)
    if datatype == "BF16":  # round to nearest even, keep the upper half
        bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()
    return memoryview(np.ascontiguousarray(array, little_endian(datatype)).reshape(-1)).cast("B")


def classify(name: str, array: np.ndarray, count, labels: list[str], signature: Signature) -> np.ndarray:
    """Top-`count` classes as "<value>:<index>[:<label>]", per batch item when the model batches."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise InvalidRequest(f"output '{name}': 'classification' must be a positive whole number")
    if array.dtype == object:
        raise InvalidRequest(f"output '{name}' is BYTES; only numeric outputs can be classified")
    rows = array.reshape(len(array), -1) if signature.max_batch_size else array.reshape(1, -1)
    # highest first, and of equal values the lowest index first, as Triton picks them (a stable sort of the
    # reversed row, read backwards; negating would wrap unsigned values)
    last = rows.shape[1] - 1
    top = (last - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1])[:, : min(count, rows.shape[1])]
    values = np.take_along_axis(rows, top, axis=1)
    named = np.array([b":" + label.encode() for label in labels] + [b""]) if labels else None  # the last: no label
    # Fixed-width byte strings, narrowed to their longest, built a column at a time: a Python object
    # per class took ten times the answer's size (1.5 M classes: 327 MiB at peak for a 30 MiB answer).
    # And a block of classes at a time: each numpy call holds the GIL, and the event loop (/ping) waited
    # 1.4 s for the text of 1.5 M values made in one.
    blocks = []
    for start in range(0, top.shape[1], _CLASSES_PER_CALL):
        columns = slice(start, start + _CLASSES_PER_CALL)
        block = np.char.add(np.char.add(_narrow(_value_texts(values[:, columns])), b":"), _narrow(top[:, columns].astype("S")))
        if named is not None:
            block = np.char.add(block, named[np.minimum(top[:, columns], len(labels))])
        blocks.append(block)
    result = np.concatenate(blocks, axis=1) if blocks else np.empty((len(rows), 0), "S1")
    return result if signature.max_batch_size else result[0]


def _value_texts(values: np.ndarray) -> np.ndarray:
    """Each class's value as Triton writes it (std::to_string): a float with six decimals (`8.000000`, measured
    on tritonserver 2.51), an integer as itself. numpy's "%f" is as fast as its plain text of a float."""
    return np.char.mod(b"%f", values.astype(np.float64)) if values.dtype.kind == "f" else values.astype("S")


def _narrow(strings: np.ndarray) -> np.ndarray:
    """Fixed-width byte strings at the width of the longest (`astype("S")` gives a float32 32 bytes)."""
    return strings.astype(f"S{max(int(np.char.str_len(strings).max(initial=1)), 1)}")


def _tensor_header(entry) -> tuple[str, list[int], str, dict]:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise InvalidRequest("each input must be an object with 'name', 'shape', 'datatype' and its data")
    name, shape, datatype = entry["name"], entry.get("shape"), entry.get("datatype")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):  # JSON's true is no dimension
        raise InvalidInput(f"input '{name}': 'shape' must be a list of non-negative whole numbers")
    if len(shape) > MAX_DIMS:
        raise InvalidInput(f"input '{name}': a shape of {len(shape)} dimensions; at most {MAX_DIMS}")
    if datatype not in DATATYPES:
        raise InvalidInput(f"input '{name}': datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
    parameters = entry.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput(f"input '{name}': 'parameters' must be an object")
    return name, shape, datatype, parameters


def _from_json(name: str, data, datatype: str, shape: list[int]) -> np.ndarray:
    depth = _nesting(data)
    if depth >= MAX_JSON_NESTING:
        raise InvalidInput(too_deep(name, MAX_JSON_NESTING))
    if depth > MAX_DIMS:  # deeper than a tensor's dimensions: Triton reads the values in order, as its shape says
        data = _flattened(name, data)
    array = as_datatype(name, data, datatype)
    if array.size != math.prod(shape):
        raise InvalidInput(f"input '{name}': {array.size} values for shape {shape} ({math.prod(shape)} expected)")
    return array.reshape(shape)


def _nesting(data) -> int:
    """How deep `data`'s first values nest (the rest must match them, or the values are ragged)."""
    depth = 0
    while isinstance(data, list) and depth <= MAX_JSON_NESTING:
        depth += 1
        data = data[0] if data else None
    return depth


def _flattened(name: str, data: list, depth: int = 1) -> list:
    """The values in order, however they nest, up to MAX_JSON_NESTING deep."""
    if depth >= MAX_JSON_NESTING:
        raise InvalidInput(too_deep(name, MAX_JSON_NESTING))
    values = []
    for value in data:
        if isinstance(value, list):
            values.extend(_flattened(name, value, depth + 1))
        else:
            values.append(value)
    return values


def _wire_itemsize(datatype: str) -> int:
    """Bytes an element takes in binary data: BF16 travels as 2 (it decodes to a float32)."""
    return 2 if datatype == "BF16" else numpy_dtype(datatype).itemsize


def _size(parameters: dict, key: str, name: str) -> int:
    value = parameters.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"'{name}': {key} must be a non-negative whole number")
    return value


def _shared_memory_parameters(parameters: dict, name: str) -> tuple[str, int, int]:
    region = parameters["shared_memory_region"]
    if not isinstance(region, str):
        raise InvalidInput(f"'{name}': shared_memory_region must be a region name")
    if "shared_memory_byte_size" not in parameters:
        raise InvalidInput(f"'{name}': shared_memory_byte_size is required with shared_memory_region")
    return region, _size(parameters, "shared_memory_offset", name), _size(parameters, "shared_memory_byte_size", name)


def tensor_metadata(spec: TensorSpec) -> dict:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}
