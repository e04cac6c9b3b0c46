"""TF Serving's inference bodies: a `:predict`, `:classify` or `:regress` request decoded into the
model's input tensors, checked against its signature, and its outputs encoded as TF Serving answers.
No model state beyond the signature and the output labels, so that an HTTP front-end decodes and
encodes against its view of the model (http_frontend/tfserving.py) as the model process does against
the leased one (tfserving.py). Signatures are derived from the model's Triton config: `serving_default`
always; `regress` when the one output holds one value per example; `classify` when it holds a score
per class."""

import json
from typing import Callable, Mapping

import numpy as np

from container.api import offload
from container.api import tfserving_json as tfjson
from container.errors import InvalidInput, InvalidRequest
from container.models.signature import Signature, TensorSpec
from container.tensors import as_datatype

PREDICT, REGRESS, CLASSIFY = ("tensorflow/serving/predict", "tensorflow/serving/regress", "tensorflow/serving/classify")
DEFAULT_SIGNATURE = {":predict": "serving_default", ":regress": REGRESS, ":classify": CLASSIFY}
Encode = Callable[[dict[str, np.ndarray]], bytes]


def decode(signature: Signature, labels: Mapping[str, tuple[str, ...]], body: bytes,
           verb: str) -> tuple[dict[str, np.ndarray], Encode]:
    """The input tensors of a `verb` request's body to a model of `signature`, and `encode(outputs)`: the
    answer's body (`labels`: the class labels of each output, for `:classify`). A large body is decoded,
    and a large answer encoded, on a thread (offload.py)."""
    heavy = offload.heavy(len(body))
    document = offload.run(heavy, _parse, body)
    _check_signature(signature, document, verb)
    if verb == ":predict":
        inputs, key = offload.run(heavy, _predict_inputs, signature, document)
        return inputs, lambda outputs: offload.encode(_predictions, outputs, key)
    inputs = offload.run(heavy, _examples, document, signature)
    count = len(document["examples"])
    if verb == ":regress":
        return inputs, lambda outputs: offload.encode(_regressions, outputs, count)
    return inputs, lambda outputs: offload.encode(_classes, outputs, count, labels)


def signatures(signature: Signature) -> dict[str, str]:
    """Signature name → method, as TF Serving would list them for this model."""
    found = {"serving_default": PREDICT}
    if len(signature.outputs) == 1 and signature.outputs[0].datatype.startswith(("FP", "BF")):
        per_example = _per_example_shape(signature, signature.outputs[0])
        if per_example in ((), (1,)):
            found[REGRESS] = REGRESS
        elif len(per_example) == 1:
            found[CLASSIFY] = CLASSIFY
    return found


def _per_example_shape(signature: Signature, spec: TensorSpec) -> tuple[int, ...]:
    """The shape of one example's slice: without the batch dimension, or the first one when not batching."""
    return spec.shape[1:] if signature.max_batch_size or spec.shape[:1] == (-1,) else spec.shape


def _parse(body: bytes) -> dict:
    document = tfjson.parse(body)
    if not isinstance(document, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return document


def _check_signature(signature: Signature, document: dict, verb: str) -> None:
    name = document.get("signature_name") or DEFAULT_SIGNATURE[verb]
    available = signatures(signature)
    if not isinstance(name, str) or name not in available:
        raise InvalidRequest(f'Serving signature name: "{name}" not found in signature def')
    wanted = {":regress": REGRESS, ":classify": CLASSIFY}.get(verb)
    if wanted and available[name] != wanted:
        raise InvalidRequest(f"Expected {verb[1:]} signature method_name to be {wanted}. Was: {available[name]}")


def _predict_inputs(signature: Signature, document: dict) -> tuple[dict[str, np.ndarray], str]:
    """The input tensors of a predict request, and the key its answer goes under."""
    if "instances" in document and "inputs" in document:
        raise InvalidRequest("Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist")
    if "instances" in document:
        return _rows(document["instances"], signature), "predictions"
    if "inputs" in document:
        return _columns(document["inputs"], signature), "outputs"
    raise InvalidRequest("Missing 'inputs' or 'instances' key")


def _predictions(outputs: dict[str, np.ndarray], key: str) -> bytes:
    if len(outputs) == 1:
        (name, array), = outputs.items()
        return tfjson.document({key: tfjson.value(array, _binary(name))})
    if key == "outputs":
        return tfjson.document({key: _named(outputs)})
    batch = {len(array) if array.ndim else None for array in outputs.values()}
    if len(batch) != 1 or None in batch:
        raise InvalidRequest("the outputs do not share a batch dimension; send the columnar 'inputs' format")
    rows = [_named({n: a[i] for n, a in outputs.items()}) for i in range(batch.pop())]
    return tfjson.document({key: "[" + ", ".join(rows) + "]"})


def _named(outputs: dict) -> str:
    return "{" + ", ".join(f"{json.dumps(n)}: {tfjson.value(a, _binary(n))}" for n, a in outputs.items()) + "}"


def _binary(name: str) -> bool:
    return name.endswith("_bytes")


def _rows(instances, signature: Signature) -> dict[str, np.ndarray]:
    if not isinstance(instances, list) or not instances:
        raise InvalidRequest("'instances' must be a non-empty list, one entry per example")
    if all(isinstance(row, dict) and set(row) != {"b64"} for row in instances):
        required, names = [spec.name for spec in signature.inputs if not spec.optional], sorted(instances[0])
        for index, row in enumerate(instances):
            if sorted(row) != names or not set(required) <= set(row):
                optional = [spec.name for spec in signature.inputs if spec.optional]
                raise InvalidInput(f"instance {index} names {sorted(row)}; every instance must name the inputs {required}"
                                   + (f", and the same of the optional {optional}" if optional else ""))
        columns = {name: [row[name] for row in instances] for name in names}
    else:
        columns = {_only_input(signature).name: instances}
    return {name: _tensor(name, value, signature) for name, value in columns.items()}


def _columns(inputs, signature: Signature) -> dict[str, np.ndarray]:
    if isinstance(inputs, dict) and set(inputs) != {"b64"}:
        return {name: _tensor(name, value, signature) for name, value in inputs.items()}
    return {_only_input(signature).name: _tensor(_only_input(signature).name, inputs, signature)}


def _only_input(signature: Signature) -> TensorSpec:
    spec = signature.sole_input()
    if spec is None:
        names = [spec.name for spec in signature.inputs]
        raise InvalidInput(f"the model takes {len(names)} inputs {names}: name each one")
    return spec


def _tensor(name: str, value, signature: Signature) -> np.ndarray:
    datatype = signature.input(name).datatype
    if datatype != "BYTES":
        try:  # numbers hold no {"b64": …} object: no Python walk over every value (1,024 of them: 110 µs)
            return as_datatype(name, value, datatype)
        except InvalidInput:
            pass  # the walk below finds what a b64 object or a bad value says
    return as_datatype(name, tfjson.decode_b64(value, name), datatype)


def _regressions(outputs: dict[str, np.ndarray], count: int) -> bytes:
    (array,) = outputs.values()
    if array.size != count:
        raise InvalidRequest(f"the model gave {array.size} values for {count} examples")
    return tfjson.document({"results": tfjson.value(array.reshape(count))})


def _classes(outputs: dict[str, np.ndarray], count: int, labels: Mapping[str, tuple[str, ...]]) -> bytes:
    (name, array), = outputs.items()
    scores = array.reshape(count, -1)
    known = labels.get(name, ())
    results = [[[known[i] if i < len(known) else "", score] for i, score in enumerate(row)] for row in scores]
    return tfjson.document({"results": tfjson.value(results)})


def _examples(document: dict, signature: Signature) -> dict[str, np.ndarray]:
    """tf.Example-style `examples` (plus shared `context`) → one stacked tensor per input."""
    examples, context = document.get("examples"), document.get("context", {})
    if not isinstance(examples, list) or not examples or not all(isinstance(e, dict) for e in examples):
        raise InvalidRequest("'examples' must be a non-empty list of objects, one per example")
    if not isinstance(context, dict):
        raise InvalidRequest("'context' must be an object of features shared by every example")
    inputs = {}
    for spec in signature.inputs:
        if spec.optional and spec.name not in context and not any(spec.name in e for e in examples):
            continue  # an optional feature no example has: left out, as a request may leave it
        values = []
        for index, example in enumerate(examples):
            if spec.name in example and spec.name in context:
                raise InvalidRequest(f"feature '{spec.name}' is in both 'context' and example {index}")
            if spec.name not in example and spec.name not in context:
                raise InvalidInput(f"example {index} lacks feature '{spec.name}'")
            values.append(example.get(spec.name, context.get(spec.name)))
        array = _tensor(spec.name, values, signature)
        inner = _per_example_shape(signature, spec)
        if -1 not in inner and array.size == len(examples) * int(np.prod(inner)):
            array = array.reshape((len(examples), *inner))  # a feature is a flat list per example
        inputs[spec.name] = array
    known = {spec.name for spec in signature.inputs}
    unknown = sorted({k for e in examples for k in e} - known)
    if unknown:
        raise InvalidInput(f"unknown feature(s) {unknown}; the model takes {sorted(known)}")
    return inputs


