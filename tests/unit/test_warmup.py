"""model_warmup samples as Triton makes them: zeros, seeded random values, raw files; batch_size times over."""

import numpy as np
import pytest
from google.protobuf import json_format

from container.errors import InvalidModel
from container.models.triton_schema import model_config_pb2 as pb
from container.models.warmup import warmup_samples


def config(max_batch_size: int, **inputs) -> pb.ModelConfig:
    return json_format.ParseDict({"max_batch_size": max_batch_size, "model_warmup": [
        {"name": "w", "batch_size": 3, "count": 0, "inputs": inputs}]}, pb.ModelConfig())


def test_each_kind_of_data_in_the_inputs_datatype_repeated_over_the_batch(tmp_path):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "tokens").write_bytes(np.arange(2, dtype="<i8").tobytes())
    [sample] = warmup_samples(tmp_path, config(
        4, zeros={"data_type": "TYPE_FP16", "dims": [2], "zero_data": True},
        flags={"data_type": "TYPE_BOOL", "dims": [5], "random_data": True},
        counts={"data_type": "TYPE_INT32", "dims": [5], "random_data": True},
        text={"data_type": "TYPE_STRING", "dims": [1], "random_data": True},  # zeros, as Triton makes them
        tokens={"data_type": "TYPE_INT64", "dims": [2], "input_data_file": "tokens"}))
    assert sample.count == 1  # at least once
    inputs = sample.inputs
    assert {n: (a.dtype.str if a.dtype != object else "O", a.shape) for n, a in inputs.items()} == {
        "zeros": ("<f2", (3, 2)), "flags": ("|b1", (3, 5)), "counts": ("<i4", (3, 5)), "text": ("O", (3, 1)),
        "tokens": ("<i8", (3, 2))}
    assert not inputs["zeros"].any() and inputs["text"].tolist() == [[b""]] * 3
    assert inputs["tokens"].tolist() == [[0, 1]] * 3
    assert (inputs["flags"] == inputs["flags"][0]).all()  # one sample, the same for each batch item


def test_a_model_that_does_not_batch_takes_the_dims_as_they_are(tmp_path):
    sample = config(0, x={"data_type": "TYPE_FP32", "dims": [2, 2], "zero_data": True})
    sample.model_warmup[0].batch_size = 1
    assert warmup_samples(tmp_path, sample)[0].inputs["x"].shape == (2, 2)


@pytest.mark.parametrize("max_batch_size, data, message", [
    (0, {"zero_data": True}, "batch_size must be 1 for a model that does not batch"),
    (2, {"zero_data": True}, "batch_size 3 is past max_batch_size 2"),
    (4, {"input_data_file": "../secret"}, "must be a relative path inside the model directory"),
])
def test_samples_the_model_cannot_take_are_refused(tmp_path, max_batch_size, data, message):
    with pytest.raises(InvalidModel, match=message):
        warmup_samples(tmp_path, config(max_batch_size, x={"data_type": "TYPE_FP32", "dims": [2], **data}))
