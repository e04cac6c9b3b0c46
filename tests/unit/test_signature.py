import numpy as np
import pytest

from container.errors import InvalidInput
from container.models.signature import Signature, TensorSpec
from container.tensors import as_datatype

SIGNATURE = Signature(
    inputs=(TensorSpec("a", "FP32", (-1, 2)), TensorSpec("b", "INT64", (-1, -1))),
    outputs=(TensorSpec("y", "FP32", (-1, 2)),),
    max_batch_size=4,
)


def test_matching_inputs_pass():
    SIGNATURE.check_inputs({"a": np.zeros((3, 2), np.float32), "b": np.zeros((3, 7), np.int64)})


@pytest.mark.parametrize("inputs, message", [
    ({"a": np.zeros((1, 2), np.float32)}, r"missing input\(s\) \['b'\]"),
    ({"a": np.zeros((1, 2), np.float32), "b": np.zeros((1, 1), np.int64), "c": np.zeros(1)}, r"unexpected input\(s\) \['c'\]"),
    ({"a": np.zeros((1, 2), np.float64), "b": np.zeros((1, 1), np.int64)}, "input 'a' must be FP32, got FP64"),
    ({"a": np.zeros((1, 3), np.float32), "b": np.zeros((1, 1), np.int64)}, r"input 'a' must have shape \[-1, 2\], got \[1, 3\]"),
    ({"a": np.zeros((2,), np.float32), "b": np.zeros((1, 1), np.int64)}, r"must have shape \[-1, 2\]"),
    ({"a": np.zeros((2, 2), np.float32), "b": np.zeros((3, 1), np.int64)}, "disagree on the batch size"),
    ({"a": np.zeros((5, 2), np.float32), "b": np.zeros((5, 1), np.int64)}, r"batch size 5 is outside 1..4"),
])
def test_mismatches_name_the_input_and_what_was_expected(inputs, message):
    with pytest.raises(InvalidInput, match=message):
        SIGNATURE.check_inputs(inputs)


OPTIONAL = Signature(inputs=(TensorSpec("a", "FP32", (-1, 2)), TensorSpec("b", "FP32", (-1, 2), optional=True)),
                     outputs=(TensorSpec("y", "FP32", (-1, 2)),), max_batch_size=4)


@pytest.mark.parametrize("inputs", [{"a": np.zeros((1, 2), np.float32)},
                                    {"a": np.zeros((3, 2), np.float32), "b": np.zeros((3, 2), np.float32)}])
def test_an_optional_input_may_be_left_out(inputs):
    OPTIONAL.check_inputs(inputs)


@pytest.mark.parametrize("inputs, message", [
    ({"b": np.zeros((1, 2), np.float32)}, r"missing input\(s\) \['a'\]; the model takes 'a' FP32\[-1, 2\], 'b' FP32\[-1, 2\] \(optional\)"),
    ({}, r"missing input\(s\) \['a'\]"),
    ({"a": np.zeros((1, 2), np.float32), "c": np.zeros((1, 2), np.float32)}, r"unexpected input\(s\) \['c'\]"),
    ({"a": np.zeros((1, 2), np.float32), "b": np.zeros((2, 2), np.float32)}, "disagree on the batch size"),
    ({"a": np.zeros((1, 2), np.float32), "b": np.zeros((1, 3), np.float32)}, r"input 'b' must have shape"),
])
def test_an_optional_input_given_is_checked_and_a_required_one_is_still_required(inputs, message):
    with pytest.raises(InvalidInput, match=message):
        OPTIONAL.check_inputs(inputs)


def test_a_request_of_no_inputs_is_refused_even_when_each_is_optional():
    signature = Signature(inputs=(TensorSpec("b", "FP32", (2,), optional=True),), outputs=(TensorSpec("y", "FP32", (2,)),))
    with pytest.raises(InvalidInput, match=r"the request has no inputs; the model takes 'b' FP32\[2\] \(optional\)"):
        signature.check_inputs({})


@pytest.mark.parametrize("inputs, sole", [
    ((TensorSpec("a", "FP32", (2,)),), "a"),
    ((TensorSpec("a", "FP32", (2,), optional=True),), "a"),
    ((TensorSpec("a", "FP32", (2,)), TensorSpec("b", "FP32", (2,), optional=True)), "a"),
    ((TensorSpec("a", "FP32", (2,)), TensorSpec("b", "FP32", (2,))), None),
    ((TensorSpec("a", "FP32", (2,), optional=True), TensorSpec("b", "FP32", (2,), optional=True)), None),
])
def test_the_sole_input_is_the_one_input_or_the_one_required(inputs, sole):
    spec = Signature(inputs=inputs, outputs=()).sole_input()
    assert (spec.name if spec else None) == sole


def test_unknown_outputs():
    with pytest.raises(InvalidInput, match=r"unknown output\(s\) \['z'\]"):
        SIGNATURE.check_outputs(["y", "z"])


@pytest.mark.parametrize("value, datatype, expected", [
    ([[1, 2]], "FP32", np.float32), ([1, 0], "BOOL", np.bool_), ([True], "BOOL", np.bool_),
    (["a", "b"], "BYTES", object), ([1.5], "FP16", np.float16), ([7], "UINT64", np.uint64),
])
def test_as_datatype(value, datatype, expected):
    array = as_datatype("t", value, datatype)
    assert array.dtype == np.dtype(expected)
    if datatype == "BYTES":
        assert array.tolist() == [b"a", b"b"]


def test_an_infinity_sent_as_such_is_kept_and_only_an_overflow_refused():
    assert as_datatype("t", np.array([np.inf, -1.0]), "FP32").tolist() == [np.inf, -1.0]
    with pytest.raises(InvalidInput, match="outside its range"):
        as_datatype("t", np.array([np.inf, 1e300]), "FP32")


@pytest.mark.parametrize("value, datatype, message", [
    ([1.5], "INT32", "floating-point"), ([300], "UINT8", "outside"), ([-1], "UINT32", "outside"),
    (["x"], "FP32", "send numbers"), ([1], "BYTES", "send strings"), ([2], "BOOL", "true/false"),
    ([True], "INT8", "send numbers, got true/false"),  # as Triton refuses: it was read as 1
    ([[1], [1, 2]], "FP32", "input 't'"), ([1.0, 1e300], "FP32", "outside its range"), ([70000], "FP16", "outside its range"),
])
def test_as_datatype_refuses_lossy_casts(value, datatype, message):
    with pytest.raises(InvalidInput, match=message):
        as_datatype("t", value, datatype)
