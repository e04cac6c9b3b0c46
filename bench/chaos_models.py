"""The repository the chaos run serves: TorchScript models with and without batching, an ExportedProgram,
python models (one that adds, one that relays to it through BLS, a decoupled countdown), an ensemble of two
adds, a sequence model with implicit state, and a SageMaker handler model; and what each is sent and answers."""

import json
from pathlib import Path

import torch

from bench.harness import save_model
from bench.python_backend import python_model

X = [1.0, 2.0, 3.0, 4.0]


def _tensor(name: str, data_type: str = "TYPE_FP32", dims=(4,)) -> dict:
    return {"name": name, "data_type": data_type, "dims": list(dims)}


class Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Counting(torch.nn.Module):
    """A sequence's running total of its inputs, kept as implicit state."""

    def forward(self, INPUT: torch.Tensor, STATE_IN: torch.Tensor):
        total = STATE_IN + INPUT
        return total, total


ADDER_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SUM", pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
                                                            + pb_utils.get_input_tensor_by_name(r, "B").as_numpy())])
                for r in requests]
'''

# A BLS call to `adder`; its error becomes this request's, in words that name the model it called.
RELAY_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("A", "B")]
            answer = pb_utils.InferenceRequest(model_name="adder", requested_output_names=["SUM"], inputs=inputs).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("adder: " + answer.error().message())))
            else:
                responses.append(pb_utils.InferenceResponse(answer.output_tensors()))
        return responses
'''

# Decoupled: N in, then N responses (N-1 … 0) and the final flag on its own.
COUNTDOWN_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for left in range(n - 1, -1, -1):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("LEFT", np.array([left], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

TENSOR_MODELS = ("scaled", "exported", "doubled", "adder", "relay", "pipeline")
MODELS = (*TENSOR_MODELS, "countdown", "counter", "handler")


def build(root: Path) -> None:
    save_model(root, "scaled", Scaled(), {"backend": "pytorch", "max_batch_size": 8, "dynamic_batching": {},
                                          "input": [_tensor("x")], "output": [_tensor("y")]})
    save_model(root, "doubled", Scaled(), {"backend": "pytorch", "max_batch_size": 0,
                                           "input": [_tensor("x", dims=(-1,))], "output": [_tensor("y", dims=(-1,))]})
    (root / "exported" / "1").mkdir(parents=True)
    rows = torch.export.Dim("rows", min=1, max=8)
    torch.export.save(torch.export.export(Scaled(), (torch.ones(2, 4),), dynamic_shapes=({0: rows},)),
                      root / "exported" / "1" / "model.pt2")
    (root / "exported" / "config.json").write_text(json.dumps({
        "platform": "torch_export", "max_batch_size": 8, "dynamic_batching": {},
        "input": [_tensor("INPUT__0")], "output": [_tensor("OUTPUT__0")]}))
    ab = {"max_batch_size": 0, "input": [_tensor("A"), _tensor("B")], "output": [_tensor("SUM")]}
    python_model(root, "adder", ab, ADDER_PY)
    python_model(root, "relay", ab, RELAY_PY)
    python_model(root, "countdown", {"max_batch_size": 0, "model_transaction_policy": {"decoupled": True},
                                     "input": [_tensor("N", "TYPE_INT32", (1,))], "output": [_tensor("LEFT", "TYPE_INT32", (1,))]},
                 COUNTDOWN_PY)
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.json").write_text(json.dumps({
        "name": "pipeline", "platform": "ensemble", "input": [_tensor("A"), _tensor("B")], "output": [_tensor("y")],
        "ensemble_scheduling": {"step": [
            {"model_name": "adder", "model_version": -1, "input_map": {"A": "A", "B": "B"}, "output_map": {"SUM": "sum"}},
            {"model_name": "adder", "model_version": -1, "input_map": {"A": "sum", "B": "sum"}, "output_map": {"SUM": "y"}}]}}))
    save_model(root, "counter", Counting(), {
        "backend": "pytorch", "max_batch_size": 4, "input": [_tensor("INPUT", dims=(1,))], "output": [_tensor("OUTPUT", dims=(1,))],
        "sequence_batching": {"max_sequence_idle_microseconds": 5_000_000, "state": [
            {"input_name": "STATE_IN", "output_name": "STATE_OUT", "data_type": "TYPE_FP32", "dims": [1],
             "initial_state": [{"data_type": "TYPE_FP32", "dims": [1], "zero_data": True, "name": "zeros"}]}]}})
    (root / "handler").mkdir()
    torch.jit.script(Scaled()).save(str(root / "handler" / "model.pt"))  # the toolkit's default handlers serve it


def v2_inputs(name: str) -> list[dict]:
    if name in ("scaled", "exported", "doubled"):
        shape = [4] if name == "doubled" else [1, 4]
        return [{"name": "INPUT__0" if name == "exported" else "x", "shape": shape, "datatype": "FP32", "data": X}]
    return [{"name": "A", "shape": [4], "datatype": "FP32", "data": X}, {"name": "B", "shape": [4], "datatype": "FP32", "data": X}]


def output_name(name: str) -> str:
    return {"scaled": "y", "doubled": "y", "pipeline": "y", "exported": "OUTPUT__0"}.get(name, "SUM")


def expected(name: str) -> list[float]:
    return [v * 4 for v in X] if name == "pipeline" else [v * 2 for v in X]
