"""The trust boundary, tried as an attacker who reaches the port: one test per class of attack against
the real server with its default settings, and the relaxations switched on to show each does what the
README says and no more. After every attack: the answer, a canary that must not exist, the same
worker process, no descriptor, scratch directory or thread left behind, and /ping answering."""

import base64
import json
import os
import select
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import orjson
import psutil
import pytest
import requests
import tritonclient.http as http
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health, health_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from container.grpc_api import modelmesh_service
from container.settings import API_GROUPS
from tests import grpc_clients
from tests.builders import (
    Gate,
    Scale,
    archive,
    descriptors,
    fp32_model,
    gated_load,
    handler_model,
    tensor,
    triton_model,
    wait_for,
)
from tests.integration.test_observability import log_lines
from tests.integration.test_scheduling import SEQUENCE, Accumulate

ADMIN = {"admin-key": "s3cret"}  # the relaxed server's model-repository key; harmless elsewhere
PING_DEADLINE = 2  # seconds: /ping must answer within this while an attack goes on
CANARY_CODE = """
from pathlib import Path
Path({canary!r}).write_text("client code ran")

def predict_fn(data, model):
    return model(data)
"""


def sequence_model(root: Path, name: str, **changes) -> Path:
    config = {**SEQUENCE, "max_sequence_idle_microseconds": 60_000_000, **changes}
    return triton_model(root, name, Accumulate(), [tensor("INPUT", "TYPE_FP32", [1])],
                        [tensor("OUTPUT", "TYPE_FP32", [1]), tensor("CONTROLS", "TYPE_FP32", [4])], max_batch_size=1,
                        sequence_batching=config)


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> Gate:
    return Gate(tmp_path_factory.mktemp("gates"), "load")


@pytest.fixture(scope="module")
def root(tmp_path_factory, gate):
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "mlp", Scale(2.0))
    handler_model(root, "slowload", gated_load(gate), Scale())
    sequence_model(root, "accumulate")
    secret = tmp_path_factory.mktemp("secret") / "secret.txt"
    secret.write_text("the-file-content-canary\n")
    handler_model(root, "expands", None, Scale())
    (root / "expands" / "code").mkdir()
    (root / "expands" / "code" / "requirements.txt").write_text("numpy\n!${SERVE_TEST_SECRET}\n")
    for name, target in (("reads", secret), ("missing", secret.with_name("absent.txt"))):
        handler_model(root, name, None, Scale())
        (root / name / "code").mkdir()
        (root / name / "code" / "requirements.txt").write_text(f"-r {target}\n")
    return root


class Watched:
    """A server and what must not change while it is attacked."""

    def __init__(self, server, scratch: Path):
        self.server, self.scratch = server, scratch
        self.pid = server.worker_pid()

    def scratch_entries(self) -> list[Path]:
        """What is in the temporary directory and in the worker's own scratch directory within it."""
        own = self.scratch / f"container-{self.server.process.pid}" / f"worker-{self.pid}"
        return sorted([*self.scratch.iterdir(), *own.iterdir()])

    def descriptors(self) -> list[str]:
        """What the worker's descriptors point at, for a failure's message."""
        return sorted(descriptors(self.pid))

    def no_client_connected(self) -> bool:
        """No TCP connection to the server's port is established (its own listener aside)."""
        port = f":{self.server.port:04X} "
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
        return not any(line.split()[1].endswith(port.strip()) and line.split()[3] == "01" for line in lines)

    def level(self) -> tuple[int, int, int, int]:
        """(descriptors, threads, processes below it, scratch directories) of the worker process."""
        return (len(os.listdir(f"/proc/{self.pid}/fd")), len(os.listdir(f"/proc/{self.pid}/task")),
                len(psutil.Process(self.pid).children(recursive=True)), len(self.scratch_entries()))

    def leaves_nothing(self, attack, rounds: int = 3) -> None:
        """After `attack` has run once (thread pools grow to what they need, the fork server starts, for
        good), `rounds` more leave descriptors, threads and scratch entries where they were (a closed
        client's socket is closed by the server once it reads the end of the stream)."""
        attack()
        wait_for(self.no_client_connected, 10, "the server kept a closed client's connection")
        front_ends = len(self.server.http_pids()) + len(self.server.grpc_pids())  # each holds a channel connection
        wait_for(lambda: self.server.channel_peers() == front_ends, 30, "the front-ends did not all connect")
        level = self.level()
        for _ in range(rounds):
            attack()
        wait_for(lambda: all(now <= then for now, then in zip(self.level(), level, strict=True)), 10,
                 f"{self.level()} did not return to {level}: {self.descriptors()}, {self.scratch_entries()}")

    def still_serving(self) -> None:
        assert self.server.worker_pid() == self.pid, "the worker process was replaced"
        assert requests.get(self.server.url + "/ping", timeout=PING_DEADLINE).status_code == 200
        answer = self.server.invoke("mlp", [[1, 2, 3, 4]])
        assert answer.status_code == 200 and answer.json() == [[2, 4, 6, 8]], answer.text


def start_watched(start_server, root: Path, scratch: Path, **env) -> Watched:
    scratch.mkdir()
    server = start_server(root, TMPDIR=str(scratch), SERVE_TEST_SECRET="the-variable-canary", PIP_NO_INDEX="1",
                          SERVE_REQUIREMENTS_CACHE=str(scratch.parent / f"{scratch.name}-requirements"), **env)
    assert server.request("POST", "/models", json={"model_name": "mlp", "url": "mlp"}, headers=ADMIN).status_code == 200
    return Watched(server, scratch)


@pytest.fixture(scope="module")
def default(start_server, root, tmp_path_factory):
    """The server as it ships: every relaxation off."""
    return start_watched(start_server, root, tmp_path_factory.mktemp("default") / "tmp")


@pytest.fixture(scope="module")
def relaxed(start_server, root, tmp_path_factory):
    """Model files and client shared memory allowed; model control, statistics, and the trace and log
    settings behind headers."""
    return start_watched(start_server, root, tmp_path_factory.mktemp("relaxed") / "tmp", SERVE_ALLOW_MODEL_FILES="true",
                         SERVE_ALLOW_CLIENT_SHM="true", SERVE_MAX_SHM_REGIONS="2", SERVE_MAX_TOTAL_INSTANCES="4", SAGEMAKER_MODEL_SERVER_TIMEOUT="3",
                         SERVE_RESTRICTED_API="model-repository,shared-memory:admin-key=s3cret;statistics:stats-key=x;"
                                              "trace,logging:ops-key=l0g")


def refused(answer: requests.Response, status: int, *words: str) -> str:
    assert answer.status_code == status, (answer.status_code, answer.text[:500])
    message = answer.json()["error"]
    for word in words:
        assert word in message, (word, message)
    return message


def load_with(server, name: str, headers=None, **parameters) -> requests.Response:
    return server.request("POST", f"/v2/repository/models/{name}/load", json={"parameters": parameters}, headers=headers)


@pytest.fixture
def triton():
    """tritonclient's HTTP clients for a test, closed after it: their pooled connections would otherwise
    stay open, and hold descriptors the leak checks count."""
    made = []

    def client(server):
        made.append(http.InferenceServerClient(server.url.removeprefix("http://")))
        return made[-1]

    yield client
    for each in made:
        each.close()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- client code ---------------------------------------------------------------------------------------

def test_a_load_carrying_model_files_is_refused_and_runs_nothing(default, tmp_path):
    canary = tmp_path / "canary"
    code = b64(CANARY_CODE.format(canary=str(canary)).encode())

    def attack():
        for name in ("fresh", "mlp"):  # a new name, and the operator's model
            refused(load_with(default.server, name, config="{}", **{"file:code/inference.py": code}), 403,
                    "SERVE_ALLOW_MODEL_FILES")
            refused(load_with(default.server, name, config=json.dumps({"backend": "pytorch"}),
                              **{"file:1/model.pt": b64(b"any TorchScript")}), 403, "SERVE_ALLOW_MODEL_FILES")
        client = http.InferenceServerClient(default.server.url.removeprefix("http://"))
        with pytest.raises(InferenceServerException, match="SERVE_ALLOW_MODEL_FILES"):
            client.load_model("fresh", config="{}", files={"file:code/inference.py": code.encode()})
        client.close()

    default.leaves_nothing(attack)
    assert not canary.exists()
    assert default.server.request("POST", "/models/fresh/invoke", data=b"x").status_code == 404
    default.still_serving()


def test_allowed_uploads_never_replace_a_model_from_the_root(relaxed, tmp_path):
    canary = tmp_path / "canary"
    code = b64(CANARY_CODE.format(canary=str(canary)).encode())
    refused(load_with(relaxed.server, "mlp", ADMIN, config="{}", **{"file:code/inference.py": code}), 403,
            "comes from the model root")
    refused(load_with(relaxed.server, "accumulate", ADMIN, config="{}", **{"file:code/inference.py": code}), 403,
            "comes from the model root")  # under the root, though not loaded
    assert not canary.exists()
    relaxed.still_serving()  # mlp still doubles: the operator's model serves
    handler = b64(b"def model_fn(model_dir):\n    return None\n\ndef transform_fn(model, data, content_type, accept):\n"
                  b"    return b'uploaded', 'text/plain'\n")
    for _ in range(2):  # an uploaded model may be replaced by another upload
        answer = load_with(relaxed.server, "uploaded", ADMIN, config="{}", **{"file:code/inference.py": handler})
        assert answer.status_code == 200, answer.text
    assert relaxed.server.request("POST", "/models/uploaded/invoke", data=b"x").text == "uploaded"
    assert relaxed.server.request("POST", "/v2/repository/models/uploaded/unload", headers=ADMIN).status_code == 200


# -- restricted API groups -----------------------------------------------------------------------------

def test_restricted_api_groups_answer_only_with_their_header(relaxed, triton):
    server = relaxed.server
    client = triton(server)
    with pytest.raises(InferenceServerException, match="This API is restricted, expecting header 'admin-key'"):
        client.load_model("mlp")
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        client.load_model("mlp", headers={"admin-key": "wrong"})
    client.load_model("mlp", headers=ADMIN)
    with pytest.raises(InferenceServerException, match="expecting header 'stats-key'"):
        client.get_inference_statistics("mlp")
    assert client.get_inference_statistics("mlp", headers={"stats-key": "x"})["model_stats"]
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        client.get_system_shared_memory_status()
    assert client.get_system_shared_memory_status(headers=ADMIN) == []
    refused(server.request("GET", "/metrics"), 403, "expecting header 'stats-key'")
    refused(server.load("again", "mlp"), 403, "expecting header 'admin-key'")
    refused(server.request("DELETE", "/models/mlp"), 403, "expecting header 'admin-key'")
    refused(server.request("POST", "/v2/repository/index"), 403, "expecting header 'admin-key'")
    # Triton's trace and logging groups, over both protocols (an update is refused before it is read)
    for path in ("/v2/logging", "/v2/trace/setting", "/v2/models/mlp/trace/setting"):
        refused(server.request("GET", path), 403, "expecting header 'ops-key'")
        refused(server.request("POST", path, json={"no": "such setting"}), 403, "expecting header 'ops-key'")
        assert server.request("GET", path, headers={"ops-key": "l0g"}).status_code == 200
    with grpc_clients.InferenceServerClient(server.grpc_url) as rpc:
        for call in (rpc.get_log_settings, rpc.get_trace_settings):
            with pytest.raises(InferenceServerException, match="expecting header 'ops-key'"):
                call()
            assert call(headers={"ops-key": "l0g"})
    # what is not restricted answers everyone
    assert client.get_server_metadata()["name"]
    assert server.request("GET", "/models").status_code == 200 and client.is_model_ready("mlp")
    x = http.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert client.infer("mlp", [x]).as_numpy("y").tolist() == [[2, 2, 2, 2]]
    relaxed.still_serving()


@pytest.fixture(scope="module")
def locked(start_server, root):
    """Every API group behind one header."""
    return start_server(root, SERVE_RESTRICTED_API=f"{','.join(API_GROUPS)}:locked-key=0pen")


def test_with_every_group_restricted_no_route_nor_rpc_answers_without_the_header(locked):
    """Every operation the server documents (/openapi.json: each protocol's, served by a front-end or by
    the model process) and every RPC of its gRPC services (Triton's, ModelMesh's, grpc.health.v1) is
    refused without the header, before it does anything; with it, each protocol answers (over gRPC the
    metadata key bare, or as Triton's clients send it, `triton-grpc-protocol-<key>`)."""
    document = locked.request("GET", "/openapi.json", headers={"locked-key": "0pen"}).json()
    operations = [(method.upper(), path) for path, item in document["paths"].items() for method in item]
    assert len(operations) > 50, operations
    answered = []
    for method, template in operations:
        answer = locked.request(method, template.format(name="mlp", version="1", label="x"))
        if answer.status_code != 403 or "expecting header 'locked-key'" not in answer.json()["error"]:
            answered.append((method, template, answer.status_code))
    assert not answered, f"answered without the header: {answered}"
    assert locked.request("GET", "/v2/health/live", headers={"locked-key": "0pen"}).status_code == 200
    assert locked.request("GET", "/ping").status_code == 403  # SageMaker's probe sends no header: an operator's choice

    with grpc.insecure_channel(locked.grpc_url) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
        for service in (pb.DESCRIPTOR.services_by_name["GRPCInferenceService"], modelmesh_service.SERVICE,
                        health_pb2.DESCRIPTOR.services_by_name["Health"]):
            for method in service.methods:
                code, details = _grpc_status(channel, method)
                if code != grpc.StatusCode.PERMISSION_DENIED or "expecting header 'locked-key'" not in details:
                    answered.append((method.full_name, code, details))
        assert not answered, f"answered without the metadata: {answered}"
        check = channel.unary_unary(f"/{health.SERVICE_NAME}/Check", health_pb2.HealthCheckRequest.SerializeToString,
                                    health_pb2.HealthCheckResponse.FromString)
        answer = check(health_pb2.HealthCheckRequest(), metadata=[("locked-key", "0pen")], timeout=30)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    with grpc_clients.InferenceServerClient(locked.grpc_url) as client:  # as a Triton user's code calls it
        assert client.is_server_live(headers={"triton-grpc-protocol-locked-key": "0pen"})


def _grpc_status(channel: grpc.Channel, method) -> tuple[grpc.StatusCode, str]:
    """The status of one call of `method` with an empty request and no metadata."""
    request = GetMessageClass(method.input_type)()
    path, respond = f"/{method.containing_service.full_name}/{method.name}", GetMessageClass(method.output_type).FromString
    try:
        if method.client_streaming:
            list(channel.stream_stream(path, type(request).SerializeToString, respond)(iter([request]), timeout=30))
        elif method.server_streaming:
            list(channel.unary_stream(path, type(request).SerializeToString, respond)(request, timeout=30))
        else:
            channel.unary_unary(path, type(request).SerializeToString, respond)(request, timeout=30)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


# -- secrets and files in answers ----------------------------------------------------------------------

def test_pip_never_talks_to_the_client(default):
    expands = refused(default.server.load("expands"), 400, "requirements.txt did not install", "server's log")
    assert "the-variable-canary" not in expands and "SERVE_TEST_SECRET" in expands  # the line as written
    reads, missing = (refused(default.server.load(name), 400, "requirements.txt did not install") for name in ("reads", "missing"))
    assert "the-file-content-canary" not in reads and "secret" not in reads
    assert reads == missing  # nor whether the file exists
    pip = [line for line in log_lines(default.server) if line["message"] == "requirements.txt did not install"]
    assert any("the-file-content-canary" in line["pip"] for line in pip)  # the operator's log has it all
    default.still_serving()


# -- wearing the server down: heads, slow clients, connections -----------------------------------------

def attack(server, head: bytes, chunks, limit_s: float = 30) -> tuple[int, bytes, int]:
    """Send `head`, then each of `chunks` while the server has not answered; (bytes sent, the answer, its
    arrival in seconds). Pacing is the wait for the answer, with a deadline."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=limit_s)
    sent, started = 0, time.monotonic()
    try:
        sock.sendall(head)
        for chunk, pause in chunks:
            if select.select([sock], [], [], pause)[0]:
                break
            try:
                sock.sendall(chunk)
            except OSError:  # the server refused and closed while the attack still sent
                break
            sent += len(chunk)
            assert time.monotonic() - started < limit_s, "the server never answered"
        sock.settimeout(limit_s)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return sent, answer, time.monotonic() - started
    finally:
        sock.close()


def status_of(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def test_heads_are_bounded_while_they_arrive(default):
    def endless_value():
        chunks = ((b"a" * 65536, 0) for _ in range(256))  # 16 MiB without a line end
        sent, answer, _ = attack(default.server, b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Long: ", chunks)
        status, message = status_of(answer)
        assert status == 431 and "SERVE_MAX_HEADER_BYTES" in message and sent < 16 << 20  # answered before the end

    def repeated_names():
        # 1,000,000 lines of one name: short, so their count is refused before their bytes are
        lines = (b"X-Same: b\r\n" * 1000 for _ in range(1000))
        sent, answer, _ = attack(default.server, b"GET /ping HTTP/1.1\r\nHost: x\r\n", ((c, 0) for c in lines))
        status, message = status_of(answer)
        assert status == 431 and "more than 100 header fields" in message and sent < 1_000_000 * 11

    default.leaves_nothing(endless_value)
    default.leaves_nothing(repeated_names)
    default.still_serving()


def test_slow_heads_and_bodies_are_ended_with_408(default):
    drip = ((b"x", 0.5) for _ in range(120))  # a byte every half second, until answered
    _, answer, seconds = attack(default.server, b"GET /ping HTTP/1.1\r\nX-Slow: ", drip)
    status, message = status_of(answer)
    assert status == 408 and "SERVE_REQUEST_HEAD_TIMEOUT" in message
    head = b"POST /models/mlp/invoke HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    _, answer, _ = attack(default.server, head, ((b" ", 0.5) for _ in range(120)))
    status, message = status_of(answer)
    assert status == 408 and "SERVE_MIN_BODY_RATE" in message
    default.still_serving()


def test_a_content_length_past_the_limit_is_413_before_the_body(default):
    head = b"POST /models/mlp/invoke HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n"
    sent, answer, _ = attack(default.server, head, ((b"0" * 65536, 0.5) for _ in range(10)))
    status, message = status_of(answer)
    assert status == 413 and "SAGEMAKER_MAX_PAYLOAD_IN_MB" in message and sent == 0
    default.still_serving()


# -- config values with no bound -----------------------------------------------------------------------

def test_costly_config_fields_are_bounded(default, relaxed, root, triton):
    config = orjson.loads((root / "accumulate" / "config.json").read_bytes())
    huge_batch = {**config, "max_batch_size": 2**31 - 1}  # its sequence slots cost nothing until used
    assert load_with(default.server, "accumulate", config=json.dumps(huge_batch)).status_code == 200
    client = triton(default.server)
    x = http.InferInput("INPUT", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    assert client.infer("accumulate", [x], sequence_id=7, sequence_start=True).as_numpy("OUTPUT").tolist() == [[1.0]]
    state = {**SEQUENCE["state"][0], "data_type": "TYPE_STRING", "dims": [1_000_000_000], "initial_state": []}
    huge_state = {**config, "sequence_batching": {**config["sequence_batching"], "state": [state]}}
    refused(load_with(default.server, "accumulate", config=json.dumps(huge_state)), 400, "SERVE_MAX_DECODED_SIZE")
    many = {**orjson.loads((root / "mlp" / "config.json").read_bytes()), "instance_group": [{"count": 3, "kind": "KIND_CPU"}]}
    assert load_with(relaxed.server, "mlp", ADMIN, config=json.dumps(many)).status_code == 200
    two = {**config, "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    refused(load_with(relaxed.server, "accumulate", ADMIN, config=json.dumps(two)), 507, "SERVE_MAX_TOTAL_INSTANCES")  # 3 + 2 > 4
    assert load_with(relaxed.server, "mlp", ADMIN, config=json.dumps({**many, "instance_group": []})).status_code == 200
    default.still_serving()
    relaxed.still_serving()


# -- leaks ---------------------------------------------------------------------------------------------

def test_no_path_leaves_a_descriptor_scratch_directory_or_thread(relaxed, root, tmp_path):
    server = relaxed.server
    config = orjson.loads((root / "mlp" / "config.json").read_bytes())
    model = (root / "mlp" / "1" / "model.pt").read_bytes()
    (root / "broken.tar.gz").write_bytes(b"not a gzip stream")
    fp32_model(tmp_path, "packed")
    archive(tmp_path / "packed", root / "packed.tar.gz")
    shm = Path("/dev/shm") / f"trust_{server.port}"
    shm.write_bytes(bytes(64))
    try:
        def every_path():
            assert load_with(server, "mlp", ADMIN, config=json.dumps(config)).status_code == 200  # an override
            refused(load_with(server, "mlp", ADMIN, config="{not json"), 400)  # a failed override
            refused(load_with(server, "mlp", ADMIN, config=json.dumps({**config, "max_batch_size": "x"})), 400)
            refused(load_with(server, "fresh", ADMIN, config=json.dumps(config), **{"file:1/model.pt": b64(b"junk")}), 400)
            assert load_with(server, "fresh", ADMIN, config=json.dumps(config), **{"file:1/model.pt": b64(model)}).status_code == 200
            assert server.request("POST", "/v2/repository/models/fresh/unload", headers=ADMIN).status_code == 200
            refused(server.request("POST", "/models", json={"model_name": "mlp", "url": "mlp"}, headers=ADMIN), 409)  # conflicting
            refused(server.request("POST", "/models", json={"model_name": "broken", "url": "broken.tar.gz"}, headers=ADMIN), 400)
            assert server.request("POST", "/models", json={"model_name": "packed", "url": "packed.tar.gz"}, headers=ADMIN).status_code == 200
            assert server.request("DELETE", "/models/packed", headers=ADMIN).status_code == 200
            region = {"key": shm.name, "offset": 0, "byte_size": 64}
            assert server.request("POST", "/v2/systemsharedmemory/region/r/register", json=region, headers=ADMIN).status_code == 200
            refused(server.request("POST", "/v2/systemsharedmemory/region/r/register", json=region, headers=ADMIN), 400)
            assert server.request("POST", "/v2/systemsharedmemory/region/r/unregister", headers=ADMIN).status_code == 200

        relaxed.leaves_nothing(every_path)
    finally:
        shm.unlink()
    relaxed.still_serving()


def test_an_override_sent_during_a_load_waits_for_it_and_leaves_no_scratch_directory(relaxed, gate):
    """A second load with a config, sent while the first loads (once refused 409), waits for it, then replaces
    it: each override's directory is removed once its model is replaced or unloaded."""
    server = relaxed.server

    def overrides():
        gate.marker.unlink(missing_ok=True)
        level_before = relaxed.level()
        scratch = len(relaxed.scratch_entries())
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(load_with, server, "slowload", ADMIN, config="{}")  # its model_fn waits at the gate
            gate.wait_entered()
            assert len(relaxed.scratch_entries()) == scratch + 1  # the first override's directory alone
            assert relaxed.level()[2] > level_before[2]  # its worker process, seen by the level
            second = pool.submit(load_with, server, "slowload", ADMIN, config="{}")
            gate.marker.unlink()
            gate.release()
            assert first.result().status_code == 200
            gate.wait_entered()  # the second's load, at the gate in its turn
            gate.release()
            assert second.result().status_code == 200
        assert server.request("POST", "/v2/repository/models/slowload/unload", headers=ADMIN).status_code == 200

    relaxed.leaves_nothing(overrides, rounds=2)  # the worker processes gone, the override directories removed
    relaxed.still_serving()


# -- waits and reads with no end -----------------------------------------------------------------------

def test_a_sequence_backlog_wait_ends(relaxed, root, triton):
    server = relaxed.server  # SAGEMAKER_MODEL_SERVER_TIMEOUT=3; the model has one sequence slot
    assert load_with(server, "accumulate", ADMIN).status_code == 200
    client = triton(server)
    x = http.InferInput("INPUT", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    client.infer("accumulate", [x], sequence_id=1, sequence_start=True)  # holds the slot, idle for a minute
    with pytest.raises(InferenceServerException, match="no free sequence slot within 3 s") as error:
        client.infer("accumulate", [x], sequence_id=2, sequence_start=True)
    assert error.value.status() == "503"
    assert client.infer("accumulate", [x], sequence_id=1, sequence_end=True).as_numpy("OUTPUT").tolist() == [[2.0]]
    assert client.infer("accumulate", [x], sequence_id=2, sequence_start=True, sequence_end=True).as_numpy("OUTPUT").tolist() == [[1.0]]
    relaxed.still_serving()


def test_a_shared_memory_input_larger_than_its_shape_is_refused_unread(relaxed):
    server = relaxed.server
    shm = Path("/dev/shm") / f"trust_big_{server.port}"
    with shm.open("wb") as f:
        f.truncate(64 << 20)  # sparse: reading it whole would cost 64 MiB
    try:
        region = {"key": shm.name, "offset": 0, "byte_size": 64 << 20}
        assert server.request("POST", "/v2/systemsharedmemory/region/big/register", json=region, headers=ADMIN).status_code == 200
        os.truncate(shm, 16)  # a read of the claimed size would now fail as truncated: the answer shows none was tried
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {
            "shared_memory_region": "big", "shared_memory_byte_size": 64 << 20}}]}
        refused(server.request("POST", "/v2/models/mlp/infer", json=body), 400,
                f"unexpected total byte size {64 << 20} for input 'x', expecting 16")
        assert server.request("POST", "/v2/systemsharedmemory/region/big/unregister", headers=ADMIN).status_code == 200
    finally:
        shm.unlink()
    relaxed.still_serving()


def test_shared_memory_regions_are_bounded_in_number(relaxed):
    server = relaxed.server
    shm = Path("/dev/shm") / f"trust_many_{server.port}"
    shm.write_bytes(bytes(16))
    region = {"key": shm.name, "offset": 0, "byte_size": 16}
    try:
        for name in ("one", "two"):  # SERVE_MAX_SHM_REGIONS=2: each holds a descriptor
            assert server.request("POST", f"/v2/systemsharedmemory/region/{name}/register", json=region,
                                  headers=ADMIN).status_code == 200
        refused(server.request("POST", "/v2/systemsharedmemory/region/three/register", json=region, headers=ADMIN), 400,
                "SERVE_MAX_SHM_REGIONS", "unregister one first")
        assert server.request("POST", "/v2/systemsharedmemory/region/one/unregister", headers=ADMIN).status_code == 200
        assert server.request("POST", "/v2/systemsharedmemory/region/three/register", json=region,
                              headers=ADMIN).status_code == 200  # room again
        assert server.request("POST", "/v2/systemsharedmemory/unregister", headers=ADMIN).status_code == 200
    finally:
        shm.unlink()
    relaxed.still_serving()


# -- 500 where a 4xx is due ----------------------------------------------------------------------------

def test_hostile_values_are_client_errors(default, triton):
    deep = "[" * 1000 + "1" + "]" * 1000
    nesting = "JSON nesting depth exceeds maximum allowed limit"  # Triton's words
    refused(default.server.request("POST", "/v1/models/mlp:predict", data=f'{{"instances": {deep}}}'), 400, nesting)
    refused(default.server.request("POST", "/v2/models/mlp/infer", data=(
        f'{{"inputs": [{{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": {deep}}}]}}')), 400, nesting)
    refused(default.server.invoke("mlp", json.loads("[" * 500 + "1" + "]" * 500)), 400, nesting)
    client = triton(default.server)
    assert default.server.load("accumulate").status_code in (200, 409)
    x = http.InferInput("INPUT", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    for sequence_id in (-1, 2**64):  # the CORRID is TYPE_UINT64
        with pytest.raises(InferenceServerException, match="does not fit|sequence_id") as error:
            client.infer("accumulate", [x], sequence_id=sequence_id, sequence_start=True)
        assert error.value.status() == "400"
    for suffix_room in (251, 252, 255):  # a name of up to 255 bytes, its archive suffix past NAME_MAX
        name = "n" * suffix_room
        assert default.server.load(name).status_code == 404
        assert default.server.request("POST", f"/v2/repository/models/{name}/load").status_code in (400, 404)
    default.still_serving()
