"""A chaos client's calls, on every protocol, and the answers each may give while models come and go and
processes die (bench/chaos.py runs them)."""

import json
import random
import socket
import threading
from collections import Counter

import numpy as np
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.chaos_models import MODELS, TENSOR_MODELS, X, expected, output_name, v2_inputs
from bench.harness import Server

DEADLINE = 60  # seconds any call may take; one that takes longer is counted as without an answer
REGIONS, REGION_BYTES = 4, 16  # system shared memory regions the clients share, each one [1, 4] FP32 tensor
PAYLOAD_MB = 6  # SAGEMAKER_MAX_PAYLOAD_IN_MB: the big calls' tensors reach past it
BIG = (1 << 19, 1 << 20, 11 << 17, 2 << 20)  # FP32 values: 2, 4 and 5.5 MiB, which fit, and 8 MiB, which does not

# What a call may answer while models come and go and processes die: its model unloaded (404), loading,
# its worker or the model process restarting (503), no room (507); a 500 only where a killed worker process is named
# (or, for the relay, where its call to the adder failed so). Any other answer is unexpected.
MAY = {200, 404, 503, 507}
KILLED = ("worker process", "fork server", "did not load", "adder: ")
GRPC_MAY = ("NOT_FOUND", "UNAVAILABLE", "RESOURCE_EXHAUSTED")
# what tritonclient says of a call or stream whose front-end was killed (or not yet started again): gRPC's
# words, and geventhttpclient's for an HTTP answer's body cut short
CUT = ("failed to connect", "Stream removed", "Socket closed", "no longer in valid state", "connection closed",
       "Incomplete response")
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
        answer = self.http.post(f"{self.url}/v2/models/{name}/infer", json={"inputs": v2_inputs(name)}, timeout=DEADLINE)
        right = answer.status_code != 200 or answer.json()["outputs"][0]["data"] == expected(name)
        self.tally.add("v2", allowed(answer.status_code, answer.text) and right, f"{answer.status_code} {answer.text}")

    def grpc_infer(self, name: str) -> None:
        name = name if name in TENSOR_MODELS else "scaled"
        inputs = []
        for spec in v2_inputs(name):
            tensor = grpcclient.InferInput(spec["name"], spec["shape"], "FP32")
            tensor.set_data_from_numpy(np.array(spec["data"], np.float32).reshape(spec["shape"]))
            inputs.append(tensor)
        try:
            result = self.grpc.infer(name, inputs, client_timeout=DEADLINE)
        except Exception as exc:  # noqa: BLE001 — tritonclient raises one type for every status
            self._grpc_failed("grpc", exc)
            return
        output = result.as_numpy(output_name(name)).reshape(-1).tolist()
        self.tally.add("grpc", output == expected(name), f"answered {output}")

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
            path, kind, body = "relay", "application/json", json.dumps({"inputs": v2_inputs("relay")}).encode()
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


def calling(server: Server, tally: Tally, seed: int, regions: list[str], front_ends_killed: bool, stop: threading.Event) -> None:
    """One client's calls until `stop` (the client is made here, on the thread that uses it)."""
    client = Client(server, tally, seed, front_ends_killed, regions)
    while not stop.is_set():
        client.act()
