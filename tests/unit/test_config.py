import pytest

from container.errors import InvalidModel
from container.models.config import instance_count, instance_gpus, parse_json_config, read_config, selected_versions
from container.models.signature import Signature

BASE = b'''{"platform": "pytorch_libtorch", "max_batch_size": 4,
  "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}],
  "output": [{"name": "y", "data_type": "TYPE_STRING", "dims": [-1]}]%s}'''


def config(extra: bytes = b""):
    return parse_json_config(BASE % extra)


def test_json_config_with_version_labels():
    parsed, labels = config(b', "version_labels": {"stable": 2}')
    assert parsed.max_batch_size == 4 and labels == {"stable": 2}
    signature = Signature.from_config(parsed)
    assert signature.inputs[0].datatype == "FP32" and signature.inputs[0].shape == (-1, 3)
    assert signature.outputs[0].datatype == "BYTES"


def test_pbtxt_config(tmp_path):
    (tmp_path / "config.pbtxt").write_text(
        'backend: "pytorch"\ninput [{name: "a" data_type: TYPE_INT64 dims: [2, 2]}]\n'
        'output [{name: "b" data_type: TYPE_BOOL dims: [1]}]\n')
    parsed, labels = read_config(tmp_path)
    assert Signature.from_config(parsed).inputs[0].shape == (2, 2) and labels == {}


@pytest.mark.parametrize("text, message", [
    (b"{", "not valid JSON"),
    (b"[]", "JSON object"),
    (b'{"max_batch_size": "many"}', "ModelConfig"),
    (b'{"unknown_field": 1}', "ModelConfig"),
    (b'{"version_labels": {"stable": "one"}}', "version_labels"),
    (b'{"platform": "tensorflow_savedmodel", "input": [], "output": []}', "tensorflow_savedmodel"),
    (b'{"backend": "onnxruntime"}', "onnxruntime"),
    (b'{"output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}', "no inputs"),
    (b'{"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}]}', "no outputs"),
    (b'{"input": [{"name": "x", "dims": [1]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}', "no data_type"),
    (b'{"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [0]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}', "dims"),
    (b'{"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}, {"name": "x", "data_type": "TYPE_FP32", "dims": [1]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}', "duplicate"),
])
def test_invalid_configs(tmp_path, text, message):
    (tmp_path / "config.json").write_bytes(text)
    with pytest.raises(InvalidModel, match=message):
        read_config(tmp_path)


@pytest.mark.parametrize("policy, expected", [
    (b"", [3]),
    (b', "version_policy": {"latest": {"num_versions": 2}}', [2, 3]),
    (b', "version_policy": {"all": {}}', [1, 2, 3]),
    (b', "version_policy": {"specific": {"versions": [1, 3]}}', [1, 3]),
])
def test_version_policy(policy, expected):
    assert selected_versions(config(policy)[0], [1, 2, 3]) == expected


def test_version_policy_errors():
    with pytest.raises(InvalidModel, match=r"\[4\]"):
        selected_versions(config(b', "version_policy": {"specific": {"versions": [4]}}')[0], [1])
    with pytest.raises(InvalidModel, match="no version directory"):
        selected_versions(config()[0], [])


def test_instances_are_counted_per_listed_gpu_as_triton_counts_them():
    config, _ = parse_json_config(b'{"instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [1, 0]}, '
                                  b'{"kind": "KIND_GPU", "gpus": [1]}, {"count": 3}]}')
    assert instance_count(config) == 2 * 2 + 1 + 3
    assert instance_gpus(config) == ["cuda:1", "cuda:1", "cuda:0", "cuda:0", "cuda:1"]


def test_a_python_backend_config_may_leave_its_tensors_to_auto_complete(tmp_path):
    (tmp_path / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 4\n')
    config, _ = read_config(tmp_path)
    assert config.backend == "python" and not config.input
