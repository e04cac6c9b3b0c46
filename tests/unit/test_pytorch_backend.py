"""The TorchScript backend on its own: datatypes both ways, output shapes, errors of the model's own."""

import threading
from typing import List

import numpy as np
import pytest
import torch

from container.backends.pytorch import Replicas, TorchScriptModel, module_bytes
from container.errors import InvalidInput, ModelError
from container.models.signature import Signature, TensorSpec
from container.models.statistics import Phases


class Echo(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


class Weighted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


class Lines(torch.nn.Module):
    def forward(self, text: List[str]) -> List[str]:
        return [t + "!" for t in text]


class Fails(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.ones(3, 3)


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4, bias=False)
        self.b = self.a  # the same weights twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def backend(tmp_path, module, datatype, shape=(-1, 2)):
    path = tmp_path / "model.pt"
    torch.jit.script(module).save(str(path))
    signature = Signature((TensorSpec("x", datatype, shape),), (TensorSpec("y", datatype, shape),), 4)
    return TorchScriptModel("m", path, signature, "cpu")


def run(model, inputs):
    phases = Phases()
    outputs = model.execute(inputs, None, phases)
    assert phases.infer_ns > 0
    return outputs


@pytest.mark.parametrize("datatype, array", [
    ("FP16", np.array([[1.5, -2]], np.float16)),
    ("BF16", np.array([[1.5, -2]], np.float32)),  # BF16 travels as float32 and is narrowed for torch
    ("BOOL", np.array([[True, False]])),
    ("UINT8", np.array([[255, 0]], np.uint8)),
    ("INT8", np.array([[-128, 127]], np.int8)),
    ("FP64", np.array([[1e300, 0]], np.float64)),
])
def test_datatypes_round_trip(tmp_path, datatype, array):
    result = run(backend(tmp_path, Echo(), datatype), {"x": array})["y"]
    assert result.dtype == array.dtype and np.array_equal(result, array)


def test_read_only_inputs_are_accepted(tmp_path):
    array = np.frombuffer(np.array([[1, 2]], np.float32).tobytes(), np.float32).reshape(1, 2)
    assert run(backend(tmp_path, Echo(), "FP32"), {"x": array})["y"].tolist() == [[1, 2]]


def test_strings_keep_the_configured_shape(tmp_path):
    model = backend(tmp_path, Lines(), "BYTES", shape=(-1, 2))
    text = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=object)
    assert run(model, {"x": text})["y"].tolist() == [[b"a!", b"b!"], [b"c!", b"d!"]]
    with pytest.raises(InvalidInput, match="not UTF-8"):
        run(model, {"x": np.array([[b"\xff", b"a"]], dtype=object)})


def test_model_errors_say_what_went_wrong_in_one_line(tmp_path):
    with pytest.raises(ModelError, match="model 'm' failed: .*cannot be multiplied") as info:
        run(backend(tmp_path, Fails(), "FP32"), {"x": np.zeros((1, 2), np.float32)})
    assert "\n" not in str(info.value)


def test_tied_weights_are_counted_once():
    assert module_bytes(torch.jit.script(Tied())) == {"cpu": 4 * 4 * 4}


def test_a_frozen_model_is_charged_its_weights(tmp_path):
    """torch.jit.freeze turns parameters into graph constants: nothing is left in parameters()."""
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).eval())
    weights = (256 * 256 + 256 + 256 * 8 + 8) * 4
    assert module_bytes(scripted) == {"cpu": weights}
    torch.jit.freeze(scripted).save(str(tmp_path / "frozen.pt"))
    frozen = torch.jit.load(str(tmp_path / "frozen.pt"))
    assert list(frozen.parameters()) == [] and module_bytes(frozen) == {"cpu": weights}


@pytest.mark.parametrize("placement, threads, expected", [([0, 1], 4, [0, 0, 1, 1]), ([1, 1, 0], 3, [0, 1, 1])])
def test_replicas_place_each_execution_thread_as_the_instance_groups_say(tmp_path, placement, threads, expected):
    """Two copies stand in for two GPUs: the instance threads take the copies their placement names,
    each thread keeping to its copy, and the memory is both copies'."""
    copies = [backend(tmp_path, Weighted(), "FP32") for _ in range(2)]
    replicas = Replicas(copies, placement)
    used: dict[int, set[int]] = {}
    calls = [copy.execute for copy in copies]
    for index, copy in enumerate(copies):
        copy.execute = lambda inputs, outputs, phases, index=index: (
            used.setdefault(threading.get_ident(), set()).add(index), calls[index](inputs, outputs, phases))[1]
    start = threading.Barrier(threads)

    def instance():
        start.wait()
        for _ in range(3):
            assert run(replicas, {"x": np.ones((1, 2), np.float32)})["y"].tolist() == [[1, 1]]

    workers = [threading.Thread(target=instance) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert all(len(indexes) == 1 for indexes in used.values()) and len(used) == threads
    assert sorted(next(iter(i)) for i in used.values()) == expected
    assert replicas.memory() == {"cpu": 2 * 2 * 4}
