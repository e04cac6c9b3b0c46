"""Chaos: clients on every protocol at once (V2 over HTTP and gRPC, a decoupled stream, sequences that cross
both, SageMaker's invocations, TF Serving's predict, BLS and an ensemble, an ExportedProgram, tensors of up to
8 MiB beside the small ones, past the payload limit too, reads of every kind, shared memory regions
registered, unregistered and read by clients at once), loads and unloads through all three control APIs (V2
over HTTP and gRPC, SageMaker's), clients that hang up mid-body, a handler model's pool that may grow, and
SIGKILL to worker processes (and, beyond the smoke run, to front-ends and now and then to the model process
itself), under a memory budget that evicts. Every call has a deadline and a set of answers it may give while
models come and go and processes die; anything else is counted and shown. Then every model is loaded and asked
once more, the server's log is read for the lines only a fault of its own writes, and the run ends as `docker
stop` ends a container: SIGTERM to the master alone while clients call. It found a load that hung for ever, an
ensemble's load failing with a KeyError, evictions that lost sequences, front-ends started again too late, and
stops that hung on gRPC streams or left new clients unanswered; a hunt like it, a region closed under the
request reading it."""

import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import requests
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from bench.harness import Server, mib, run_together, save_model, tree
from bench.python_backend import python_model
from container.logs import SERVER_FAULTS

TITLE = "Chaos: every protocol, loads, unloads, hang-ups and killed processes at once"
DEADLINE = 60  # seconds any call may take; one that takes longer is counted as without an answer
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

REGIONS, REGION_BYTES = 4, 16  # system shared memory regions the clients share, each one [1, 4] FP32 tensor
TENSOR_MODELS = ("scaled", "exported", "doubled", "adder", "relay", "pipeline")
MODELS = (*TENSOR_MODELS, "countdown", "counter", "handler")
PAYLOAD_MB = 6  # SAGEMAKER_MAX_PAYLOAD_IN_MB: the big calls' tensors reach past it
BIG = (1 << 19, 1 << 20, 11 << 17, 2 << 20)  # FP32 values: 2, 4 and 5.5 MiB, which fit, and 8 MiB, which does not


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


def _v2_inputs(name: str) -> list[dict]:
    if name in ("scaled", "exported", "doubled"):
        shape = [4] if name == "doubled" else [1, 4]
        return [{"name": "INPUT__0" if name == "exported" else "x", "shape": shape, "datatype": "FP32", "data": X}]
    return [{"name": "A", "shape": [4], "datatype": "FP32", "data": X}, {"name": "B", "shape": [4], "datatype": "FP32", "data": X}]


def _output(name: str) -> str:
    return {"scaled": "y", "doubled": "y", "pipeline": "y", "exported": "OUTPUT__0"}.get(name, "SUM")


def _expected(name: str) -> list[float]:
    return [v * 4 for v in X] if name == "pipeline" else [v * 2 for v in X]


# What a call may answer while models come and go and processes die: its model unloaded (404), loading,
# its worker or the model process restarting (503), no room (507); a 500 only where a killed worker process is named
# (or, for the relay, where its call to the adder failed so). Any other answer is unexpected.
MAY = {200, 404, 503, 507}
KILLED = ("worker process", "fork server", "did not load", "adder: ")
GRPC_MAY = ("NOT_FOUND", "UNAVAILABLE", "RESOURCE_EXHAUSTED")
# what tritonclient says of a call or stream whose gRPC front-end was killed (or not yet started again)
CUT = ("failed to connect", "Stream removed", "Socket closed", "no longer in valid state", "connection closed")
# a stream's error carries its message alone, not its code: these are the words of 404, 503 and 507
STREAM_MAY = ("unknown model", "no available versions", "still loading", "not loaded", "no room", "being restarted",
              "model process ended", "shutting down")
# a region another client unregistered, or registered first, under the same name
SHM_MAY = ("Unable to find shared memory region", "already in manager")


def allowed(status: int, text: str) -> bool:
    return status in MAY or (status == 500 and any(k in text for k in KILLED))


def grpc_allowed(exc: Exception) -> bool:
    text = str(exc)
    if "StatusCode." not in text:  # a stream's error: its words alone
        return any(words in text for words in STREAM_MAY + KILLED)
    return any(code in text for code in GRPC_MAY) or ("INTERNAL" in text and any(k in text for k in KILLED))


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls: Counter = Counter()
        self.unexpected: Counter = Counter()
        # "unanswered": no answer within the deadline; "cut": a connection a killed front-end dropped
        self.missed = Counter()
        self.sequences = Counter()

    def add(self, call: str, ok: bool, what: str = "", missed: str | None = None) -> None:
        with self.lock:
            self.calls[call] += 1
            if missed is not None:
                self.missed[missed] += 1
            if not ok:
                self.unexpected[(call, what[:160])] += 1


class Client:
    def __init__(self, server: Server, tally: Tally, seed: int, front_ends_killed: bool, regions: list[str]):
        """`front_ends_killed`: a connection may drop with its front-end (else that is unexpected too);
        `regions`: the keys of the shared memory objects, region `chaos<i>` for key i."""
        self.server, self.tally, self.rng = server, tally, random.Random(seed)
        self.front_ends_killed, self.regions = front_ends_killed, regions
        self.http = requests.Session()
        self.tritonclient = httpclient.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=DEADLINE)
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        self.url = server.url

    def act(self) -> None:
        calls = {self.v2: 25, self.grpc_infer: 15, self.stream: 6, self.sequence: 8, self.invocations: 8, self.tf: 4,
                 self.load: 6, self.unload: 4, self.read: 12, self.hang_up: 3, self.shared_memory: 6, self.big: 3}
        call = self.rng.choices(list(calls), list(calls.values()))[0]
        try:
            call(self.rng.choice(MODELS))
        except requests.Timeout:
            self.tally.add(call.__name__, False, "no answer within the deadline", missed="unanswered")
        except OSError as exc:  # its front-end was killed under it (requests' ConnectionError is one too)
            self.tally.add(call.__name__, self.front_ends_killed, repr(exc), missed="cut")

    def v2(self, name: str) -> None:
        name = name if name in TENSOR_MODELS else "scaled"
        answer = self.http.post(f"{self.url}/v2/models/{name}/infer", json={"inputs": _v2_inputs(name)}, timeout=DEADLINE)
        right = answer.status_code != 200 or answer.json()["outputs"][0]["data"] == _expected(name)
        self.tally.add("v2", allowed(answer.status_code, answer.text) and right, f"{answer.status_code} {answer.text}")

    def grpc_infer(self, name: str) -> None:
        name = name if name in TENSOR_MODELS else "scaled"
        inputs = []
        for spec in _v2_inputs(name):
            tensor = grpcclient.InferInput(spec["name"], spec["shape"], "FP32")
            tensor.set_data_from_numpy(np.array(spec["data"], np.float32).reshape(spec["shape"]))
            inputs.append(tensor)
        try:
            result = self.grpc.infer(name, inputs, client_timeout=DEADLINE)
        except Exception as exc:  # noqa: BLE001 — tritonclient raises one type for every status
            self._grpc_failed("grpc", exc)
            return
        output = result.as_numpy(_output(name)).reshape(-1).tolist()
        self.tally.add("grpc", output == _expected(name), f"answered {output}")

    def _grpc_failed(self, call: str, exc: Exception) -> None:
        if "DEADLINE_EXCEEDED" in str(exc):
            self.tally.add(call, False, str(exc), missed="unanswered")
        elif any(words in str(exc) for words in CUT):
            self.tally.add(call, self.front_ends_killed, str(exc), missed="cut")
        else:
            self.tally.add(call, grpc_allowed(exc), str(exc))

    def stream(self, _: str) -> None:
        """Four responses and the final flag from the decoupled model, over one gRPC stream."""
        got, done = [], threading.Event()

        def callback(result, error):
            got.append(error or result)
            final = result is not None and result.get_response().parameters.get("triton_final_response")
            if error is not None or (final is not None and final.bool_param):
                done.set()

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.server.grpc_port}")
        try:
            client.start_stream(callback, stream_timeout=DEADLINE)
            n = grpcclient.InferInput("N", [1], "INT32")
            n.set_data_from_numpy(np.array([4], np.int32))
            client.async_stream_infer("countdown", [n], enable_empty_final_response=True)
            answered = done.wait(DEADLINE)
        except Exception as exc:  # noqa: BLE001
            self._grpc_failed("stream", exc)
            return
        finally:
            client.stop_stream()
            client.close()
        errors = [e for e in got if isinstance(e, Exception)]
        values = [int(r.as_numpy("LEFT")[0]) for r in got if not isinstance(r, Exception) and r.as_numpy("LEFT") is not None]
        whole = not errors and values == [3, 2, 1, 0]
        self.tally.add("stream", answered and (whole or all(grpc_allowed(e) for e in errors)), f"{values} {[str(e) for e in errors]}",
                       missed=None if answered else "unanswered")

    def sequence(self, _: str) -> None:
        """Five requests of one sequence, each over HTTP or gRPC at random, each checked against the total."""
        sequence_id = self.rng.randrange(1, 1 << 40)
        for step in range(5):
            flags = {"sequence_id": sequence_id, "sequence_start": step == 0, "sequence_end": step == 4}
            status, text, total = self._sequence_step(flags)
            if status != 200:
                # a 400 here: the sequence ended with an unload or a reload of its model (never an eviction)
                ended = status == 400 and "START flag" in text
                self.tally.sequences["ended by an unload" if ended else "refused"] += 1
                self.tally.add("sequence", ended or allowed(status, text) or status == 0, f"{status} {text}")
                return
            if total != step + 1:
                self.tally.add("sequence", False, f"step {step + 1} answered a total of {total}")
                return
        self.tally.sequences["whole"] += 1
        self.tally.add("sequence", True)

    def _sequence_step(self, flags: dict) -> tuple[int, str, float | None]:
        """(status, error text, the running total) of one request, over HTTP or gRPC; status 0: a gRPC status
        a model that is gone or busy may answer."""
        if self.rng.random() < 0.5:
            body = {"parameters": flags, "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
            answer = self.http.post(f"{self.url}/v2/models/counter/infer", json=body, timeout=DEADLINE)
            return answer.status_code, answer.text, answer.json()["outputs"][0]["data"][0] if answer.status_code == 200 else None
        one = grpcclient.InferInput("INPUT", [1, 1], "FP32")
        one.set_data_from_numpy(np.ones((1, 1), np.float32))
        try:
            result = self.grpc.infer("counter", [one], sequence_id=flags["sequence_id"], sequence_start=flags["sequence_start"],
                                     sequence_end=flags["sequence_end"], client_timeout=DEADLINE)
        except Exception as exc:  # noqa: BLE001
            text = str(exc)
            if "INVALID_ARGUMENT" in text:
                return 400, text, None
            return (0 if grpc_allowed(exc) else 500), text, None
        return 200, "", float(result.as_numpy("OUTPUT").reshape(-1)[0])

    def invocations(self, name: str) -> None:
        """SageMaker's multi-model invoke, which loads its target on demand."""
        target = "scaled" if name == "scaled" else "handler"
        body = [X] if target == "scaled" else X
        answer = self.http.post(f"{self.url}/invocations", json=body, headers={"X-Amzn-SageMaker-Target-Model": target},
                                timeout=DEADLINE)
        self.tally.add("invocations", allowed(answer.status_code, answer.text) and answer.status_code != 404,
                       f"{answer.status_code} {answer.text}")

    def tf(self, _: str) -> None:
        answer = self.http.post(f"{self.url}/v1/models/scaled:predict", json={"instances": [X]}, timeout=DEADLINE)
        self.tally.add("tf", allowed(answer.status_code, answer.text), f"{answer.status_code} {answer.text}")

    def load(self, name: str) -> None:
        """Through V2 over HTTP or gRPC, or SageMaker's /models; never a 404: a load that answered "not loaded"
        was a fault this scenario found."""
        way = self.rng.choice(("v2", "grpc", "sagemaker"))
        if way == "grpc":
            self._grpc_control("load", lambda: self.grpc.load_model(name, client_timeout=DEADLINE),
                               ("ALREADY_EXISTS", "UNAVAILABLE", "RESOURCE_EXHAUSTED"))
            return
        if way == "v2":
            answer = self.http.post(f"{self.url}/v2/repository/models/{name}/load", timeout=DEADLINE)
        else:
            answer = self.http.post(f"{self.url}/models", json={"model_name": name, "url": name}, timeout=DEADLINE)
        ok = answer.status_code in (200, 409, 503, 507) or (answer.status_code in (400, 500) and any(k in answer.text for k in KILLED))
        self.tally.add("load", ok, f"{answer.status_code} {answer.text}")

    def unload(self, name: str) -> None:
        way = self.rng.choice(("v2", "grpc", "sagemaker"))
        if way == "grpc":
            self._grpc_control("unload", lambda: self.grpc.unload_model(name, client_timeout=DEADLINE), ("NOT_FOUND", "UNAVAILABLE"))
            return
        if way == "v2":
            answer = self.http.post(f"{self.url}/v2/repository/models/{name}/unload", timeout=DEADLINE)
        else:
            answer = self.http.delete(f"{self.url}/models/{name}", timeout=DEADLINE)
        self.tally.add("unload", answer.status_code in (200, 404, 503), f"{answer.status_code} {answer.text}")

    def _grpc_control(self, call: str, act, may: tuple[str, ...]) -> None:
        """A load or unload over gRPC, which may answer the codes `may` names, or fail as a killed worker's load does."""
        try:
            act()
        except Exception as exc:  # noqa: BLE001
            text = str(exc)
            if "DEADLINE_EXCEEDED" in text or any(words in text for words in CUT):
                self._grpc_failed(call, exc)
            else:
                killed = ("INTERNAL" in text or "INVALID_ARGUMENT" in text) and any(k in text for k in KILLED)
                self.tally.add(call, killed or any(code in text for code in may), text)
            return
        self.tally.add(call, True)

    def read(self, name: str) -> None:
        method, path = self.rng.choice([
            ("POST", "/v2/repository/index"), ("GET", f"/v2/models/{name}/stats"), ("GET", "/metrics"),
            ("GET", f"/v2/models/{name}/ready"), ("GET", f"/v2/models/{name}/config"), ("GET", f"/v2/models/{name}"),
            ("GET", "/models"), ("GET", f"/models/{name}"), ("GET", f"/v1/models/{name}"), ("GET", "/ping")])
        answer = self.http.request(method, self.url + path, timeout=DEADLINE)
        self.tally.add("read", answer.status_code in (200, 400, 404, 503), f"{method} {path}: {answer.status_code} {answer.text}")

    def shared_memory(self, _: str) -> None:
        """Register, unregister, or infer through regions the other clients register and unregister too, with
        tritonclient over HTTP or gRPC."""
        index, out = self.rng.randrange(len(self.regions)), self.rng.randrange(len(self.regions))
        over_http = self.rng.random() < 0.5
        client, kind = (self.tritonclient, httpclient) if over_http else (self.grpc, grpcclient)
        what = self.rng.choice(("register", "unregister", "infer", "infer"))
        try:
            if what == "register":
                client.register_system_shared_memory(f"chaos{index}", self.regions[index], REGION_BYTES)
            elif what == "unregister":
                client.unregister_system_shared_memory(f"chaos{index}")
            else:
                tensor = kind.InferInput("x", [1, 4], "FP32")
                tensor.set_shared_memory(f"chaos{index}", REGION_BYTES)
                output = kind.InferRequestedOutput("y", binary_data=True) if over_http else kind.InferRequestedOutput("y")
                output.set_shared_memory(f"chaos{out}", REGION_BYTES)
                client.infer("scaled", [tensor], outputs=[output], **({} if over_http else {"client_timeout": DEADLINE}))
        except Exception as exc:  # noqa: BLE001 — tritonclient raises one type for every status, and its transport's own
            text = str(exc)
            if any(words in text for words in CUT) or isinstance(exc, OSError):
                self.tally.add("shared_memory", self.front_ends_killed, text, missed="cut")
            else:
                self.tally.add("shared_memory", any(words in text for words in SHM_MAY + STREAM_MAY + GRPC_MAY + KILLED), text)
            return
        self.tally.add("shared_memory", True)

    def big(self, _: str) -> None:
        """One tensor of 2 to 8 MiB through `doubled`, binary over HTTP or gRPC: answered whole and right beside
        everyone else's small calls, or, past the payload limit, refused alone (413, RESOURCE_EXHAUSTED)."""
        data = np.arange(self.rng.choice(BIG), dtype=np.float32) + self.rng.randrange(1 << 10)
        too_big = data.nbytes >= PAYLOAD_MB << 20
        over_http = self.rng.random() < 0.5
        kind, client = (httpclient, self.tritonclient) if over_http else (grpcclient, self.grpc)
        tensor = kind.InferInput("x", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        try:
            result = client.infer("doubled", [tensor], **({} if over_http else {"client_timeout": DEADLINE}))
        except Exception as exc:  # noqa: BLE001 — tritonclient raises one type for every status, and its transport's own
            text = str(exc)
            if not over_http and ("DEADLINE_EXCEEDED" in text or any(words in text for words in CUT)):
                self._grpc_failed("big", exc)
            elif isinstance(exc, OSError) or any(words in text for words in CUT):
                self.tally.add("big", self.front_ends_killed, text, missed="cut")
            elif too_big:
                self.tally.add("big", ("[413]" if over_http else "RESOURCE_EXHAUSTED") in text, text)
            else:
                self.tally.add("big", any(words in text for words in ("[404]", "[503]", "[507]", *GRPC_MAY)), text)
            return
        self.tally.add("big", not too_big and np.array_equal(result.as_numpy("y"), data * 2),
                       f"{data.nbytes} bytes answered 200" if too_big else "answered other values")

    def hang_up(self, _: str) -> None:
        """A request whose client leaves before its body is whole: a small JSON body, or a big binary one."""
        if self.rng.random() < 0.5:
            path, kind, body = "relay", "application/json", json.dumps({"inputs": _v2_inputs("relay")}).encode()
        else:
            values = self.rng.choice(BIG[:-1])
            head = json.dumps({"inputs": [{"name": "x", "shape": [values], "datatype": "FP32",
                                           "parameters": {"binary_data_size": values * 4}}]}).encode()
            path, body = "doubled", head + bytes(values * 4)
            kind = f"application/octet-stream\r\nInference-Header-Content-Length: {len(head)}"
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=DEADLINE) as sock:
            sock.sendall(f"POST /v2/models/{path}/infer HTTP/1.1\r\nHost: chaos\r\nContent-Type: {kind}\r\n".encode()
                         + f"Content-Length: {len(body) + 1}\r\n\r\n".encode() + body[: self.rng.randrange(len(body))])
        self.tally.add("hang_up", True)


def kill(server: Server, rng: random.Random, whole: bool, kills: Counter) -> None:
    """SIGKILL to a worker process (a python model's instance, a handler's worker); in a `whole` run, to a
    front-end too, and one time in eight to the model process, which the master starts again."""
    try:
        worker = server.worker_pid()
        candidates = {"worker process": [pid for pid in tree(worker) if pid != worker]}
        if whole:
            candidates["front-end"] = server.http_front_end_pids() + server.grpc_front_end_pids()
            if rng.random() < 1 / 8:
                candidates = {"model process": [worker]}
    except (FileNotFoundError, ProcessLookupError, IndexError):  # a process ended while it was read
        return
    kind = rng.choice([k for k, pids in candidates.items() if pids] or [None])
    if kind is not None:
        try:
            os.kill(rng.choice(candidates[kind]), signal.SIGKILL)
            kills[kind] += 1
        except ProcessLookupError:
            pass


def healthy_after(server: Server) -> list[str]:
    """Each model loaded and asked once more: the ones that did not answer, and why."""
    failures = []
    for name in MODELS:
        load = requests.post(f"{server.url}/v2/repository/models/{name}/load", timeout=DEADLINE)
        if name in TENSOR_MODELS:
            answer = requests.post(f"{server.url}/v2/models/{name}/infer", json={"inputs": _v2_inputs(name)}, timeout=DEADLINE)
        elif name == "handler":
            answer = requests.post(f"{server.url}/models/handler/invoke", json=X, timeout=DEADLINE)
        else:
            answer = load
        if answer.status_code != 200:
            failures.append(f"{name}: {load.status_code}, then {answer.status_code} {answer.text[:200]}")
    return failures


def left_in_shared_memory(server: Server) -> list[str]:
    """The channel's data in /dev/shm that a living process of the server wrote and nobody took, once every
    call has been answered: a leak. (A killed process's own may stay until the next model process exits, or
    the server stops: at most what it had under way when it died.)"""
    left = []
    for path in Path("/dev/shm").glob(f"container-{server.process.pid}-*"):
        writer = int(path.name.split("-")[2])
        if Path(f"/proc/{writer}").exists():
            left.append(path.name)
    return left


def stopped_under_load(server: Server, keys: list[str], clients: int, seconds: float) -> dict:
    """SIGTERM to the master alone, as `docker stop` and Kubernetes send it, `seconds` after `clients` start
    calling: its exit status and seconds to exit, what of it is left (processes, the channel's data in
    /dev/shm), and what the clients met meanwhile. A stop may answer 503 or UNAVAILABLE, refuse a
    connection or drop an idle one; a call gRPC's own stop cancelled (one that arrived in the instant its
    port closed) is counted apart."""
    tally, stop, pids = Tally(), threading.Event(), tree(server.process.pid)

    def client(seed: int) -> None:
        driver = Client(server, tally, seed, front_ends_killed=True, regions=keys)
        while not stop.is_set():
            driver.act()

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients, 2 * clients)]
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    signalled = time.monotonic()
    os.kill(server.process.pid, signal.SIGTERM)
    try:
        status = server.process.wait(DEADLINE)
    except subprocess.TimeoutExpired:
        status = None
    took = time.monotonic() - signalled
    stop.set()
    for thread in threads:
        thread.join(DEADLINE * 2)
    stuck = sum(thread.is_alive() for thread in threads)
    cancelled = sum(n for (_, what), n in tally.unexpected.items() if "CANCELLED" in what)
    return {"status": status, "seconds": took, "stuck": stuck, "cancelled": cancelled,
            "unexpected": sum(tally.unexpected.values()) - cancelled, "unanswered": tally.missed["unanswered"],
            "processes": sum(_alive(pid) for pid in pids),
            "files": len(list(Path("/dev/shm").glob(f"container-{server.process.pid}-*"))),
            "what": [f"{call} ×{n}: {what}" for (call, what), n in tally.unexpected.most_common(5)]}


def _alive(pid: int) -> bool:
    """Whether `pid` runs (an exited one whose new parent, init, has not reaped it yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def faults_logged(log: Path) -> list[str]:
    found = []
    for line in log.read_text().splitlines():
        try:
            if json.loads(line).get("message") in SERVER_FAULTS:
                found.append(line[:300])
        except (ValueError, AttributeError):
            continue
    return found


def run(seconds: float, smoke: bool) -> list[str]:
    clients, seconds = (4, max(seconds, 4)) if smoke else (12, max(seconds, 30))
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        build(root)
        budget = 40 << 20  # room for about four python models' workers: loads evict
        server = Server(root, cores=list(os.sched_getaffinity(0)), SERVE_HTTP_WORKERS="2", SERVE_MEMORY_LIMIT=str(budget),
                        SERVE_LOG_LEVEL="info", SERVE_LOAD_MODELS="*", SERVE_ALLOW_CLIENT_SHM="true",
                        SAGEMAKER_MAX_PAYLOAD_IN_MB=str(PAYLOAD_MB), SAGEMAKER_TS_MAX_WORKERS="3")
        tally, kills, stop = Tally(), Counter(), threading.Event()
        keys = [f"/chaos_{index}_{server.port}" for index in range(REGIONS)]
        regions = [shm.create_shared_memory_region(f"chaos{index}", key, REGION_BYTES) for index, key in enumerate(keys)]
        try:
            for region in regions:
                shm.set_shared_memory_region(region, [np.array([X], np.float32)])

            def client(seed: int) -> None:
                driver = Client(server, tally, seed, front_ends_killed=not smoke, regions=keys)
                while not stop.is_set():
                    driver.act()

            def killer() -> None:
                rng = random.Random(-1)
                while not stop.wait(rng.uniform(0.5, 1.5) if smoke else rng.uniform(1.5, 4)):
                    kill(server, rng, not smoke, kills)  # the smoke run's kills drop no connection

            threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
            stuck = run_together([*threads, threading.Thread(target=killer)], seconds, stop, DEADLINE * 6)
            failures = healthy_after(server)
            left = left_in_shared_memory(server)
            stopped = stopped_under_load(server, keys, clients, 2 if smoke else 5)
            faults = faults_logged(Path(server.log.name))
        finally:
            server.stop()
            for region in regions:
                shm.destroy_shared_memory_region(region)
    unexpected = sum(tally.unexpected.values())
    lines = [
        f"{clients} clients for {seconds:.0f} s over {len(MODELS)} models, a budget of {mib(budget)}, two HTTP front-ends "
        f"and two gRPC ones; SIGKILL to {'worker processes' if smoke else 'worker processes, front-ends and the model process'} "
        f"every {'0.5–1.5' if smoke else '1.5–4'} s ({', '.join(f'{kind} ×{n}' for kind, n in sorted(kills.items()))}). "
        f"Every call has a {DEADLINE} s deadline.",
        "",
        "| calls | unexpected answers | without an answer | clients stuck | cut by a killed front-end | sequences: whole / ended by an unload / refused "
        "| processes killed | healthy after | server faults logged | data left in /dev/shm |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {sum(tally.calls.values()):,} | {unexpected} | {tally.missed['unanswered']} | {stuck} | {tally.missed['cut']} | "
        f"{tally.sequences['whole']} / {tally.sequences['ended by an unload']} / {tally.sequences['refused']} | "
        f"{sum(kills.values())} | {'yes' if not failures else 'no'} | {len(faults)} | {len(left)} |",
        "",
        f"Then SIGTERM to the master alone while {clients} clients call, {2 if smoke else 5} s after they start:",
        "",
        "| exit status | seconds to exit | processes left | data left in /dev/shm | unexpected answers | without an answer "
        "| clients stuck | calls cancelled by gRPC's stop |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {stopped['status']} | {stopped['seconds']:.1f} | {stopped['processes']} | {stopped['files']} | {stopped['unexpected']} | "
        f"{stopped['unanswered']} | {stopped['stuck']} | {stopped['cancelled']} |",
        "",
        "| call | times |",
        "| --- | --- |",
        *(f"| {call} | {n:,} |" for call, n in sorted(tally.calls.items())),
    ]
    for (call, what), n in tally.unexpected.most_common(8):
        lines.append(f"\nUnexpected: {call} ×{n}: {what}")
    lines += [f"\nNot healthy after: {failure}" for failure in failures]
    lines += [f"\nServer fault: {fault}" for fault in faults[:5]]
    lines += [f"\nLeft in /dev/shm: {name}" for name in left[:5]]
    lines += [f"\nDuring the stop: {what}" for what in stopped["what"]]
    return lines
