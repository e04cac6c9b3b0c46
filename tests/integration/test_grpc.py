"""Triton's GRPCInferenceService: tritonclient.grpc (sync, aio and streaming) and grpcio's own stubs
against the real server, each behaviour checked against the same request over HTTP, so the two
protocols cannot drift. The gRPC front-end is a process of its own; the models live in the worker."""

import asyncio
import json
import os
import signal
import socket
from pathlib import Path

import grpc
import ml_dtypes
import numpy as np
import psutil
import pytest
import requests
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as http
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import model_config_pb2, service_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException, shared_memory

from tests import grpc_clients
from tests.builders import Scale, descriptors, exited, fp32_model, handler_model, sized_model, tensor, triton_model, wait_for
from tests.integration.test_scheduling import SEQUENCE, Accumulate
from tests.integration.test_v2 import DATATYPES, save_models

RESTRICTED = "secret-value-never-shown"


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_models(root)
    triton_model(root, "accumulate", Accumulate(),
                 [tensor("INPUT", "TYPE_FP32", [1])], [tensor("OUTPUT", "TYPE_FP32", [1]), tensor("CONTROLS", "TYPE_FP32", [4])],
                 max_batch_size=4, sequence_batching={**SEQUENCE, "max_sequence_idle_microseconds": 10_000_000})  # no idle release on a slow machine
    fp32_model(root, "later")  # not loaded at start: the repository tests load it
    sized_model(root, "huge", 64)
    handler_model(root, "handler", None, Scale())
    loaded = [f"echo_{d.lower()}" for d in DATATYPES] + ["strings", "addsub", "scores", "accumulate", "handler"]
    server = start_server(root, SERVE_LOAD_MODELS=",".join(loaded), SERVE_ALLOW_CLIENT_SHM="true", SERVE_ALLOW_MODEL_FILES="true",
                          SERVE_MEMORY_LIMIT="48MiB", SERVE_GRPC_COMPRESSION="gzip",  # every answer here compressed
                          SERVE_RESTRICTED_API=f"statistics:x-stats-key={RESTRICTED}")
    wait_for(server.grpc_ready, 60, "the gRPC front-end did not answer ready")
    return server


@pytest.fixture
def client(server):
    client = grpc_clients.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture
def web(server):
    client = http.InferenceServerClient(server.url.removeprefix("http://"))
    yield client
    client.close()


def _grpc_error(call, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        call(*args, **kwargs)
    return raised.value


def _infer_both(client, web, model, arrays: dict, **kwargs):
    """The same request over gRPC and HTTP (binary), and each answer's outputs."""
    answers = []
    for module, target in ((triton_grpc, client), (http, web)):
        inputs = []
        for name, array in arrays.items():
            datatype = "BF16" if array.dtype == ml_dtypes.bfloat16 else triton_grpc.np_to_triton_dtype(array.dtype)
            inputs.append(module.InferInput(name, list(array.shape), datatype))
            inputs[-1].set_data_from_numpy(array, **({"binary_data": True} if module is http else {}))
        answers.append(target.infer(model, inputs, **kwargs))
    return answers


# -- health, metadata, config ------------------------------------------------------------------------


def test_health_and_metadata_answer_as_over_http(client, web):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("addsub") and client.is_model_ready("addsub", "1")
    assert not client.is_model_ready("no_such_model") and not web.is_model_ready("no_such_model")
    assert client.get_server_metadata(as_json=True) == web.get_server_metadata()
    for name in ("addsub", "strings", "scores", "handler", "echo_bf16"):
        assert _metadata(client.get_model_metadata(name, as_json=True)) == web.get_model_metadata(name), name
    assert client.get_model_metadata("addsub", "1", as_json=True)["versions"] == ["1"]


def _metadata(document: dict) -> dict:
    """gRPC's JSON writes int64 shapes as strings and leaves out empty lists; HTTP's does neither."""
    for key in ("inputs", "outputs"):
        document[key] = [{**t, "shape": [int(d) for d in t["shape"]]} for t in document.get(key, [])]
    return document


def test_model_config_is_the_protobuf_http_prints(client, web):
    for name in ("addsub", "accumulate", "scores"):
        over_grpc = client.get_model_config(name).config
        over_http = json_format.ParseDict(web.get_model_config(name), model_config_pb2.ModelConfig())
        assert over_grpc == over_http, name
        assert over_grpc.name == name and over_grpc.platform == "pytorch_libtorch"
    error = _grpc_error(client.get_model_config, "handler")
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "SageMaker handler model" in error.message()


def test_grpc_health_v1_reports_serving(server):
    """The front-end checks the model process each second, and reports what it found."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            check = health_pb2.HealthCheckRequest(service=service)
            wait_for(lambda check=check: stub.Check(check, timeout=10).status == health_pb2.HealthCheckResponse.SERVING, 10,
                     f"health of {service!r} is not SERVING")


# -- inference ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_round_trips_as_over_http(client, web, datatype):
    array = (np.arange(6).reshape(2, 3) % 2).astype(DATATYPES[datatype])
    over_grpc, over_http = _infer_both(client, web, f"echo_{datatype.lower()}", {"x": array})
    assert over_grpc.as_numpy("y").dtype == over_http.as_numpy("y").dtype
    np.testing.assert_array_equal(over_grpc.as_numpy("y"), array)
    np.testing.assert_array_equal(over_grpc.as_numpy("y"), over_http.as_numpy("y"))
    assert over_grpc.get_output("y").datatype == datatype


def test_bytes_and_several_outputs(client, web):
    text = np.array([b"grpc", "ünïcode".encode(), b""], dtype=object)
    over_grpc, over_http = _infer_both(client, web, "strings", {"TEXT": text})
    assert over_grpc.as_numpy("UPPER").tolist() == over_http.as_numpy("UPPER").tolist()
    assert over_grpc.as_numpy("UPPER")[[0, 2]].tolist() == [b"GRPC", b""]
    a, b = np.arange(8, dtype=np.int32).reshape(2, 4), np.ones((2, 4), np.int32)
    result = client.infer("addsub", [_input("INPUT0", a), _input("INPUT1", b)],
                          outputs=[triton_grpc.InferRequestedOutput("OUTPUT1")], request_id="r-7")
    assert result.get_response().id == "r-7" and [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def _input(name: str, array: np.ndarray) -> triton_grpc.InferInput:
    tensor_in = triton_grpc.InferInput(name, list(array.shape), triton_grpc.np_to_triton_dtype(array.dtype))
    tensor_in.set_data_from_numpy(array)
    return tensor_in


def test_typed_contents_decode_as_raw_contents(server):
    """grpcio's own stub, with `contents` instead of raw_input_contents, as other clients send it."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="addsub")
        for name, values in (("INPUT0", [1, 2, 3, 4]), ("INPUT1", [10, 20, 30, 40])):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 4]).contents.int_contents.extend(values)
        answer = stub.ModelInfer(request, timeout=10)
        sums = np.frombuffer(answer.raw_output_contents[0], "<i4")
        assert sums.tolist() == [11, 22, 33, 44] and answer.model_version == "1"
        strings = pb.ModelInferRequest(model_name="strings")
        strings.inputs.add(name="TEXT", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"a", b"bc"])
        raw = stub.ModelInfer(strings, timeout=10).raw_output_contents[0]
        assert raw == b"\x01\x00\x00\x00A\x02\x00\x00\x00BC"
        flagged = pb.ModelInferRequest()
        flagged.CopyFrom(request)  # tritonclient's stream flag, which perf_analyzer sends on ModelInfer too
        flagged.parameters["triton_enable_empty_final_response"].bool_param = False
        assert np.frombuffer(stub.ModelInfer(flagged, timeout=10).raw_output_contents[0], "<i4").tolist() == [11, 22, 33, 44]
        request.raw_input_contents.append(b"\0" * 16)  # contents and raw contents both: Triton's words
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=10)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "contents field must not be specified when using raw_input_contents" in raised.value.details()


def test_classification_as_over_http(client, web):
    scores = np.array([[1.1, 3.3, 0.5, 2.4], [4, 3, 2, 1]], np.float32)
    over_grpc = client.infer("scores", [_input("x", scores)], outputs=[triton_grpc.InferRequestedOutput("y", class_count=2)])
    over_http = web.infer("scores", [_http_input("x", scores)], outputs=[http.InferRequestedOutput("y", class_count=2)])
    assert over_grpc.as_numpy("y").tolist() == over_http.as_numpy("y").tolist() == [
        [b"3.300000:1:pear", b"2.400000:3:fig"], [b"4.000000:0:apple", b"3.000000:1:pear"]]


def _http_input(name: str, array: np.ndarray) -> http.InferInput:
    tensor_in = http.InferInput(name, list(array.shape), http.np_to_triton_dtype(array.dtype))
    tensor_in.set_data_from_numpy(array)
    return tensor_in


def test_errors_carry_tritons_codes_and_words(client):
    x = _input("x", np.ones((1, 4), np.float32))
    cases = [
        (("no_such_model", [x]), "StatusCode.NOT_FOUND", "Request for unknown model: 'no_such_model' is not found"),
        (("scores", [x], "7"), "StatusCode.NOT_FOUND", "Request for unknown model: 'scores' version 7 is not found"),
        (("addsub", [_input("INPUT0", np.ones((1, 4), np.float32)), _input("INPUT1", np.ones((1, 4), np.int32))]),
         "StatusCode.INVALID_ARGUMENT", "input 'INPUT0' is INT32; the request says FP32"),
        (("handler", [x]), "StatusCode.INVALID_ARGUMENT", "is a SageMaker handler model"),
    ]
    for args, code, words in cases:
        error = _grpc_error(client.infer, *args)
        assert error.status() == code and words in error.message(), (args[0], error)


def test_raw_contents_that_disagree_with_their_shape_are_refused(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="scores")
        request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(b"\0" * 12)  # 3 floats for 4
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=10)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "input byte size mismatch for input 'x' for model 'scores'. Expected 16, got 12" in raised.value.details()
        request.raw_input_contents.append(b"\0" * 16)  # two contents for one input
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=10)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_malformed_message_is_invalid_argument_and_the_server_serves_on(server, client):
    with grpc.insecure_channel(server.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        for garbage in (b"\xff\xff\xff\xff", b"\x0a\x05ab", b"\x12\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"):
            with pytest.raises(grpc.RpcError) as raised:
                infer(garbage, timeout=10)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, garbage
            assert "not a valid inference.ModelInferRequest" in raised.value.details()
    assert client.infer("scores", [_input("x", np.ones((1, 4), np.float32))]).as_numpy("y").shape == (1, 4)


def test_large_tensors_cross_in_shared_memory_and_leave_nothing_behind(server, client):
    """Past 512 KiB a request's tensor data and an answer's go between the processes through /dev/shm."""
    big = np.random.default_rng(1).random((1, 300_000), dtype=np.float32)  # 1.2 MB each way
    for _ in range(3):
        np.testing.assert_array_equal(client.infer("echo_fp32", [_input("x", big)]).as_numpy("y"), big)
    assert list(Path("/dev/shm").glob(f"container-{server.process.pid}-*")) == []


def test_a_message_over_the_size_limit_is_resource_exhausted(client):
    big = np.zeros((1, 2_000_000), np.float32)  # 8 MB; the limit is SageMaker's 6 MiB
    tensor_in = triton_grpc.InferInput("x", list(big.shape), "FP32")
    tensor_in.set_data_from_numpy(big)
    error = _grpc_error(client.infer, "echo_fp32", [tensor_in])
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert client.is_server_ready()


@pytest.mark.parametrize("shape, words", [
    ([16, 2**60 + 2], "causes total element count to exceed maximum size of"),
    ([4, 2**60 + 2], "byte size overflow for input 'x'"),
])
def test_a_shape_past_int64_is_invalid_argument_in_tritons_words(server, shape, words):
    request = pb.ModelInferRequest(model_name="echo_fp32", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=shape)], raw_input_contents=[b"\0" * 4])
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in refused.value.details()
    assert server.grpc_ready()  # and the server serves on


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_read(client, algorithm):
    array = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = client.infer("scores", [_input("x", array)], compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("y"), array)


def test_async_client(server):
    async def main():
        client = grpc_clients.AsyncInferenceServerClient(server.grpc_url)
        try:
            assert await client.is_server_ready()
            array = np.arange(8, dtype=np.float32).reshape(2, 4)
            results = await asyncio.gather(*[client.infer("scores", [_input("x", array * i)]) for i in range(8)])
            for i, result in enumerate(results):
                np.testing.assert_array_equal(result.as_numpy("y"), array * i)
            metadata = await client.get_model_metadata("scores", as_json=True)
            assert metadata["name"] == "scores"
        finally:
            await client.close()

    asyncio.run(main())


# -- streaming ---------------------------------------------------------------------------------------


def test_a_stream_carries_sequences_in_order_and_survives_a_failed_request(client):
    answers: list = []
    client.start_stream(callback=lambda result, error: answers.append((result, error)))
    try:
        steps = [(21, 1.0, True, False), (22, 10.0, True, False), (21, 2.0, False, False), (22, 20.0, False, False),
                 (21, 3.0, False, True), (22, 30.0, False, True)]
        for sequence_id, value, start, end in steps:
            client.async_stream_infer("accumulate", [_input("INPUT", np.array([[value]], np.float32))],
                                      sequence_id=sequence_id, sequence_start=start, sequence_end=end,
                                      request_id=f"{sequence_id}-{value}")
        client.async_stream_infer("no_such_model", [_input("INPUT", np.ones((1, 1), np.float32))], request_id="bad")
        client.async_stream_infer("accumulate", [_input("INPUT", np.array([[5.0]], np.float32))],
                                  sequence_id=23, sequence_start=True, sequence_end=True, request_id="after")
        wait_for(lambda: len(answers) == 8, 30, "the stream did not answer every request")
    finally:
        client.stop_stream()
    errors = [error for _, error in answers if error is not None]
    assert len(errors) == 1 and "Request for unknown model: 'no_such_model'" in str(errors[0])
    totals = {r.get_response().id: float(r.as_numpy("OUTPUT")[0, 0]) for r, error in answers if error is None}
    assert totals == {"21-1.0": 1.0, "22-10.0": 10.0, "21-2.0": 3.0, "22-20.0": 30.0, "21-3.0": 6.0,
                      "22-30.0": 60.0, "after": 5.0}
    ids = [r.get_response().id for r, error in answers if error is None]
    assert [i for i in ids if i.startswith("21-")] == ["21-1.0", "21-2.0", "21-3.0"]  # each sequence's in its order
    assert [i for i in ids if i.startswith("22-")] == ["22-10.0", "22-20.0", "22-30.0"]
    # each answer is its request's last, and says so as Triton's do, though the client did not ask
    assert {r.get_response().parameters["triton_final_response"].bool_param for r, error in answers if error is None} == {True}


def test_a_stream_that_never_sends_holds_nothing_up(server, client):
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        silent = stub.ModelStreamInfer(iter(_blocked, None))  # a request iterator that never yields
        try:
            result = client.infer("scores", [_input("x", np.ones((1, 4), np.float32))])
            assert result.as_numpy("y").shape == (1, 4)
        finally:
            silent.cancel()


def _blocked():
    import threading
    threading.Event().wait()


def test_ten_thousand_concurrent_streams(server, client):
    """Each stream sends one request and waits for its answer; they all open at once, and the server's
    limit of calls waiting to be taken up (SERVE_GRPC_MAX_PENDING) holds them all."""
    async def main():
        client = grpc_clients.AsyncInferenceServerClient(server.grpc_url)
        array = np.ones((1, 4), np.float32)

        async def one_stream(i: int):
            async def requests():
                yield {"model_name": "scores", "inputs": [_input("x", array * i)], "request_id": str(i)}
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                return i, float(result.as_numpy("y")[0, 0])

        try:
            assert await client.is_server_ready()
            return await asyncio.wait_for(asyncio.gather(*[one_stream(i) for i in range(10_000)]), 300)
        finally:
            await client.close()

    answers = asyncio.run(main())
    assert sorted(answers) == [(i, float(i)) for i in range(10_000)]
    assert client.is_server_ready()


# -- one cache, one set of rules -----------------------------------------------------------------------


def test_the_repository_over_grpc_is_the_one_http_sees(server, client, web):
    index = {m.name: m.state for m in client.get_model_repository_index().models}
    assert index["later"] == "" and index["addsub"] == "READY"  # never loaded: no state, as Triton writes it
    client.load_model("later")
    assert web.is_model_ready("later")
    web.unload_model("later")
    wait_for(lambda: not client.is_model_ready("later"), 30, "unloaded over HTTP, still ready over gRPC")
    client.unload_model("later")  # unloading what is not loaded succeeds, as in Triton
    client.load_model("later", config='{"max_batch_size": 2, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],'
                                      ' "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]}')
    assert web.get_model_config("later")["max_batch_size"] == 2
    client.unload_model("later")
    error = _grpc_error(client.load_model, "later", config="{}", files={"file:1/model.pt": b"anything"})
    assert error.status() == "StatusCode.PERMISSION_DENIED" and "comes from the model root" in error.message()
    error = _grpc_error(client.load_model, "no_such_model")
    assert error.status() == "StatusCode.NOT_FOUND" and "failed to poll from model repository" in error.message()
    error = _grpc_error(client.load_model, "../escape")
    assert error.status() == "StatusCode.INVALID_ARGUMENT"


def test_model_files_travel_as_bytes(client, tmp_path):
    """gRPC carries a `file:` parameter's content as bytes (HTTP as base64): the same model either way."""
    torch.jit.script(Scale(3.0)).save(str(tmp_path / "model.pt"))
    config = json.dumps({"backend": "pytorch", "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],
                         "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}]})
    client.load_model("uploaded", config=config, files={"file:1/model.pt": (tmp_path / "model.pt").read_bytes()})
    result = client.infer("uploaded", [_input("x", np.array([1, 2], np.float32))])
    assert result.as_numpy("y").tolist() == [3.0, 6.0]
    client.unload_model("uploaded")


def test_a_load_past_the_memory_budget_is_resource_exhausted(client):
    error = _grpc_error(client.load_model, "huge")
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED" and "huge" in error.message()
    assert client.is_model_ready("addsub")


def test_statistics_count_grpc_requests_and_are_restricted(server, client):
    metadata = {"x-stats-key": RESTRICTED}
    before = client.get_inference_statistics("addsub", headers=metadata, as_json=True)["model_stats"][0]
    a = np.ones((1, 4), np.int32)
    client.infer("addsub", [_input("INPUT0", a), _input("INPUT1", a)])
    after = client.get_inference_statistics("addsub", headers=metadata).model_stats[0]
    assert after.inference_count == int(before.get("inference_count", 0)) + 1
    over_http = requests.get(f"{server.url}/v2/models/addsub/stats", headers=metadata, timeout=10).json()
    assert over_http["model_stats"][0]["inference_count"] == after.inference_count
    metrics = requests.get(f"{server.url}/metrics", headers=metadata, timeout=10).text
    assert f'nv_inference_count{{model="addsub",version="1"}} {after.inference_count}' in metrics.replace(".0\n", "\n")
    error = _grpc_error(client.get_inference_statistics, "addsub")
    assert error.status() == "StatusCode.PERMISSION_DENIED" and RESTRICTED not in error.message()


def test_system_shared_memory_registered_over_grpc_serves_both_protocols(server, client, web):
    key = f"/grpc_test_{os.getpid()}"
    handle = shared_memory.create_shared_memory_region("grpc_region", key, 64)
    try:
        shared_memory.set_shared_memory_region(handle, [np.arange(4, dtype=np.float32)])
        client.register_system_shared_memory("grpc_region", key, 64)
        assert list(client.get_system_shared_memory_status().regions) == ["grpc_region"]
        assert [r["name"] for r in web.get_system_shared_memory_status()] == ["grpc_region"]
        tensor_in = triton_grpc.InferInput("x", [1, 4], "FP32")
        tensor_in.set_shared_memory("grpc_region", 16)
        wanted = triton_grpc.InferRequestedOutput("y")
        wanted.set_shared_memory("grpc_region", 16, offset=32)
        answer = client.infer("scores", [tensor_in], outputs=[wanted]).get_response()
        out = shared_memory.get_contents_as_numpy(handle, np.float32, [1, 4], offset=32)
        np.testing.assert_array_equal(out, [[0, 1, 2, 3]])
        # as tritonserver answers it: no parameters, and an empty raw content in the output's place (perf_analyzer
        # reads an output's contents at its index, and crashed without it)
        assert list(answer.raw_output_contents) == [b""] and not answer.outputs[0].parameters
        error = _grpc_error(client.register_system_shared_memory, "grpc_region", key, 64)
        assert error.status() == "StatusCode.INVALID_ARGUMENT" and "already in manager" in error.message()
        assert _grpc_error(client.register_cuda_shared_memory, "gpu", b"\0" * 64, 0, 16).status() == "StatusCode.INVALID_ARGUMENT"
        assert len(client.get_cuda_shared_memory_status().regions) == 0
    finally:
        client.unregister_system_shared_memory()
        shared_memory.destroy_shared_memory_region(handle)
    assert web.get_system_shared_memory_status() == []


def test_log_and_trace_settings_say_what_the_server_has(client, web):
    """What HTTP answers (test_triton_fidelity.py), in protobuf: the same settings, the same refusals."""
    log = client.get_log_settings()
    assert {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in log.settings.items()} == \
        web.get_log_settings()
    assert client.update_log_settings({"log_warning": True, "log_verbose_level": 0}) == log  # restated: nothing changes
    error = _grpc_error(client.update_log_settings, {"log_info": True})  # SERVE_LOG_LEVEL=warning
    assert error.status() == "StatusCode.UNIMPLEMENTED" and "log setting 'log_info' cannot be changed" in error.message()
    trace = client.get_trace_settings()
    assert {key: list(value.value) for key, value in trace.settings.items()} == \
        {key: value if isinstance(value, list) else [value] for key, value in web.get_trace_settings().items()}
    assert client.get_trace_settings(model_name="addsub") == trace
    assert client.update_trace_settings("addsub", {"trace_level": None, "trace_rate": "0"}) == trace  # cleared, restated
    error = _grpc_error(client.update_trace_settings, settings={"trace_level": ["TIMESTAMPS"]})
    assert error.status() == "StatusCode.UNIMPLEMENTED" and "this server traces no requests" in error.message()
    assert _grpc_error(client.update_trace_settings, settings={"rate": "1"}).status() == "StatusCode.INVALID_ARGUMENT"
    assert _grpc_error(client.get_trace_settings, model_name="nobody").status() == "StatusCode.NOT_FOUND"


def test_a_log_setting_of_the_wrong_type_is_refused(server):
    wrong = pb.LogSettingsRequest(settings={"log_info": pb.LogSettingsRequest.SettingValue(uint32_param=1)})
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).LogSettings(wrong, timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == "log setting 'log_info' takes a boolean, or null"


def test_a_repository_name_other_than_the_one_is_refused(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="other"), timeout=10)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "one model repository" in raised.value.details()


# -- processes ---------------------------------------------------------------------------------------


def test_a_dead_front_end_is_replaced_and_loses_no_model(server, client, web):
    """A client whose connection went down with its front-end is told UNAVAILABLE (gRPC's word to try
    again) until its channel has connected anew, to the replacement or the other front-end: then it is
    served, every model still there."""
    loaded = web.get_model_repository_index()
    front_end = server.grpc_pid()
    os.kill(front_end, signal.SIGKILL)
    wait_for(lambda: _replaced(server, front_end) and server.grpc_ready(), 60, "the gRPC front-end was not replaced")
    assert web.get_model_repository_index() == loaded

    def served() -> bool:
        try:
            return client.infer("scores", [_input("x", np.ones((1, 4), np.float32))]).as_numpy("y").shape == (1, 4)
        except InferenceServerException as exc:
            if exc.status() != "StatusCode.UNAVAILABLE":
                raise
            return False

    wait_for(served, 30, "the client was not served again")


def test_the_front_end_holds_no_descriptor_of_the_masters(server):
    """Not the HTTP listener above all: an orphaned front-end would keep the port from a new server. A
    front-end holds the master's inheritable descriptors from its spawn until its first statement closes
    them, and one an earlier test replaced may still be starting (another answered its readiness)."""
    def sockets(pid: int) -> set[str]:
        return {target for target in descriptors(pid) if target.startswith("socket:")}

    assert sockets(server.process.pid)
    wait_for(lambda: not sockets(server.process.pid) & sockets(server.grpc_pid()), 30,
             "the gRPC front-end kept a socket of the master's")


def _replaced(server, pid: int) -> bool:
    try:
        return server.grpc_pid() != pid
    except StopIteration:
        return False


def test_while_the_model_process_restarts_grpc_answers_unavailable(server, client):
    worker = server.worker_pid()
    os.kill(worker, signal.SIGKILL)
    codes = set()

    def back() -> bool:
        try:
            client.infer("scores", [_input("x", np.ones((1, 4), np.float32))])
            return True
        except InferenceServerException as exc:
            codes.add(exc.status())
            return False

    wait_for(back, 120, "gRPC did not serve again once gunicorn restarted its worker")
    assert codes == {"StatusCode.UNAVAILABLE"}  # the model process away, then up with the model still loading


def test_a_taken_grpc_port_is_said_in_json_and_http_serves_on(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("taken")
    fp32_model(root, "plain")
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        server = start_server(root, SERVE_LOAD_MODELS="plain", SERVE_GRPC_PORT=port)
        wait_for(lambda: "gRPC cannot listen" in server.log.read_text(), 30, "no word of the taken port")
        wait_for(lambda: server.request("GET", "/v2/models/plain/ready").status_code == 200, 60, "HTTP did not serve")
    lines = [json.loads(line) for line in server.log.read_text().splitlines() if "gRPC cannot listen" in line]
    assert lines[0]["level"] == "ERROR" and lines[0]["port"] == port


def test_grpc_is_served_by_as_many_front_ends_as_http_sharing_its_port(start_server, tmp_path_factory):
    """Connections spread over the gRPC front-ends (the kernel's choice, by each connection's address: 16
    connections all on one of two front-ends would be a 1-in-32,768 chance) and each serves inferences;
    a second server given the same port says it is taken rather than share it."""
    root = tmp_path_factory.mktemp("shared")
    fp32_model(root, "plain")
    server = start_server(root, SERVE_LOAD_MODELS="plain", SERVE_HTTP_WORKERS="2")
    wait_for(server.ready, 60, "the model did not load")  # until then it answers UNAVAILABLE, still loading at start

    def on_port(status: str) -> set[int]:
        return {pid for pid in server.grpc_pids()
                if any(c.status == status and c.laddr.port == server.grpc_port for c in psutil.Process(pid).connections("tcp"))}

    # each front-end opens the port once its channel is connected: a process alone may not listen yet
    wait_for(lambda: len(on_port(psutil.CONN_LISTEN)) == 2, 60, "the gRPC front-ends did not both listen")
    # a connection each: grpcio's channels to one address share one by default
    clients = [grpc_clients.InferenceServerClient(server.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
               for _ in range(16)]
    try:
        for client in clients:
            assert client.infer("plain", [_input("x", np.ones((1, 4), np.float32))]).as_numpy("y").shape == (1, 4)
        assert on_port(psutil.CONN_ESTABLISHED) == set(server.grpc_pids())
    finally:
        for client in clients:
            client.close()
    second = start_server(root, SERVE_LOAD_MODELS="plain", SERVE_GRPC_PORT=str(server.grpc_port))
    wait_for(lambda: "gRPC cannot listen" in second.log.read_text(), 30, "no word of the taken port")
    assert server.grpc_ready()


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    """A server with the default settings, which the last test stops with SIGTERM."""
    from tests.conftest import Server

    root = tmp_path_factory.mktemp("defaults")
    fp32_model(root, "plain")
    server = Server(root, SERVE_LOAD_MODELS="plain")
    wait_for(server.grpc_ready, 60, "the gRPC front-end did not answer ready")
    yield server
    server.stop()


def test_model_files_are_refused_by_default(default_server):
    client = grpc_clients.InferenceServerClient(default_server.grpc_url)
    error = _grpc_error(client.load_model, "new", config="{}", files={"file:1/model.pt": b"anything"})
    assert error.status() == "StatusCode.PERMISSION_DENIED" and "SERVE_ALLOW_MODEL_FILES" in error.message()


def test_sigterm_to_the_master_drains_and_stops_every_process(default_server):
    """As `docker stop` sends it: to the master alone. The worker drains, then the front-end, and none
    is left behind."""
    server = default_server
    client = grpc_clients.InferenceServerClient(server.grpc_url)
    front_end, worker = server.grpc_pid(), server.worker_pid()
    assert client.infer("plain", [_input("x", np.ones((1, 4), np.float32))]).as_numpy("y").shape == (1, 4)
    os.kill(server.process.pid, signal.SIGTERM)
    assert server.process.wait(timeout=40) == 0
    for pid in (front_end, worker):
        assert exited(pid), pid
    client.close()
