"""What a batch adds to and takes from a ragged model's tensors, with the shapes and values of the
examples in Triton's model_config.proto and its ragged batching guide."""

import numpy as np
import pytest
from google.protobuf import json_format

from container.errors import ModelError
from container.models.batch_io import BatchIO
from container.models.triton_schema import model_config_pb2 as pb

KINDS = pb.BatchInput.Kind.keys()


def batching(dims=(-1,), output_dims=(-1,)) -> BatchIO:
    document = {
        "max_batch_size": 8,
        "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": list(dims), "allow_ragged_batch": True},
                  {"name": "OTHER", "data_type": "TYPE_FP32", "dims": [2]}],
        "output": [{"name": "SCATTERED", "data_type": "TYPE_FP32", "dims": list(output_dims)},
                   {"name": "ROWS", "data_type": "TYPE_FP32", "dims": [1]}],
        "batch_input": [{"kind": kind, "target_name": [kind], "data_type": "TYPE_INT32", "source_input": ["INPUT"]}
                        for kind in KINDS],
        "batch_output": [{"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["SCATTERED"], "source_input": ["INPUT"]}],
    }
    return BatchIO.from_config(json_format.ParseDict(document, pb.ModelConfig()))


def request(shape, start=0) -> dict[str, np.ndarray]:
    values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + start
    return {"INPUT": values, "OTHER": np.zeros((shape[0], 2), np.float32)}


def test_the_guides_three_requests_make_one_flat_input_and_their_ends():
    merged = batching().merge([request((1, 3)), request((1, 4)), request((1, 5))])
    assert merged["INPUT"].shape == (12,) and merged["OTHER"].shape == (3, 2)
    assert merged["BATCH_ACCUMULATED_ELEMENT_COUNT"].tolist() == [3, 7, 12]
    assert merged["BATCH_ELEMENT_COUNT"].tolist() == [3, 4, 5]
    assert merged["BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"].tolist() == [0, 3, 7, 12]
    assert merged["BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"].shape == (5,)
    assert all(merged[kind].dtype == np.int32 for kind in KINDS)


def test_item_shapes_count_each_row_of_a_request_as_the_proto_s_example_does():
    merged = batching(dims=(-1, -1)).merge([request((2, 3, 1)), request((1, 2, 2))])
    assert merged["BATCH_ITEM_SHAPE"].tolist() == [[3, 1], [3, 1], [2, 2]]
    assert merged["BATCH_ITEM_SHAPE_FLATTEN"].tolist() == [3, 1, 3, 1, 2, 2]


def test_requests_that_differ_only_in_a_ragged_input_share_a_batch_key():
    made = batching()
    keys = [tuple(made.key(n, a) for n, a in sorted(request(shape).items())) for shape in ((1, 3), (1, 9), (2, 4))]
    assert keys[0] == keys[1] == keys[2]
    assert made.key("OTHER", np.zeros((1, 2), np.float32)) != made.key("OTHER", np.zeros((1, 3), np.float32))


def test_a_scattered_output_goes_back_in_each_request_s_shape_and_the_rest_by_rows():
    made, requests = batching(), [request((1, 2)), request((2, 3))]
    outputs = {"SCATTERED": np.arange(8, dtype=np.float32), "ROWS": np.array([[1], [2], [3]], np.float32)}
    shares = [{name: outputs[name][rows] for name in outputs} for rows in (slice(0, 1), slice(1, 3))]
    first, second = made.scatter(outputs, requests, shares)
    assert first["SCATTERED"].tolist() == [[0, 1]] and second["SCATTERED"].tolist() == [[2, 3, 4], [5, 6, 7]]
    assert first["ROWS"].tolist() == [[1]] and second["ROWS"].tolist() == [[2], [3]]


def test_a_scattered_output_of_the_wrong_size_is_the_model_s_error():
    outputs = {"SCATTERED": np.arange(7, dtype=np.float32)}
    with pytest.raises(ModelError, match="has 7 elements; scattered by input 'INPUT', its batch's requests need 8"):
        batching().scatter(outputs, [request((1, 2)), request((2, 3))], [{"SCATTERED": None}, {"SCATTERED": None}])


def test_a_config_without_ragged_inputs_or_batch_tensors_has_no_batching():
    config = json_format.ParseDict({"max_batch_size": 4, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}]},
                                   pb.ModelConfig())
    assert BatchIO.from_config(config) is None
