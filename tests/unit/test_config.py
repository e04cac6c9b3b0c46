import pytest

from container.errors import InvalidModel
from container.models.config import (
    config_document,
    instance_count,
    instance_gpus,
    normalize,
    parse_json_config,
    read_config,
    selected_versions,
)
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
    # configs Triton refuses (measured on tritonserver 2.51), which loaded here
    (b'{"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [8]}, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}', "preferred_batch_size 8 must be within 1..4"),
    (b'{"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [0]}, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}', "preferred_batch_size 0 must be within 1..4"),
    (b'{"dynamic_batching": {"preferred_batch_size": [2]}, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}', "preferred_batch_size 2 must be within 1..0"),
    (b'{"max_batch_size": 4, "sequence_batching": {"oldest": {"preferred_batch_size": [5]}}, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}', "sequence_batching oldest"),
    (b'{"instance_group": [{"kind": "KIND_CPU", "gpus": [0]}], "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}', "has kind KIND_CPU but specifies one or more GPUs"),
    (b'{"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": []}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}',
     "input 'x' has no dims"),
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
    with pytest.raises(InvalidModel, match="num_versions must be at least 1"):
        selected_versions(config(b', "version_policy": {"latest": {"num_versions": 0}}')[0], [1])
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


GROUP_DEFAULTS = {"gpus": [], "secondary_devices": [], "profile": [], "passive": False, "host_policy": ""}


def normalized(extra: bytes, device: str = "cpu") -> dict:
    parsed, _ = config(extra)
    normalize(parsed, "m", device)
    return config_document(parsed)


def groups(*shown: dict) -> list[dict]:
    return [{**GROUP_DEFAULTS, **group} for group in shown]


@pytest.mark.parametrize("extra, device, field, expected", [
    # a group's name, kind and count as Triton's NormalizeInstanceGroup fills them; its kind says where it runs
    (b"", "cpu", "instance_group", groups({"name": "m", "kind": "KIND_CPU", "count": 1})),
    (b"", "cuda:1", "instance_group", groups({"name": "m", "kind": "KIND_GPU", "count": 1, "gpus": [1]})),
    (b', "instance_group": [{"count": 2}, {"name": "g"}]', "cpu", "instance_group",
     groups({"name": "m_0", "kind": "KIND_CPU", "count": 2}, {"name": "g", "kind": "KIND_CPU", "count": 1})),
    (b', "instance_group": [{"kind": "KIND_GPU", "gpus": [0, 1]}]', "cuda:0", "instance_group",
     groups({"name": "m_0", "kind": "KIND_GPU", "count": 1, "gpus": [0, 1]})),
    (b', "instance_group": [{"kind": "KIND_GPU", "gpus": [0]}]', "cpu", "instance_group",  # no GPU here: it runs on CPU
     groups({"name": "m_0", "kind": "KIND_CPU", "count": 1})),
    (b', "instance_group": [{"kind": "KIND_CPU", "count": 3}]', "cuda:0", "instance_group",
     groups({"name": "m_0", "kind": "KIND_CPU", "count": 3})),
    (b', "instance_group": [{"count": -1}]', "cpu", "instance_group", groups({"name": "m_0", "kind": "KIND_CPU", "count": 1})),
    # the rest of NormalizeModelConfig
    (b"", "cpu", "version_policy", {"latest": {"num_versions": 1}}),
    (b', "version_policy": {"all": {}}', "cpu", "version_policy", {"all": {}}),
    (b', "dynamic_batching": {}', "cpu", "dynamic_batching", {"preferred_batch_size": [4], "max_queue_delay_microseconds": 0,
                                                            "preserve_ordering": False, "priority_levels": 0,
                                                            "default_priority_level": 0, "priority_queue_policy": {}}),
    (b', "dynamic_batching": {"preferred_batch_size": [2]}', "cpu", "dynamic_batching.preferred_batch_size", [2]),
    (b', "sequence_batching": {}', "cpu", "sequence_batching.max_sequence_idle_microseconds", 1_000_000),
    (b', "sequence_batching": {"oldest": {}}', "cpu", "sequence_batching.oldest.preferred_batch_size", [4]),
    (b', "optimization": {"input_pinned_memory": {"enable": false}}', "cpu", "optimization.input_pinned_memory", {"enable": False}),
    (b"", "cpu", "optimization.output_pinned_memory", {"enable": True}),
    # the backend's platform and file (AutoCompleteBackendFields)
    (b"", "cpu", "default_model_filename", ""),  # a platform written in the config: Triton leaves the file name out
    (b', "platform": "", "backend": "pytorch"', "cpu", "platform", "pytorch_libtorch"),
    (b', "platform": ""', "cpu", "platform", "pytorch_libtorch"),  # neither named: a TorchScript model's files
    (b', "platform": ""', "cpu", "backend", "pytorch"),
    (b', "platform": "", "backend": "pytorch"', "cpu", "default_model_filename", "model.pt"),
    (b', "platform": "torch_aoti"', "cpu", "default_model_filename", "model.pt2"),
    (b', "platform": "torch_aoti"', "cpu", "backend", "pytorch"),
    (b', "platform": "", "backend": "python"', "cpu", "default_model_filename", "model.py"),
    (b', "platform": "", "backend": "python"', "cpu", "platform", ""),
])
def test_a_loaded_config_is_normalised_as_triton_normalises_it(extra, device, field, expected):
    document = normalized(extra, device)
    for key in field.split("."):
        document = document[key]
    assert document == expected


def test_an_ensemble_s_config_gets_a_version_policy_and_no_instances_or_pinned_memory():
    document = normalized(b', "platform": "ensemble", "ensemble_scheduling": {"step": []}')
    assert document["version_policy"] == {"latest": {"num_versions": 1}}
    assert document["instance_group"] == [] and "optimization" not in document
    assert document["model_transaction_policy"] == {"decoupled": False}
