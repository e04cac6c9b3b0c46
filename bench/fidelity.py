"""Scenario: fidelity. The same calls to tritonserver and to this server, both serving one repository of python
models and an ensemble that each runs unchanged, over HTTP and gRPC; each pair of answers compared. An error is
compared by its status alone (each server says what went wrong in its own words); any other answer whole, but
for the times it carries and the memory this server's statistics add. A difference is one this project chose (KNOWN, with its reason) or one to look at:
each of those is shown in full. Needs Triton (`make bench-triton`); without it, the scenario says so."""

import gzip
import json
import queue
import re
import shutil
import tempfile
import time
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import requests
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from bench.fidelity_models import REPOSITORY, write_repository
from bench.harness import Server
from bench.triton import MISSING, Triton, tritonserver

TITLE = "Fidelity: the same calls to tritonserver and here, and where the answers differ"
_DEADLINE = 30  # seconds, each call
# what statistics carry that no two runs share, and what this server's add: the cache's charge of each version
_LEFT_OUT = ("ns", "last_inference", "memory_usage")

# Differences this project chose, each with its reason (the session notes that measured them say more)
_NOT_THERE = "a model or version that is not there is 404 here, as the status table has it; tritonserver answers 400"
KNOWN = {
    "repository: a version not served, ready?": _NOT_THERE,
    "statistics: an unknown model's": _NOT_THERE,
    "repository: the load of a model not in the repository": "404 here, a client's mistake (the url it names is not "
                                                             "there); tritonserver answers 500",
    "repository: the index over gRPC": "tritonserver's reasons carry a traceback of the model's code; the HTTP index "
                                       "beside it compares without them",
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
    return grpc_call("infer", model, _grpc_inputs(inputs), answer=lambda result: result.get_response(as_json=True),
                     **options)


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


def http_binary(path: str, document: dict):
    """A V2 inference whose answer may be binary: its status, its JSON header, and its binary tail in hex."""
    def call(target) -> tuple:
        answer = requests.post(target.url + path, json=document, timeout=_DEADLINE)
        if answer.status_code >= 400:
            return answer.status_code, None
        size = int(answer.headers.get("Inference-Header-Content-Length", len(answer.content)))
        return answer.status_code, json.loads(answer.content[:size]), answer.content[size:].hex()
    return call


def grpc_call(method: str, *args, answer=lambda result: result, **options):
    """A call of tritonclient's gRPC client: `answer` of what it returned, or the error's status."""
    def call(target) -> tuple:
        with triton_grpc.InferenceServerClient(target.grpc_url.removeprefix("http://")) as client:
            try:
                return "OK", answer(getattr(client, method)(*args, **options, client_timeout=_DEADLINE))
            except InferenceServerException as exc:
                return exc.status(), None
    return call


def settled_index(target) -> list:
    """The repository index once no load or unload is under way (tritonserver answers an unload before it
    ends), a failed load's reason in place of each server's own words for it."""
    deadline = time.monotonic() + _DEADLINE
    while True:
        entries = requests.post(target.url + "/v2/repository/index", timeout=_DEADLINE).json()
        if not any(e.get("state") in ("LOADING", "UNLOADING") for e in entries) or time.monotonic() > deadline:
            return [{**e, "reason": "(why its load failed)"} if e.get("reason") not in (None, "unloaded") else e
                    for e in entries]


def add_model(name: str, like: str):
    """A model put in the repository while both servers run: a copy of `like` under `name`."""
    def call(target) -> str:
        directory = target.repository / name
        if not directory.exists():  # both servers serve one repository: the first call makes it
            shutil.copytree(target.repository / like, directory)
            config = directory / "config.pbtxt"
            config.write_text(config.read_text().replace(f'name: "{like}"', f'name: "{name}"'))
        return "added"
    return call


def metric_families(target) -> list[str]:
    """Triton's per-model metric families /metrics shows for a model."""
    text = requests.get(target.metrics_url, timeout=_DEADLINE).text
    return sorted(set(re.findall(r'^(nv_\w+)\{[^}]*model="double"', text, re.MULTILINE)))


def shared_memory_output(region: shared_memory.SharedMemory, start: int, end: int):
    """What an inference wrote in a shared memory region, in hex."""
    return lambda target: bytes(region.buf[start:end]).hex()


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


def _probes(region: shared_memory.SharedMemory) -> list[tuple[str, str, object]]:
    """(area, label, call) in the order they run: a call's effects (statistics) are read after it."""
    x = {"x": ("FP32", [[1, 2, 3, 4]])}
    return [*_first_probes(x), *_types(x), *_sequences(), *_shared_memory(region), *_repository()]


def _first_probes(x: dict) -> list[tuple[str, str, object]]:
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
        ("repository", "the index", settled_index),
        ("repository", "a model's metadata", http("GET", "/v2/models/total")),
        ("repository", "a model's config", http("GET", "/v2/models/double/config")),
        ("statistics", "a model's", http("GET", "/v2/models/double/stats")),
        ("statistics", "an ensemble's", http("GET", "/v2/models/twice/stats")),
        ("statistics", "an unknown model's", http("GET", "/v2/models/nobody/stats")),
        ("metrics", "a model's Triton families", metric_families),
        ("gRPC", "a model's config", grpc_call("get_model_config", "double", as_json=True)),
        ("gRPC", "a model's metadata", grpc_call("get_model_metadata", "types", as_json=True)),
        ("gRPC", "an unknown model, ready?", grpc_call("is_model_ready", "nobody")),
        ("gRPC", "the unload of a model not loaded", grpc_call("unload_model", "nobody")),
        ("gRPC", "an unknown output", grpc_infer("double", {"x": ("FP32", np.ones((1, 4), np.float32))},
                                                 outputs=[triton_grpc.InferRequestedOutput("z")])),
    ]


def _types(x: dict) -> list[tuple[str, str, object]]:
    """Value types, binary outputs, parameters and codings."""
    values = {"b": ("BOOL", [True, False]), "l": ("INT64", [-(2 ** 62), 2 ** 62]), "u": ("UINT64", [2 ** 63 + 5]),
              "s": ("BYTES", ["héllo", ""])}
    return [
        ("types", "BOOL, INT64, UINT64 and BYTES in JSON", http("POST", "/v2/models/types/infer", json=_v2(values))),
        ("types", "parameters the model reads", http("POST", "/v2/models/types/infer", json={
            **_v2({"b": ("BOOL", [True])}), "parameters": {"custom": "v", "n": 3, "f": True, "sequence_id": 0,
                                                          "priority": 0, "timeout": 0, "binary_data_output": False}})),
        ("types", "BYTES, answered in binary", http_binary("/v2/models/types/infer", {
            **_v2({"s": ("BYTES", ["ab", "c"])}), "outputs": [{"name": "s_out", "parameters": {"binary_data": True}}]})),
        ("types", "every output in binary", http_binary("/v2/models/double/infer", {**_v2(x), "parameters": {
            "binary_data_output": True}})),
        ("types", "every output in binary but one", http_binary("/v2/models/double/infer", {
            **_v2(x), "parameters": {"binary_data_output": True}, "outputs": [{"name": "y", "parameters": {"binary_data": False}}]})),
        ("types", "an unknown output", http("POST", "/v2/models/double/infer", json={**_v2(x), "outputs": [{"name": "z"}]})),
        ("types", "a gzip request, a gzip answer", http("POST", "/v2/models/double/infer", data=gzip.compress(json.dumps(_v2(x)).encode()),
                                                         headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})),
        ("types", "BOOL, FP16 and BYTES over gRPC", grpc_infer("types", {
            "b": ("BOOL", np.array([True, False])), "h": ("FP16", np.array([1.5], np.float16)),
            "s": ("BYTES", np.array([b"a\x00b"], object))})),
    ]


def _sequences() -> list[tuple[str, str, object]]:
    """A sequence's control inputs (START, END, READY, CORRID) as the model receives them."""
    def step(**parameters):
        return http("POST", "/v2/models/controls/infer", json={**_v2({"x": ("FP32", [[1]])}), "parameters": parameters})
    one = {"x": ("FP32", np.ones((1, 1), np.float32))}
    return [
        ("sequences", "no sequence id", step()),
        ("sequences", "the start", step(sequence_id=42, sequence_start=True)),
        ("sequences", "the middle", step(sequence_id=42)),
        ("sequences", "the end", step(sequence_id=42, sequence_end=True)),
        ("sequences", "after the end", step(sequence_id=42)),
        ("sequences", "the start and the end at once", step(sequence_id=43, sequence_start=True, sequence_end=True)),
        ("sequences", "the start over gRPC", grpc_infer("controls", one, sequence_id=77, sequence_start=True)),
        ("sequences", "the end over gRPC", grpc_infer("controls", one, sequence_id=77, sequence_end=True)),
    ]


def _shared_memory(region: shared_memory.SharedMemory) -> list[tuple[str, str, object]]:
    region.buf[:16] = np.array([1, 2, 3, 4], np.float32).tobytes()
    register = {"key": "/" + region.name, "offset": 0, "byte_size": 64}
    def read(offset: int, **output) -> dict:
        return {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {
            "shared_memory_region": "r", "shared_memory_byte_size": 16, "shared_memory_offset": offset}}], **output}
    written = {"outputs": [{"name": "y", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16,
                                                       "shared_memory_offset": 32}}]}
    return [
        ("shared memory", "register", http("POST", "/v2/systemsharedmemory/region/r/register", json=register)),
        ("shared memory", "a region's status", http("GET", "/v2/systemsharedmemory/region/r/status")),
        ("shared memory", "an inference through it", http("POST", "/v2/models/double/infer", json=read(0, **written))),
        ("shared memory", "the output it wrote", shared_memory_output(region, 32, 48)),
        ("shared memory", "a name registered again", http("POST", "/v2/systemsharedmemory/region/r/register", json=register)),
        ("shared memory", "an input past the region's end", http("POST", "/v2/models/double/infer", json=read(56))),
        ("shared memory", "an unknown region", http("POST", "/v2/models/double/infer", json={"inputs": [{
            "name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"shared_memory_region": "q", "shared_memory_byte_size": 16}}]})),
        ("shared memory", "unregister", http("POST", "/v2/systemsharedmemory/region/r/unregister")),
        ("shared memory", "unregister again", http("POST", "/v2/systemsharedmemory/region/r/unregister")),
        ("shared memory", "unregister over gRPC, unknown", grpc_call("unregister_system_shared_memory", "q")),
        ("shared memory", "the status after", http("GET", "/v2/systemsharedmemory/status")),
    ]


def _repository() -> list[tuple[str, str, object]]:
    """The index of models in each state: never loaded, loaded, unloaded, failed."""
    return [
        ("repository", "a failed load, again", http("POST", "/v2/repository/models/broken/load")),
        ("repository", "a model added to the repository", add_model("later", "flat")),
        ("repository", "unload", http("POST", "/v2/repository/models/latest/unload")),
        ("repository", "the index of every state", settled_index),
        ("repository", "the index over gRPC", grpc_call("get_model_repository_index", as_json=True)),
    ]


def run(seconds: float, smoke: bool) -> list[str]:
    if not tritonserver():
        return [MISSING]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        write_repository(root, REPOSITORY)
        region = shared_memory.SharedMemory(create=True, size=64)
        server = Server(root, SERVE_ALLOW_CLIENT_SHM="true")
        try:  # past the model that fails its load: it is one of the calls
            peer = Triton({}, repository=root, arguments=("--model-control-mode=explicit", "--load-model=*",
                                                          "--exit-on-error=false", "--strict-readiness=false"))
        except BaseException:
            server.stop()
            region.unlink()
            raise
        server.repository = peer.repository = root
        try:
            compared = [(area, label, call(peer), call(server)) for area, label, call in _probes(region)]
        finally:
            peer.stop()
            server.stop()
            region.unlink()
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
