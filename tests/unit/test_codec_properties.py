"""Property tests of every codec: whatever a client sends, a decoder returns tensors or raises a
client error (a ServeError below 500) — never anything else — and what is encoded decodes back."""

import io
import json
import os
import warnings

import numpy as np
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from container import content
from container.api import invoke_codec, tfserving_codec, tfserving_json
from container.api.shared_memory import SharedMemory
from container.channel import wire
from container.errors import ServeError
from container.limits import Limits
from container.models.signature import Signature
from container.models.triton_schema import model_config_pb2 as pb
from container.tensors import DATATYPES, numpy_dtype
from container.v2 import codec

# Derandomized, so CI runs the examples the developer ran; `PROPERTY_EXAMPLES=3000` explores fresh ones.
_EXPLORE = os.environ.get("PROPERTY_EXAMPLES")
PROPERTIES = settings(max_examples=int(_EXPLORE or 300), derandomize=not _EXPLORE, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])
LIMITS = Limits(decoded_bytes=1 << 20)


def signature(*inputs: tuple[str, str, list[int]], max_batch_size: int = 0) -> Signature:
    config = {"name": "m", "max_batch_size": max_batch_size,
              "input": [{"name": n, "data_type": f"TYPE_{'STRING' if t == 'BYTES' else t}", "dims": d} for n, t, d in inputs],
              "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1]}]}
    return Signature.from_config(json_format.ParseDict(config, pb.ModelConfig()))


ONE_FP32 = signature(("x", "FP32", [-1, 4]))
TWO_INPUTS = signature(("a", "INT64", [-1]), ("b", "BYTES", [-1]))
SIGNATURES = st.sampled_from([ONE_FP32, TWO_INPUTS, signature(("x", "BOOL", [2])), signature(("x", "FP16", [-1]))])

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


def client_error_or(function, *args):
    """`function(*args)`, with any exception it raises required to be a client error."""
    try:
        return function(*args)
    except ServeError as exc:
        assert exc.status < 500, exc
        return None


# -- V2 ----------------------------------------------------------------------------------------------

TENSOR_ENTRIES = st.fixed_dictionaries(
    {"name": st.sampled_from(["x", "a", "b", "zz"]) | st.text(max_size=3),
     "shape": st.lists(st.integers(-2, 10 ** 12), max_size=40) | JSON_VALUES,
     "datatype": st.sampled_from(DATATYPES) | st.text(max_size=5)},
    optional={"data": JSON_VALUES, "parameters": st.dictionaries(
        st.sampled_from(["binary_data_size", "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset",
                         "classification"]), st.integers(-5, 10 ** 15) | JSON_VALUES, max_size=3)})


@PROPERTIES
@given(signature_=SIGNATURES, entries=st.lists(TENSOR_ENTRIES, max_size=3) | JSON_VALUES, binary=st.binary(max_size=64),
       header_length=st.none() | st.text(max_size=4))
def test_v2_requests_decode_or_are_client_errors(signature_, entries, binary, header_length):
    header = json.dumps({"inputs": entries}).encode()
    body = header + binary
    length = str(len(header)) if header_length is None else header_length

    def decode():
        document, data = codec.split(body, length)
        codec.requested_outputs(document)
        return codec.decode_inputs(document, data, signature_, SharedMemory(), LIMITS)

    client_error_or(decode)


WELL_FORMED = st.builds(
    lambda datatype, values: [{"name": "x", "shape": [len(values)], "datatype": datatype, "data": values}],
    st.sampled_from([d for d in DATATYPES if d != "BYTES"]),
    st.lists(st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=False), max_size=6))


@PROPERTIES
@given(signature_=SIGNATURES | st.builds(lambda t: signature(("x", t, [-1])), st.sampled_from(DATATYPES)),
       entries=st.lists(TENSOR_ENTRIES, max_size=3) | WELL_FORMED, binary=st.binary(max_size=16))
def test_v2_json_data_a_front_end_typed_decodes_as_the_model_process_decodes_it(signature_, entries, binary):
    """An HTTP front-end types the JSON data it can (codec.typed_data) and sends the document over the
    channel: the model process then decodes the same tensors, or refuses with the same error."""
    header = json.dumps({"inputs": entries}).encode()

    def outcome(front_end: bool):
        try:
            document, data = codec.split(header + binary, str(len(header)))
            if front_end:
                document = wire.unpack(wire.pack(codec.typed_data(document))[wire.LENGTH.size:])
            inputs = codec.decode_inputs(document, data, signature_, SharedMemory(), LIMITS)
        except ServeError as exc:
            return type(exc), str(exc)
        return {name: (array.dtype.str, array.shape, array.tobytes()) for name, array in inputs.items()}

    assert outcome(front_end=True) == outcome(front_end=False)


@PROPERTIES
@given(body=st.binary(max_size=200), header_length=st.none() | st.text(max_size=6))
def test_v2_arbitrary_bytes_are_client_errors(body, header_length):
    client_error_or(lambda: codec.decode_inputs(*codec.split(body, header_length), ONE_FP32, SharedMemory(), LIMITS))


@PROPERTIES
@given(datatype=st.sampled_from([d for d in DATATYPES if d not in ("BYTES", "BF16")]), data=st.data())
def test_v2_binary_tensors_round_trip(datatype, data):
    array = data.draw(hnp.arrays(numpy_dtype(datatype), hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)))
    decoded = codec.from_binary("x", codec.to_binary(array, datatype), datatype, list(array.shape))
    np.testing.assert_array_equal(decoded, array)


@PROPERTIES
@given(values=st.lists(st.binary(max_size=20), max_size=10))
def test_v2_bytes_tensors_round_trip(values):
    array = np.empty(len(values), dtype=object)
    array[:] = values
    decoded = codec.from_binary("x", codec.to_binary(array, "BYTES"), "BYTES", [len(values)])
    assert decoded.tolist() == values


# -- shared memory -----------------------------------------------------------------------------------

@pytest.fixture
def region(tmp_path):
    (tmp_path / "region").write_bytes(bytes(range(256)) * 4)
    memory = SharedMemory(tmp_path)
    memory.register_system("r", "/region", 100, 500)
    yield memory, tmp_path / "region"
    memory.unregister("system")


@PROPERTIES
@given(offset=st.integers(-3, 700), size=st.integers(-3, 700), truncate=st.none() | st.integers(0, 1024))
def test_shared_memory_reads_and_writes_stay_inside_the_region(region, offset, size, truncate):
    memory, path = region
    path.write_bytes(bytes(range(256)) * 4)
    if truncate is not None:
        os.truncate(path, truncate)
    before = path.read_bytes()
    read = client_error_or(memory.read, "r", offset, size)
    if read is not None:
        assert read == before[100 + offset: 100 + offset + size] and 0 <= offset and offset + size <= 500
    written = client_error_or(memory.write, "r", offset, size, b"\xff" * max(size, 0))
    after = path.read_bytes()
    assert len(after) == len(before)  # never grown, never shrunk
    if written is None:
        changed = [i for i in range(len(after)) if after[i] != before[i]]
        assert all(100 <= i < 600 for i in changed)


# -- SageMaker invoke: JSON, CSV, NPY ----------------------------------------------------------------

@PROPERTIES
@given(signature_=SIGNATURES, value=JSON_VALUES)
def test_invoke_json_decodes_or_is_a_client_error(signature_, value):
    client_error_or(invoke_codec.decode, json.dumps(value).encode(), content.JSON, signature_)


@PROPERTIES
@given(body=st.binary(max_size=200) | st.text(alphabet="0123456789.,-e \nnaif", max_size=80).map(str.encode),
       media_type=st.sampled_from([content.JSON, content.CSV, content.NPY, "text/plain"]))
def test_invoke_bodies_decode_or_are_client_errors(body, media_type):
    client_error_or(invoke_codec.decode, body, media_type, ONE_FP32)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # field names beyond Latin-1 need format 3.0, and numpy says so
        warnings.simplefilter("ignore", UserWarning)
        np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


ANY_DTYPE = (hnp.scalar_dtypes() | hnp.byte_string_dtypes() | hnp.unicode_string_dtypes()
             | hnp.array_dtypes(allow_subarrays=True, max_size=3))


@PROPERTIES
@given(data=st.data(), dtype=ANY_DTYPE, cut=st.integers(0, 64))
def test_npy_bodies_of_any_dtype_decode_or_are_client_errors(data, dtype, cut):
    array = data.draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, max_side=3)))
    body = _npy(array)
    decoded = client_error_or(content.decode_npy, body)
    if decoded is not None:
        assert decoded.dtype == array.dtype and decoded.shape == array.shape
    client_error_or(content.decode_npy, body[: max(len(body) - cut, 0)])
    tensors = client_error_or(invoke_codec.decode, body, content.NPY, ONE_FP32)
    if tensors is not None:  # only real numbers reach a numeric model, and at their values
        assert dtype.kind in "biuf"
        np.testing.assert_array_equal(tensors[0]["x"], array.astype(np.float32))


@PROPERTIES
@given(shape=st.lists(st.integers(0, 10 ** 12), max_size=6), descr=st.sampled_from(["<f4", "|b1", "<i8", "|O", "<U3", "V8"]))
def test_npy_headers_claiming_any_shape_are_client_errors(shape, descr):
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''}), }}"
    body = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
    client_error_or(content.decode_npy, body)


@PROPERTIES
@given(array=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=2, max_side=5),
                        elements=st.floats(-1e6, 1e6, width=32)))
def test_invoke_encodings_round_trip(array):
    for media_type in (content.NPY, content.CSV):
        body = content.encode_array(array, media_type)
        decoded = content.decode_npy(body) if media_type == content.NPY else content.decode_csv(body)
        np.testing.assert_array_equal(decoded.reshape(array.shape), array)


# -- TF Serving --------------------------------------------------------------------------------------

@PROPERTIES
@given(signature_=SIGNATURES, document=st.fixed_dictionaries({}, optional={"instances": JSON_VALUES, "inputs": JSON_VALUES}))
def test_tfserving_predict_bodies_decode_or_are_client_errors(signature_, document):
    client_error_or(tfserving_codec._predict_inputs, signature_, document)


@PROPERTIES
@given(body=st.binary(max_size=100) | st.text(alphabet='[]{}",:0123456789NaInfity-b64 ', max_size=60).map(str.encode))
def test_tfserving_bodies_parse_or_are_client_errors(body):
    client_error_or(tfserving_json.parse, body)


@pytest.mark.parametrize("classes", [0, 1, 7, 8192, 8193, 20_000])  # around the block classify makes text in
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("labels", [[], ["cat", "dog"]])
def test_a_classification_is_each_class_written_alone_in_triton_order(classes, batched, labels):
    """Top classes by value, of equal values the lower index first (as tritonserver 2.51 orders them in an
    output of up to 16 values, where its sort keeps their order; past that its order of equal values is its
    sort's), as "<value>:<index>[:<label>]", a float's value with six decimals as Triton's std::to_string writes
    it, however many blocks of classes the answer is written in."""
    rows = np.random.default_rng(classes).integers(-50, 50, (2 if batched else 1, classes)).astype(np.float32) / 4
    count = max(classes - 3, 1)
    answer = codec.classify("y", rows if batched else rows[0], count, labels,
                               signature(("x", "FP32", [-1]), max_batch_size=8 if batched else 0))

    def written(row, index):
        label = f":{labels[index]}" if index < len(labels) else ""
        return f"{float(row[index]):f}:{index}{label}".encode()

    expected = [[written(row, i) for i in sorted(range(classes), key=lambda i: (-row[i], i))[:count]]
                for row in rows]
    assert (answer if batched else answer[None]).tolist() == expected
