"""Scenario: fidelity. The same calls to tritonserver and to this server, both serving one repository of python
models and an ensemble that each runs unchanged, over HTTP and gRPC; each pair of answers compared. An error is
compared by its status alone (each server says what went wrong in its own words); any other answer whole, but
for the times it carries and the memory this server's statistics add. A difference is one this project chose (KNOWN, with its reason) or one to look at:
each of those is shown in full. Needs Triton (`make bench-triton`); without it, the scenario says so."""

import json
import queue
import shutil
import tempfile
from pathlib import Path

import numpy as np
import requests
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from bench.harness import Server
from bench.triton import MISSING, VENV, Triton, tritonserver

TITLE = "Fidelity: the same calls to tritonserver and here, and where the answers differ"
_DEADLINE = 30  # seconds, each call
# what statistics carry that no two runs share, and what this server's add: the cache's charge of each version
_LEFT_OUT = ("ns", "last_inference", "memory_usage")

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


def _tensor(name: str, datatype: str, dims: list) -> str:
    return f'{{ name: "{name}" data_type: {datatype} dims: {dims} }}'


def _config(name: str, inputs: list, outputs: list, extra: str = "", backend: str = 'backend: "python"') -> str:
    tensors = "".join(f'{kind} [ {", ".join(declared)} ]\n' for kind, declared in (("input", inputs), ("output", outputs)) if declared)
    return (f'name: "{name}"\n{backend}\n{extra}\n{tensors}'
            f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{VENV}" }} }}\n')


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
}

# Differences this project chose, each with its reason (the session notes that measured them say more)
_NOT_THERE = "a model or version that is not there is 404 here, as the status table has it; tritonserver answers 400"
KNOWN = {
    "repository: a version not served, ready?": _NOT_THERE,
    "statistics: an unknown model's": _NOT_THERE,
    "repository: the load of a model not in the repository": "404 here, a client's mistake (the url it names is not "
                                                             "there); tritonserver answers 500",
    "V2 infer: an ensemble": "tritonserver's ensemble answers carry sequence parameters (`sequence_id` 0, `sequence_start` "
                             "and `sequence_end` false) though the request named no sequence; this server's carry none",
}


def _v2(body: dict) -> dict:
    return {"inputs": [{"name": name, "shape": list(np.shape(value)), "datatype": datatype, "data": np.ravel(value).tolist()}
                       for name, (datatype, value) in body.items()]}


def http(method: str, path: str, **options):
    """A call over HTTP: its status and, answered, its body (JSON, else its bytes)."""
    def call(target) -> tuple:
        answer = requests.request(method, target.url + path, timeout=_DEADLINE, **options)
        if answer.status_code >= 400:
            return answer.status_code, None
        try:
            return answer.status_code, _comparable(answer.json())
        except ValueError:
            return answer.status_code, answer.content
    return call


def grpc_infer(model: str, inputs: dict, **options):
    """ModelInfer through tritonclient: the response message as a dict, or the error's status."""
    def call(target) -> tuple:
        with triton_grpc.InferenceServerClient(target.grpc_url.removeprefix("http://")) as client:
            try:
                result = client.infer(model, _grpc_inputs(inputs), client_timeout=_DEADLINE, **options)
            except InferenceServerException as exc:
                return exc.status(), None
            return "OK", result.get_response(as_json=True)
    return call


def grpc_stream(*sends: dict):
    """ModelStreamInfer through tritonclient, one stream: each answer's id, outputs and final flag, in the
    order they came, or an error's place."""
    def call(target) -> list:
        answers: queue.Queue = queue.Queue()
        with triton_grpc.InferenceServerClient(target.grpc_url.removeprefix("http://")) as client:
            client.start_stream(callback=lambda result, error: answers.put((result, error)), stream_timeout=_DEADLINE)
            for send in map(dict, sends):  # each call sends them again
                client.async_stream_infer(inputs=_grpc_inputs(send.pop("inputs")), **send)
            client.stop_stream()
        received = []
        while not answers.empty():
            result, error = answers.get()
            received.append("error" if error is not None else result.get_response(as_json=True))
        return received
    return call


def _grpc_inputs(inputs: dict) -> list:
    tensors = []
    for name, (datatype, value) in inputs.items():
        tensors.append(triton_grpc.InferInput(name, list(np.shape(value)), datatype))
        tensors[-1].set_data_from_numpy(np.asarray(value, triton_to_np_dtype(datatype)))
    return tensors


def _comparable(document):
    """`document` without what _LEFT_OUT names, at any depth."""
    if isinstance(document, dict):
        return {key: _comparable(value) for key, value in document.items() if key not in _LEFT_OUT}
    if isinstance(document, list):
        return [_comparable(value) for value in document]
    return document


def _probes() -> list[tuple[str, str, object]]:
    """(area, label, call) in the order they run: a call's effects (statistics) are read after it."""
    x = {"x": ("FP32", [[1, 2, 3, 4]])}
    return [
        ("V2 infer", "an answer", http("POST", "/v2/models/double/infer", json=_v2(x))),
        ("V2 infer", "an unknown input", http("POST", "/v2/models/double/infer", json=_v2({"z": ("FP32", [[1, 2, 3, 4]])}))),
        ("V2 infer", "a wrong shape", http("POST", "/v2/models/double/infer", json=_v2({"x": ("FP32", [[1, 2, 3]])}))),
        ("V2 infer", "a wrong datatype", http("POST", "/v2/models/double/infer", json=_v2({"x": ("INT32", [[1, 2, 3, 4]])}))),
        ("V2 infer", "a batch past the most", http("POST", "/v2/models/double/infer", json=_v2({"x": ("FP32", [[1] * 4] * 9)}))),
        ("V2 infer", "an unknown model", http("POST", "/v2/models/nobody/infer", json=_v2(x))),
        ("V2 infer", "an unknown version", http("POST", "/v2/models/double/versions/7/infer", json=_v2(x))),
        ("V2 infer", "a decoupled model", http("POST", "/v2/models/count/infer", json=_v2({"n": ("INT32", [2])}))),
        ("V2 infer", "a model that takes no inputs", http("POST", "/v2/models/source/infer", json={"inputs": []})),
        ("V2 infer", "classification, equal values", http("POST", "/v2/models/flat/infer", json={
            **_v2({"x": ("FP32", [2, 1, 2, 2, 0, 1])}), "outputs": [{"name": "y", "parameters": {"classification": 4}}]})),
        ("V2 infer", "an answer through the response sender", http("POST", "/v2/models/sends/infer", json=_v2({"x": ("FP32", [1, 2, 3, 4])}))),
        ("V2 infer", "the final flag before any response", http("POST", "/v2/models/sends/infer", json=_v2({"x": ("FP32", [0, 2, 3, 4])}))),
        ("V2 infer", "an ensemble", http("POST", "/v2/models/twice/infer", json=_v2(x))),
        ("generate", "an answer", http("POST", "/v2/models/flat/generate", json={"x": [1, 2], "id": "g"})),
        ("generate", "a decoupled model's stream", http("POST", "/v2/models/count/generate_stream", json={"n": 2})),
        ("gRPC", "an answer", grpc_infer("double", x, request_id="r")),
        ("gRPC", "classification", grpc_infer("flat", {"x": ("FP32", np.array([2, 1, 2, 2], np.float32))},
                                              outputs=[triton_grpc.InferRequestedOutput("y", class_count=3)])),
        ("gRPC", "a decoupled model", grpc_infer("count", {"n": ("INT32", np.array([2], np.int32))})),
        ("gRPC", "an unknown model", grpc_infer("nobody", x)),
        ("gRPC stream", "a decoupled model's responses", grpc_stream({"model_name": "count", "inputs": {"n": ("INT32", np.array([3], np.int32))}})),
        ("gRPC stream", "a sequence's answers", grpc_stream(*[
            {"model_name": "total", "inputs": {"x": ("INT32", np.array([[value]], np.int32))}, "sequence_id": 5,
             "sequence_start": value == 1, "sequence_end": value == 4, "request_id": str(value)} for value in (1, 2, 3, 4)])),
        ("V2 infer", "the latest version", http("POST", "/v2/models/latest/infer", json=_v2({"x": ("FP32", [1])}))),
        ("V2 infer", "a version not served", http("POST", "/v2/models/latest/versions/1/infer", json=_v2({"x": ("FP32", [1])}))),
        ("repository", "a version not served, ready?", http("GET", "/v2/models/latest/versions/1/ready")),
        ("repository", "the load of a model not in the repository", http("POST", "/v2/repository/models/nobody/load")),
        ("repository", "the index", http("POST", "/v2/repository/index")),
        ("repository", "a model's metadata", http("GET", "/v2/models/total")),
        ("repository", "a model's config", http("GET", "/v2/models/double/config")),
        ("statistics", "a model's", http("GET", "/v2/models/double/stats")),
        ("statistics", "an ensemble's", http("GET", "/v2/models/twice/stats")),
        ("statistics", "an unknown model's", http("GET", "/v2/models/nobody/stats")),
    ]


def run(seconds: float, smoke: bool) -> list[str]:
    if not tritonserver():
        return [MISSING]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for name, (config, model_py) in REPOSITORY.items():
            (root / name / "1").mkdir(parents=True)
            (root / name / "config.pbtxt").write_text(config)
            if model_py is not None:
                (root / name / "1" / "model.py").write_text(model_py)
        shutil.copytree(root / "latest" / "1", root / "latest" / "2")  # the default policy serves version 2 alone
        server = Server(root)
        try:
            peer = Triton({}, repository=root, arguments=("--model-control-mode=explicit", "--load-model=*"))
        except BaseException:
            server.stop()
            raise
        try:
            compared = [(area, label, call(peer), call(server)) for area, label, call in _probes()]
        finally:
            peer.stop()
            server.stop()
    return _table(compared)


def _table(compared: list) -> list[str]:
    lines = ["Each call to both servers, one after another; an error compared by its status alone.", "",
             "| area | calls | the same | differ, as chosen | differ otherwise |", "| --- | --- | --- | --- | --- |"]
    differing = [(f"{area}: {label}", theirs, ours) for area, label, theirs, ours in compared if theirs != ours]
    chosen = [key for key, *_ in differing if key in KNOWN]
    unexpected = [row for row in differing if row[0] not in KNOWN]
    for area in dict.fromkeys(area for area, *_ in compared):
        calls = [f"{a}: {label}" for a, label, *_ in compared if a == area]
        differ = {key for key, *_ in differing if key in calls}
        lines.append(f"| {area} | {len(calls)} | {len(calls) - len(differ)} | {len(differ & set(chosen))} | "
                     f"{len(differ - set(chosen))} |")
    for key in chosen:
        lines += ["", f"- **{key}**, as chosen: {KNOWN[key]}"]
    for key, theirs, ours in unexpected:
        lines += ["", f"- **{key}** differs: tritonserver `{json.dumps(theirs, default=str)[:400]}`, "
                      f"here `{json.dumps(ours, default=str)[:400]}`"]
    return lines
