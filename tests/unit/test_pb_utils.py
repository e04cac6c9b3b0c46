"""`triton_python_backend_utils` as model code uses it (backends/pb_utils.py), without a server."""

import json

import numpy as np
import pytest

from container.backends import pb_utils


def config(**fields) -> pb_utils.ModelConfig:
    return pb_utils.ModelConfig({"name": "m", "max_batch_size": 0, "input": [], "output": [], **fields})


def test_auto_complete_adds_tensors_and_keeps_what_the_config_says():
    completed = config(input=[{"name": "a", "data_type": "TYPE_INVALID", "dims": []}])
    completed.add_input({"name": "a", "data_type": "TYPE_FP32", "dims": [4]})
    completed.add_input({"name": "b", "data_type": "TYPE_INT64", "dims": [-1], "optional": True})
    completed.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [4]})
    completed.set_max_batch_size(8)
    completed.set_dynamic_batching()
    completed.set_model_transaction_policy({"decoupled": False})
    document = completed.as_dict()
    assert document["input"] == [{"name": "a", "data_type": "TYPE_FP32", "dims": [4]},
                                 {"name": "b", "data_type": "TYPE_INT64", "dims": [-1], "optional": True}]
    assert document["max_batch_size"] == 8 and document["dynamic_batching"] == {}
    assert document["model_transaction_policy"] == {"decoupled": False}


@pytest.mark.parametrize("change, message", [
    (lambda c: c.add_input({"name": "a", "data_type": "TYPE_INT8", "dims": [4]}), "TYPE_FP32"),
    (lambda c: c.add_input({"name": "a", "data_type": "TYPE_FP32", "dims": [5]}), "dims"),
    (lambda c: c.add_input({"name": "z", "data_type": "TYPE_FP32"}), "has no 'dims'"),
    (lambda c: c.add_output({"name": "z", "data_type": "TYPE_FP32", "dims": [1], "optional": True}), "may have only"),
    (lambda c: c.set_max_batch_size(2), "max_batch_size 4"),
    (lambda c: c.set_model_transaction_policy({"decoupled": False}), "decoupled True"),
])
def test_auto_complete_refuses_what_contradicts_the_config(change, message):
    existing = config(max_batch_size=4, input=[{"name": "a", "data_type": "TYPE_FP32", "dims": [4]}],
                      model_transaction_policy={"decoupled": True})
    with pytest.raises(ValueError, match=message):
        change(existing)


def test_dynamic_batching_is_refused_beside_another_scheduler():
    with pytest.raises(ValueError, match="sequence_batching"):
        config(sequence_batching={}).set_dynamic_batching()


def test_type_maps_agree_with_tritons_enum():
    assert pb_utils.triton_to_numpy_type(11) is np.float32 and pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.numpy_to_triton_type(np.float32) == 11 and pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.bool_) == 1
    assert pb_utils.triton_string_to_numpy("TYPE_INT64") is np.int64


def test_bytes_tensors_round_trip_through_tritons_serialization():
    data = np.array([b"a", b"", "\u00e9".encode(), b"\x00\x01"], dtype=np.object_)
    serialized = pb_utils.serialize_byte_tensor(data)
    assert serialized[:5] == b"\x01\x00\x00\x00a"
    assert pb_utils.deserialize_bytes_tensor(serialized).tolist() == data.tolist()


def test_tensor_and_request_accessors():
    tensor = pb_utils.Tensor("x", np.arange(4, dtype=np.float32))
    request = pb_utils.InferenceRequest(inputs=[tensor], requested_output_names=[b"y"], model_name=b"m",
                                        parameters={"k": 1})
    assert pb_utils.get_input_tensor_by_name(request, "x") is tensor
    assert pb_utils.get_input_tensor_by_name(request, "nope") is None
    assert request.requested_output_names() == {"y"} and request.model_name == "m"  # a set, as Triton's is
    assert json.loads(request.parameters()) == {"k": 1}
    assert pb_utils.Tensor.from_dlpack("x", tensor.to_dlpack()).as_numpy().tolist() == [0, 1, 2, 3]
    assert pb_utils.Tensor("s", np.array(["a"])).as_numpy().dtype == np.object_


def test_a_response_carries_its_error():
    response = pb_utils.InferenceResponse(error=pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG))
    assert response.has_error() and response.error().message() == "bad"
    assert response.error().code() == pb_utils.TritonError.INVALID_ARG
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL


def test_metrics_keep_their_values_and_refuse_what_prometheus_cannot_show():
    family = pb_utils.MetricFamily("unit_requests", "help", pb_utils.MetricFamily.COUNTER)
    counter = family.Metric(labels={"model": "m"})
    counter.increment(2)
    assert counter.value() == 2
    with pytest.raises(pb_utils.TritonModelException):
        counter.increment(-1)
    with pytest.raises(pb_utils.TritonModelException):
        counter.set(1)
    with pytest.raises(pb_utils.TritonModelException, match="not a Prometheus metric name"):
        pb_utils.MetricFamily("bad name\n# TYPE x gauge", "help", pb_utils.MetricFamily.GAUGE)
    with pytest.raises(pb_utils.TritonModelException, match="label names"):
        family.Metric(labels={"bad-label": "v"})
    histogram = pb_utils.MetricFamily("unit_sizes", "help", pb_utils.MetricFamily.HISTOGRAM).Metric(buckets=[1, 10])
    for value in (0.5, 5, 50):
        histogram.observe(value)
    assert histogram.state() == ({}, 55.5, [1, 10], [1, 1, 1])
    assert ("unit_requests", "help", "counter", [({"model": "m"}, 2, None, None)]) in pb_utils.MetricFamily.snapshot()


def test_exec_outside_a_served_model_says_where_it_works():
    with pytest.raises(pb_utils.TritonModelException, match="initialize or execute"):
        pb_utils.InferenceRequest(model_name="m").exec()


def test_bytes_tensors_leave_the_model_as_bytes_as_triton_serializes_them():
    out = pb_utils.wire_array(np.array([["é", b"raw"], [3, 1.5]], dtype=np.object_))
    assert out.tolist() == [["é".encode(), b"raw"], [b"3", b"1.5"]] and out.shape == (2, 2)
    numbers = np.arange(3)
    assert pb_utils.wire_array(numbers) is numbers
