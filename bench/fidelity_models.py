"""The repository bench/fidelity.py serves on tritonserver and here alike: python models and an ensemble,
each written to run unchanged on both (tritonserver's python backend finds numpy in `EXECUTION_ENV_PATH`)."""

import shutil
from pathlib import Path

from bench.triton import VENV

DOUBLE_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)])
                for r in requests]
'''
COUNT_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for i in range(int(pb_utils.get_input_tensor_by_name(request, "n").as_numpy()[0])):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("i", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
TOTAL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        answers = []
        for request in requests:
            key = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.totals[key] = 0
            self.totals[key] += int(pb_utils.get_input_tensor_by_name(request, "x").as_numpy().sum())
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("total", np.array([[self.totals[key]]], np.int32))]))
        return answers
'''
SENDS_PY = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            sender = request.get_response_sender()
            if x[0] > 0:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 2)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
SOURCE_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("n", np.array([len(r.inputs())], np.int32))]) for r in requests]
'''

TYPES_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    """Each input back as `<name>_out`, and the request's parameters as the model reads them. By name:
    tritonserver hands a request's inputs in its hash map's order, which no client chooses."""

    def execute(self, requests):
        answers = []
        for request in requests:
            inputs = sorted(request.inputs(), key=lambda tensor: tensor.name())
            outputs = [pb_utils.Tensor(tensor.name() + "_out", tensor.as_numpy()) for tensor in inputs]
            outputs.append(pb_utils.Tensor("parameters", np.array([request.parameters().encode()], dtype=object)))
            answers.append(pb_utils.InferenceResponse(outputs))
        return answers
'''
CONTROLS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    """The sequence batcher's control inputs as the model receives them (-1: absent)."""

    def execute(self, requests):
        answers = []
        for request in requests:
            found = [pb_utils.get_input_tensor_by_name(request, name) for name in ("START", "END", "READY", "CORRID")]
            values = [-1.0 if tensor is None else float(tensor.as_numpy().ravel()[0]) for tensor in found]
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("c", np.array([values], np.float32))]))
        return answers
'''
BROKEN_PY = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no weights here")

    def execute(self, requests):
        return []
'''


def _tensor(name: str, datatype: str, dims: list, optional: bool = False) -> str:
    return f'{{ name: "{name}" data_type: {datatype} dims: {dims}{" optional: true" * optional} }}'


def _config(name: str, inputs: list, outputs: list, extra: str = "", backend: str = 'backend: "python"') -> str:
    tensors = "".join(f'{kind} [ {", ".join(declared)} ]\n' for kind, declared in (("input", inputs), ("output", outputs)) if declared)
    return (f'name: "{name}"\n{backend}\n{extra}\n{tensors}'
            f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{VENV}" }} }}\n')


# types: each echoed; declared in another order than the model answers them (by name, then its parameters):
# a python model's outputs come in the order it gives them, on both servers
_TYPES = (("b", "TYPE_BOOL"), ("h", "TYPE_FP16"), ("l", "TYPE_INT64"), ("s", "TYPE_STRING"), ("u", "TYPE_UINT64"))
CONTROLS = ("sequence_batching { max_sequence_idle_microseconds: 5000000 control_input [\n"
            + "".join(f'  {{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{name} fp32_false_true: [ 0, 1 ] }} ] }},\n'
                      for name in ("START", "END", "READY"))
            + '  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }\n] }')

REPOSITORY = {  # name: (config.pbtxt, model.py or None), in version 1
    "double": (_config("double", [_tensor("x", "TYPE_FP32", [4])], [_tensor("y", "TYPE_FP32", [4])],
                       "max_batch_size: 8\ndynamic_batching { }"), DOUBLE_PY),
    "flat": (_config("flat", [_tensor("x", "TYPE_FP32", [-1])], [_tensor("y", "TYPE_FP32", [-1])]), DOUBLE_PY),
    "count": (_config("count", [_tensor("n", "TYPE_INT32", [1])], [_tensor("i", "TYPE_INT32", [1])],
                      "model_transaction_policy { decoupled: true }"), COUNT_PY),
    "total": (_config("total", [_tensor("x", "TYPE_INT32", [1])], [_tensor("total", "TYPE_INT32", [1])],
                      "max_batch_size: 4\nsequence_batching { max_sequence_idle_microseconds: 5000000 }"), TOTAL_PY),
    "latest": (_config("latest", [_tensor("x", "TYPE_FP32", [-1])], [_tensor("y", "TYPE_FP32", [-1])]), DOUBLE_PY),
    "sends": (_config("sends", [_tensor("x", "TYPE_FP32", [4])], [_tensor("y", "TYPE_FP32", [4])]), SENDS_PY),
    "source": (_config("source", [], [_tensor("n", "TYPE_INT32", [1])]), SOURCE_PY),
    "twice": (_config("twice", [_tensor("x", "TYPE_FP32", [4])], [_tensor("y", "TYPE_FP32", [4])],
                      'max_batch_size: 8\nensemble_scheduling { step [\n'
                      '  { model_name: "double" model_version: -1 input_map { key: "x" value: "x" } output_map { key: "y" value: "mid" } },\n'
                      '  { model_name: "double" model_version: -1 input_map { key: "x" value: "mid" } output_map { key: "y" value: "y" } }\n'
                      '] }', backend='platform: "ensemble"'), None),
    "types": (_config("types", [_tensor(name, datatype, [-1], optional=True) for name, datatype in _TYPES],
                      [_tensor("parameters", "TYPE_STRING", [1]),
                       *(_tensor(f"{name}_out", datatype, [-1]) for name, datatype in reversed(_TYPES))]), TYPES_PY),
    "controls": (_config("controls", [_tensor("x", "TYPE_FP32", [1])], [_tensor("c", "TYPE_FP32", [4])],
                         "max_batch_size: 2\n" + CONTROLS), CONTROLS_PY),
    "broken": (_config("broken", [_tensor("x", "TYPE_FP32", [1])], [_tensor("y", "TYPE_FP32", [1])]), BROKEN_PY),
}


def write_repository(root: Path, models: dict) -> None:
    """`models` ({name: (config.pbtxt, model.py or None)}) under `root`, each in version 1; `latest` in
    version 2 as well (the default policy serves version 2 alone)."""
    for name, (config, model_py) in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        if model_py is not None:
            (root / name / "1" / "model.py").write_text(model_py)
    if "latest" in models:
        shutil.copytree(root / "latest" / "1", root / "latest" / "2")
