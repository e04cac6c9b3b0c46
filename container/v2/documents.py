"""V2 documents as the core's requests, and the core's responses as V2 documents: the decoding and
encoding that a front-end does itself, against the view it holds of the model (views.py), and that the
model process does for every other request (api/v2_dataplane.py). Nothing here knows the core, and
nothing here chooses a thread: a caller runs a large request's work off its event loop (`heavy`)."""

from container.errors import InvalidRequest
from container.inference import SCHEDULING_PARAMETERS, InferRequest
from container.limits import Limits
from container.models.signature import Signature
from container.v2 import codec

HEAVY_BYTES = 128 << 10  # codec work on this much data is felt by an event loop (a 6 MiB body: seconds)


def heavy(size: int) -> bool:
    return size >= HEAVY_BYTES


def heavy_outputs(outputs: dict) -> bool:
    return heavy(sum(array.nbytes for array in outputs.values()))


def names_shared_memory(document: dict) -> bool:
    """Whether a request's inputs or outputs name shared memory: the regions live in the model process."""
    return any(True for _ in _in_shared_memory(document, ("inputs", "outputs")))


def reads_much_shared_memory(document: dict) -> bool:
    """Whether a request's inputs read enough from shared memory to be felt by an event loop, by the sizes
    they claim (checked as they are read). A small read is a system call: on a thread it cost more than
    the request (shared memory over HTTP served half the requests plain HTTP did, measured)."""
    sizes = (parameters.get("shared_memory_byte_size") for parameters in _in_shared_memory(document, ("inputs",)))
    return heavy(sum(size for size in sizes if isinstance(size, int)))


def _in_shared_memory(document: dict, keys: tuple[str, ...]):
    """The parameters of the entries under `keys` that name a shared memory region."""
    for key in keys:
        entries = document.get(key)
        for entry in entries if isinstance(entries, list) else ():
            parameters = entry.get("parameters") if isinstance(entry, dict) else None
            if isinstance(parameters, dict) and "shared_memory_region" in parameters:
                yield parameters


def decode_request(document: dict, binary, signature: Signature, shared_memory, limits: Limits,
                   name: str) -> tuple[InferRequest, list[dict] | None]:
    """The core's request for a V2 document and its binary data, checked against `signature`, and the
    outputs it asks for. A front-end decodes here with the signature it holds (shared_memory None)."""
    parameters = request_parameters(document)
    inputs = codec.decode_inputs(document, binary, signature, shared_memory, limits, name)
    requested = codec.requested_outputs(document)
    names = [r["name"] for r in requested] if requested else None
    request_id = document.get("id", "")
    if not isinstance(request_id, str):  # the spec's `$string`: echoed as a number, it broke clients that read it
        raise InvalidRequest("'id' must be a string")
    return InferRequest(inputs, names, parameters, request_id=request_id), requested


def answer(document: dict, request: InferRequest, name: str, version: int, outputs: dict, requested,
           signature: Signature, labels, shared_memory) -> tuple[dict, list[bytes]]:
    """The answer's document and the binary chunks after it; `labels`: the model's output labels."""
    if "id" in document:  # first, where Triton writes it
        head = {"id": document["id"], "model_name": name, "model_version": str(version)}
    else:
        head = {"model_name": name, "model_version": str(version)}
    binary = request.parameters.get("binary_data_output", False)
    entries, chunks = codec.encode_outputs(outputs, requested, binary, signature, labels, shared_memory)
    return {**head, "outputs": entries}, chunks


def request_parameters(document: dict) -> dict:
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidRequest("'parameters' must be an object")
    if not parameters:  # most requests: nothing to check
        return parameters
    for key, types in SCHEDULING_PARAMETERS.items():
        value = parameters.get(key)
        if value is not None and (not isinstance(value, types) or (bool not in types and isinstance(value, bool))):
            raise InvalidRequest(f"parameter '{key}' must be {' or '.join(t.__name__ for t in types)}")
        if key in ("priority", "timeout") and value is not None and value < 0:
            raise InvalidRequest(f"parameter '{key}' must not be negative")
    if not isinstance(parameters.get("binary_data_output", False), bool):
        raise InvalidRequest("parameter 'binary_data_output' must be true or false")
    for key, value in parameters.items():
        if not isinstance(value, (str, int, float)):  # bool is an int; the types a parameter has, over gRPC too
            raise InvalidRequest(f"parameter '{key}' must be a string, a number or true/false")
    if any(key.startswith("triton_") for key in parameters):
        raise InvalidRequest("parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.")
    return parameters
