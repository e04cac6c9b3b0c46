"""Scenario: Triton python-backend models. The bench's Triton row serves its models through Triton's
python backend with `bench.triton.MODEL_PY`; here the same `model.py`, the same MLP and the same
config (dynamic batching, one instance) are served through this server's python backend too, at 1, 8
and 64 clients over V2 binary tensors; beside them, this server's floor: a model.py that does nothing.
Then a two-step ensemble (python pre-processing feeding the TorchScript MLP) against the same pipeline
written as one SageMaker handler model, both through SageMaker invoke with the same JSON body."""

import contextlib
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from google.protobuf import json_format, text_format

from bench.harness import Server, ratio, save_model, v2_binary_request, wrk
from bench.triton import MISSING, MODEL_PY, Triton, alternately, measure, tritonserver
from container.models.triton_schema import model_config_pb2 as pb

TITLE = "Python-backend models, against Triton's python backend; an ensemble against one handler model"
WIDTH = 256
CONCURRENCIES = (1, 8, 64)

PREPROCESS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            scaled = (raw - raw.mean(axis=-1, keepdims=True)) / (raw.std(axis=-1, keepdims=True) + 1e-6)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCALED", scaled.astype(np.float32))]))
        return responses
'''

# The floor: a model.py that does the least a python model can (each request's input back as its output,
# no torch), so its rows are what this server's HTTP, batcher and worker hop cost alone.
ECHO_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
'''
FLOOR = "this server, echo model.py (floor)"

PIPELINE_HANDLER = '''
import json

import numpy as np
import torch


def input_fn(data, content_type):
    raw = np.asarray(json.loads(data), np.float32)
    return torch.from_numpy((raw - raw.mean(axis=-1, keepdims=True)) / (raw.std(axis=-1, keepdims=True) + 1e-6))


def predict_fn(data, model):
    with torch.inference_mode():
        return model(data)


def output_fn(prediction, accept):
    return json.dumps({"OUTPUT0": prediction.tolist()})
'''


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))
    return torch.jit.script(layers.eval())


def tensor(name: str) -> dict:
    return {"name": name, "data_type": "TYPE_FP32", "dims": [WIDTH]}


def run(seconds: float, smoke: bool) -> list[str]:
    module = mlp()
    config = {"max_batch_size": 64, "input": [tensor("INPUT0")], "output": [tensor("OUTPUT0")], "dynamic_batching": {}}
    values = np.random.default_rng(0).standard_normal((1, WIDTH), np.float32)
    body, headers = v2_binary_request("INPUT0", values)
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as running:
        root = Path(scratch)
        _python_model(root, "mlp_python", module, config)
        _python_model(root, "echo_python", module, config, ECHO_PY)
        _pipeline(root, module, config)
        server = Server(root)
        running.callback(server.stop)
        servers = {"this server": server}
        if tritonserver():
            servers["Triton (python backend)"] = Triton({"mlp_python": (module, {**config, "backend": "python"})})
            running.callback(servers["Triton (python backend)"].stop)
        for each in servers.values():
            each.pin()
            wrk(f"{each.url}/v2/models/mlp_python/infer", body, headers, 8, 1 if smoke else 2)  # warm up
        rows = {(who, c): row for c in CONCURRENCIES
                for who, row in alternately(servers, "/v2/models/mlp_python/infer", body, headers, c, seconds).items()}
        rows.update({(FLOOR, c): measure(server.url, server.process.pid, "/v2/models/echo_python/infer", body, headers, c, seconds)
                     for c in CONCURRENCIES})
        pipeline = _pipeline_rows(server, values, seconds)
    lines = [] if len(servers) > 1 else [MISSING, ""]
    lines += [f"MLP {WIDTH}→{WIDTH}→{WIDTH} in `bench.triton.MODEL_PY` (dynamic batching, one instance), V2 binary. The floor "
              "rows serve `ECHO_PY` (each input back, no torch) in the same config: their ratio is to Triton's MLP.", "",
              "| server | concurrency | requests/s | p50 ms | p99 ms | errors | server CPU µs/request | vs Triton |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    order = {"this server": 0, FLOOR: 1}
    for (who, connections), (load, cpu_us) in sorted(rows.items(), key=lambda r: (order.get(r[0][0], 2), r[0][1])):
        peer = rows.get(("Triton (python backend)", connections)) if who in order else None
        lines.append(f"| {who} | {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | {load.p99_ms:.2f} | "
                     f"{load.errors} | {cpu_us:,.0f} | {ratio(load.requests_per_s, peer[0].requests_per_s) if peer else '—'} |")
    return lines + ["", "Two-step pipeline (standardise each row in Python, then the MLP), SageMaker invoke, JSON:", "",
                    "| model | concurrency | requests/s | p50 ms | p99 ms | errors | vs one handler model |",
                    "| --- | --- | --- | --- | --- | --- | --- |", *pipeline]


def _python_model(root: Path, name: str, module, config: dict, source: str = MODEL_PY) -> None:
    python_model(root, name, config, source)
    module.save(str(root / name / "1" / "model.pt"))


def python_model(root: Path, name: str, config: dict, source: str) -> None:
    """A python-backend model of one instance: `config` and `1/model.py`."""
    directory = root / name
    (directory / "1").mkdir(parents=True)
    message = json_format.ParseDict({**config, "name": name, "backend": "python",
                                     "instance_group": [{"kind": "KIND_CPU", "count": 1}]}, pb.ModelConfig())
    (directory / "config.pbtxt").write_text(text_format.MessageToString(message))
    (directory / "1" / "model.py").write_text(source)


def _pipeline(root: Path, module, config: dict) -> None:
    """`pipeline`: an ensemble of `preprocess` (python) and `mlp_ts` (TorchScript); `pipeline_handler`: both
    steps in one SageMaker handler model."""
    save_model(root, "mlp_ts", module, {**config, "backend": "pytorch"})
    directory = root / "preprocess"
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.py").write_text(PREPROCESS_PY)
    preprocess = {"name": "preprocess", "backend": "python", "max_batch_size": 64, "dynamic_batching": {},
                  "input": [tensor("RAW")], "output": [tensor("SCALED")]}
    (directory / "config.pbtxt").write_text(text_format.MessageToString(json_format.ParseDict(preprocess, pb.ModelConfig())))
    ensemble = {"name": "pipeline", "platform": "ensemble", "max_batch_size": 64, "input": [tensor("RAW")],
                "output": [tensor("OUTPUT0")], "ensemble_scheduling": {"step": [
                    {"model_name": "preprocess", "model_version": -1, "input_map": {"RAW": "RAW"}, "output_map": {"SCALED": "S"}},
                    {"model_name": "mlp_ts", "model_version": -1, "input_map": {"INPUT0": "S"}, "output_map": {"OUTPUT0": "OUTPUT0"}}]}}
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(text_format.MessageToString(json_format.ParseDict(ensemble, pb.ModelConfig())))
    (root / "pipeline_handler" / "code").mkdir(parents=True)
    module.save(str(root / "pipeline_handler" / "model.pt"))
    (root / "pipeline_handler" / "code" / "inference.py").write_text(PIPELINE_HANDLER)


def _pipeline_rows(server: Server, values: np.ndarray, seconds: float) -> list[str]:
    body, headers = json.dumps(values.tolist()).encode(), {"Content-Type": "application/json"}
    rows = {}
    for connections in CONCURRENCIES:
        for name in ("pipeline", "pipeline_handler"):
            rows[name, connections] = wrk(f"{server.url}/models/{name}/invoke", body, headers, connections, seconds)
    return [f"| {name} | {c} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | {load.p99_ms:.2f} | {load.errors} | "
            f"{ratio(load.requests_per_s, rows['pipeline_handler', c].requests_per_s)} |"
            for (name, c), load in rows.items()]
