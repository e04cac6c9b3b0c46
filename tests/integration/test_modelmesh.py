"""KServe ModelMesh's runtime API driven as ModelMesh drives a runtime: status at its start, then loads
with sizes, inference with the model id injected into `model_name`, unloads, and a load that does not
fit. grpcio's own client; the messages on the wire are checked against the published field numbers
byte by byte, so they cannot drift with the server's own declaration of them."""

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests import grpc_clients
from tests.builders import Scale, fp32_model, gated_load, gates, handler_model, manifest_env, sized_model, wait_for
from tests.conftest import PROJECT
from tests.integration.test_races import joined_a_load

RUNTIME = "/mmesh.ModelRuntime/"


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "at-start")
    puller = root / "_modelmesh"  # where ModelMesh's puller leaves each model, by its id
    fp32_model(puller, "model-a__isvc-1")
    fp32_model(puller, "model-b__isvc-2")
    sized_model(puller, "too-big__isvc-3", 64)
    server_gates = gates(tmp_path_factory.mktemp("gates"), "retried", "cancelled")
    for name, gate in server_gates.items():
        handler_model(puller, f"{name}__isvc-4", gated_load(gate), Scale())
    # as the manifest runs it (its model root: where ModelMesh's puller writes); a model loaded before
    # ModelMesh starts, and the pod's memory limit, are the test's
    env = {**manifest_env(PROJECT / "deploy" / "kserve" / "modelmesh-servingruntime.yaml", "/models"),
           "SERVE_LOAD_MODELS": "at-start", "SERVE_MEMORY_LIMIT": "48MiB",
           "SERVE_LOG_LEVEL": "info"}  # its log says when a call waits for a load under way
    server = start_server(root, **env)
    wait_for(server.grpc_ready, 60, "the gRPC front-end did not answer ready")
    server.puller, server.gates = puller, server_gates
    return server


@pytest.fixture
def channel(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield channel


def call(channel, method: str, request: bytes) -> bytes:
    """One ModelRuntime RPC with the request as bytes on the wire, and the answer's bytes."""
    return channel.unary_unary(RUNTIME + method)(request, timeout=60)


def model_request(model_id: str, path: str = "") -> bytes:
    """LoadModelRequest / PredictModelSizeRequest / UnloadModelRequest / ModelSizeRequest: modelId,
    modelType and modelPath are fields 1, 2 and 3, strings (wire type 2)."""
    encoded = _field(1, model_id.encode())
    if path:
        encoded += _field(2, b"pytorch") + _field(3, path.encode())
    return encoded


def _field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def decode(message: bytes) -> dict[int, list]:
    """A protobuf message's fields by number: varints as ints, length-delimited ones as bytes."""
    fields, offset = {}, 0
    while offset < len(message):
        key, offset = _read_varint(message, offset)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, offset = _read_varint(message, offset)
        elif kind == 2:
            length, offset = _read_varint(message, offset)
            value, offset = message[offset:offset + length], offset + length
        else:
            raise AssertionError(f"field {number} has wire type {kind}")
        fields.setdefault(number, []).append(value)
    return fields


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, offset


def test_runtime_status_reports_the_budget_and_purges_what_is_loaded(server, channel):
    client = grpc_clients.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("at-start")
    status = decode(call(channel, "runtimeStatus", b""))
    assert status[1] == [1]  # READY
    assert status[2] == [48 << 20]  # capacityInBytes: SERVE_MEMORY_LIMIT
    assert status[3][0] >= 1 and status[5][0] > 0 and status[6][0]  # load concurrency, default size, version
    methods = {decode(entry)[1][0].decode(): decode(decode(entry)[2][0]) for entry in status[8]}
    assert methods["inference.GRPCInferenceService/ModelInfer"] == {1: [b"\x01"]}  # idInjectionPath [1], packed
    assert "inference.GRPCInferenceService/ModelStreamInfer" in methods
    assert not client.is_model_ready("at-start"), "the status did not purge the model loaded before ModelMesh"


def test_load_size_infer_unload_as_modelmesh_does(server, channel):
    path = str(server.puller / "model-a__isvc-1")
    predicted = decode(call(channel, "predictModelSize", model_request("model-a__isvc-1", path)))[1][0]
    loaded = decode(call(channel, "loadModel", model_request("model-a__isvc-1", path)))[1][0]
    assert loaded > 0 and predicted > 0
    assert decode(call(channel, "modelSize", model_request("model-a__isvc-1")))[1][0] == loaded
    assert decode(call(channel, "loadModel", model_request("model-a__isvc-1", path)))[1][0] == loaded  # a retry
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = pb.ModelInferRequest(model_name="model-a__isvc-1")  # the id ModelMesh injected
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    answer = stub.ModelInfer(request, timeout=30)
    assert np.frombuffer(answer.raw_output_contents[0], np.float32).shape == (4,)
    assert call(channel, "unloadModel", model_request("model-a__isvc-1")) == b""
    assert call(channel, "unloadModel", model_request("model-a__isvc-1")) == b""  # idempotent
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_load_retried_while_it_runs_shares_its_outcome(server, channel):
    path = str(server.puller / "retried__isvc-4")
    load = channel.unary_unary(RUNTIME + "loadModel")
    first = load.future(model_request("retried__isvc-4", path), timeout=60)
    server.gates["retried"].wait_entered()
    retry = load.future(model_request("retried__isvc-4", path), timeout=60)  # ModelMesh's, after a timeout of its own
    wait_for(lambda: joined_a_load(server, "retried__isvc-4") or retry.done(), message="the retry never arrived")
    server.gates["retried"].release()
    size = decode(first.result())[1][0]
    assert size > 0 and decode(retry.result())[1][0] == size
    assert call(channel, "unloadModel", model_request("retried__isvc-4")) == b""


def test_a_load_modelmesh_cancels_is_undone_by_the_unload_it_sends_next(server, channel):
    """The API's rule: ModelMesh may cancel a load, then sends an unload of it at once; the model must not
    stay loaded once that unload has answered."""
    path = str(server.puller / "cancelled__isvc-4")
    loading = channel.unary_unary(RUNTIME + "loadModel").future(model_request("cancelled__isvc-4", path), timeout=60)
    server.gates["cancelled"].wait_entered()
    loading.cancel()
    unloading = channel.unary_unary(RUNTIME + "unloadModel").future(model_request("cancelled__isvc-4"), timeout=60)
    wait_for(lambda: joined_a_load(server, "cancelled__isvc-4") or unloading.done(), message="the unload never arrived")
    server.gates["cancelled"].release()
    assert unloading.result() == b""
    with pytest.raises(grpc.RpcError) as raised:
        call(channel, "modelSize", model_request("cancelled__isvc-4"))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert not grpc_clients.InferenceServerClient(server.grpc_url).is_model_ready("cancelled__isvc-4")


def test_a_load_that_does_not_fit_is_refused_and_frees_nothing(server, channel):
    path_b = str(server.puller / "model-b__isvc-2")
    call(channel, "loadModel", model_request("model-b__isvc-2", path_b))
    with pytest.raises(grpc.RpcError) as raised:
        call(channel, "loadModel", model_request("too-big__isvc-3", str(server.puller / "too-big__isvc-3")))
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "too-big__isvc-3" in raised.value.details()
    call(channel, "modelSize", model_request("model-b__isvc-2"))  # still loaded: NOT_FOUND otherwise
    # (its size may read 0: a model without weights is charged its load's measured growth, which a heap
    # trimmed meanwhile can bring to nothing)
    predicted = decode(call(channel, "predictModelSize", model_request("too-big__isvc-3", str(server.puller / "too-big__isvc-3"))))
    assert predicted[1][0] >= 64 << 20


@pytest.mark.parametrize("model_id, path, code", [
    ("escape", "/etc", grpc.StatusCode.INVALID_ARGUMENT),  # outside the model root
    ("missing", "_modelmesh/no-such-model", grpc.StatusCode.NOT_FOUND),
    ("bad/id", "_modelmesh/model-b__isvc-2", grpc.StatusCode.INVALID_ARGUMENT),
])
def test_loads_the_trust_rules_refuse(channel, model_id, path, code):
    with pytest.raises(grpc.RpcError) as raised:
        call(channel, "loadModel", model_request(model_id, path))
    assert raised.value.code() == code
    assert "/etc/" not in raised.value.details()
    with pytest.raises(grpc.RpcError) as raised:
        call(channel, "modelSize", model_request("never-loaded"))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
