"""System shared memory: regions made with tritonclient.utils.shared_memory carry inputs and outputs."""

import base64

import numpy as np
import pytest
import torch
import tritonclient.http as http
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests import grpc_clients
from tests.builders import fp32_model, wait_for

BYTES = 2 * 4 * 4  # FP32 [2, 4]


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "double")
    server = start_server(root, SERVE_ALLOW_CLIENT_SHM="true")
    assert server.load("double").status_code == 200
    return server


@pytest.fixture
def regions(server):
    client = http.InferenceServerClient(server.url.removeprefix("http://"))
    handles = [shm.create_shared_memory_region(name, f"/test_{name}_{server.port}", BYTES) for name in ("input", "output")]
    yield client, handles
    client.unregister_system_shared_memory()
    for handle in handles:
        shm.destroy_shared_memory_region(handle)
    client.close()


def infer_through_shared_memory(client, input_region="input", output_region="output", size=BYTES):
    tensor_in = http.InferInput("x", [2, 4], "FP32")
    tensor_in.set_shared_memory(input_region, size)
    tensor_out = http.InferRequestedOutput("y", binary_data=True)
    tensor_out.set_shared_memory(output_region, size)
    return client.infer("double", [tensor_in], outputs=[tensor_out])


def test_inputs_and_outputs_travel_through_shared_memory(server, regions):
    client, (input_handle, output_handle) = regions
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    shm.set_shared_memory_region(input_handle, [values])
    client.register_system_shared_memory("input", f"/test_input_{server.port}", BYTES)
    client.register_system_shared_memory("output", f"/test_output_{server.port}", BYTES)
    status = client.get_system_shared_memory_status()
    assert {r["name"] for r in status} == {"input", "output"} and status[0]["byte_size"] == BYTES
    result = infer_through_shared_memory(client)
    output = result.get_output("y")
    assert "parameters" not in output  # as Triton writes it: perf_analyzer reads any as binary data's (measured)
    assert np.array_equal(shm.get_contents_as_numpy(output_handle, np.float32, [2, 4]), values * 2)
    client.unregister_system_shared_memory("input")
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["output"]
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'input'"):
        infer_through_shared_memory(client)  # an unregistered region is never read again


def test_offsets_and_sizes_are_checked_against_the_region(server, regions):
    client, _ = regions
    client.register_system_shared_memory("input", f"/test_input_{server.port}", 16, offset=16)
    client.register_system_shared_memory("output", f"/test_output_{server.port}", BYTES)
    with pytest.raises(InferenceServerException, match="Invalid offset \\+ byte size for shared memory region: 'input'"):
        infer_through_shared_memory(client)
    small = http.InferRequestedOutput("y")
    small.set_shared_memory("output", 8)
    tensor_in = http.InferInput("x", [1, 4], "FP32")
    tensor_in.set_shared_memory("input", 16)
    with pytest.raises(InferenceServerException, match="needs 16 bytes; shared memory region 'output' offers 8"):
        client.infer("double", [tensor_in], outputs=[small])


@pytest.mark.parametrize("offset, byte_size", [(0, BYTES + 1), (1, BYTES), (BYTES, 1), (BYTES + 1, 0)])
def test_a_registration_past_the_objects_end_is_refused_in_tritons_words(server, regions, offset, byte_size):
    """Triton's L0_shared_memory edge cases: the registered [offset, offset + byte_size) must lie in the object."""
    client, _ = regions
    with pytest.raises(InferenceServerException, match="failed to register shared memory region.*invalid args"):
        client.register_system_shared_memory("edge", f"/test_input_{server.port}", byte_size, offset=offset)


@pytest.mark.parametrize("protocol, offset", [("http", 2**64 - 32), ("grpc", BYTES)])
def test_an_output_offset_past_the_region_is_refused_in_tritons_words(server, regions, protocol, offset):
    """Over HTTP, Triton's QA sends 2**64 - 32 (-32 to a signed 64-bit reader); over gRPC, one past the end."""
    import tritonclient.grpc as grpc

    module = http if protocol == "http" else grpc
    if protocol == "grpc":
        wait_for(server.grpc_ready, 60, "the gRPC front-end did not come up")  # it starts beside HTTP, maybe later
    client = regions[0] if protocol == "http" else grpc_clients.InferenceServerClient(server.grpc_url)
    deadline = {} if protocol == "http" else {"client_timeout": 60}  # the HTTP client's is its network_timeout, 60 s
    for name in ("input", "output"):
        client.register_system_shared_memory(name, f"/test_{name}_{server.port}", BYTES)
    tensor_in = module.InferInput("x", [2, 4], "FP32")
    tensor_in.set_shared_memory("input", BYTES)
    tensor_out = module.InferRequestedOutput("y")
    tensor_out.set_shared_memory("output", BYTES, offset=offset)
    with pytest.raises(InferenceServerException, match="Invalid offset for shared memory region: 'output'"):
        client.infer("double", [tensor_in], outputs=[tensor_out], **deadline)
    assert client.infer("double", [tensor_in], **deadline).as_numpy("y").shape == (2, 4)  # served on
    if client is not regions[0]:
        client.close()


def test_an_input_region_larger_than_its_tensor_is_refused_in_tritons_words(server, regions):
    client, _ = regions
    client.register_system_shared_memory("input", f"/test_input_{server.port}", BYTES)
    tensor_in = http.InferInput("x", [1, 4], "FP32")
    tensor_in.set_shared_memory("input", BYTES)
    with pytest.raises(InferenceServerException, match="unexpected total byte size 32 for input 'x', expecting 16"):
        client.infer("double", [tensor_in])


def test_unregistering_a_region_never_registered_is_not_an_error(server, regions):
    client, _ = regions
    client.unregister_system_shared_memory("never")
    assert client.get_system_shared_memory_status() == []


@pytest.mark.parametrize("body, message", [
    ({"key": "/no_such_object", "offset": 0, "byte_size": 8}, "Unable to open shared memory region: '/no_such_object'"),
    ({"key": "/../../etc/passwd", "offset": 0, "byte_size": 8}, "must name a POSIX shared memory object"),
    ({"key": "/test_input_PORT", "offset": 0, "byte_size": BYTES + 1},
     "failed to register shared memory region 'bad': invalid args ([0, 33) does not fit the 32-byte object"),
    ({"key": "/test_input_PORT", "offset": -1, "byte_size": 8}, "'offset' must be a non-negative"),
    ({"key": "/test_input_PORT"}, "'byte_size' must be a non-negative"),
])
def test_bad_registrations(server, regions, body, message):
    body = {k: v.replace("PORT", str(server.port)) if isinstance(v, str) else v for k, v in body.items()}
    answer = server.request("POST", "/v2/systemsharedmemory/region/bad/register", json=body)
    assert answer.status_code == 400 and message in answer.json()["error"]


def test_duplicate_registration_and_unknown_status(server, regions):
    client, _ = regions
    client.register_system_shared_memory("input", f"/test_input_{server.port}", BYTES)
    with pytest.raises(InferenceServerException, match="shared memory region 'input' already in manager"):
        client.register_system_shared_memory("input", f"/test_input_{server.port}", BYTES)
    answer = server.request("GET", "/v2/systemsharedmemory/region/nothing/status")
    assert answer.status_code == 404 and answer.json()["error"] == "Unable to find system shared memory region: 'nothing'"
    answer = server.request("GET", "/v2/cudasharedmemory/region/input/status")
    assert answer.status_code == 404
    assert answer.json()["error"] == "The region named 'input' is registered as system shared memory, not CUDA shared memory"


def test_client_shared_memory_is_off_by_default(start_server, tmp_path):
    fp32_model(tmp_path / "models", "double")
    server = start_server(tmp_path / "models")
    assert server.load("double").status_code == 200
    disabled = "Client shared memory is disabled. Start the server with SERVE_ALLOW_CLIENT_SHM=true to enable."
    for path, body in [("/v2/systemsharedmemory/region/input/register", {"key": "/anything", "byte_size": BYTES}),
                       ("/v2/cudasharedmemory/region/input/register", {"raw_handle": {"b64": ""}, "byte_size": BYTES}),
                       ("/v2/systemsharedmemory/unregister", {})]:
        response = server.request("POST", path, json=body)
        assert response.status_code == 400 and response.json()["error"] == disabled, path
    assert server.request("GET", "/v2/systemsharedmemory/status").json() == []
    client = http.InferenceServerClient(server.url.removeprefix("http://"))
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'input'"):
        infer_through_shared_memory(client)
    client.close()


def test_cuda_shared_memory_refuses_what_it_cannot_open(server):
    """Without a GPU every registration is a 400 that says so; with one, a handle no process exported."""
    assert server.request("GET", "/v2/cudasharedmemory/status").json() == []
    handle = base64.b64encode(bytes(64)).decode()
    response = server.request("POST", "/v2/cudasharedmemory/region/gpu/register",
                              json={"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": BYTES})
    expected = "cudaIpcOpenMemHandle failed" if torch.cuda.is_available() else "needs a GPU, and this server has none"
    assert response.status_code == 400 and expected in response.json()["error"]
    assert server.request("GET", "/v2/cudasharedmemory/region/gpu/status").status_code == 404
    assert server.request("POST", "/v2/cudasharedmemory/unregister").status_code == 200


@pytest.mark.gpu
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_made_by_tritonclient_carries_inputs_and_outputs(server, protocol):
    """Regions made with tritonclient.utils.cuda_shared_memory, the module Triton users call (cudaMalloc and
    cudaIpcGetMemHandle through cuda-python), registered and read over either protocol."""
    import tritonclient.grpc as grpc
    import tritonclient.utils.cuda_shared_memory as cudashm

    module = http if protocol == "http" else grpc
    client = (http.InferenceServerClient(server.url.removeprefix("http://")) if protocol == "http"
              else grpc_clients.InferenceServerClient(server.grpc_url))
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    regions = {name: cudashm.create_shared_memory_region(f"{protocol}_{name}", BYTES, 0) for name in ("in", "out")}
    try:
        cudashm.set_shared_memory_region(regions["in"], [values])
        for name, handle in regions.items():
            client.register_cuda_shared_memory(f"{protocol}_{name}", cudashm.get_raw_handle(handle), 0, BYTES)
        status = client.get_cuda_shared_memory_status()
        assert ({r["name"] for r in status} if protocol == "http" else set(status.regions)) == {f"{protocol}_in", f"{protocol}_out"}
        tensor_in = module.InferInput("x", [2, 4], "FP32")
        tensor_in.set_shared_memory(f"{protocol}_in", BYTES)
        tensor_out = module.InferRequestedOutput("y") if protocol == "grpc" else module.InferRequestedOutput("y", binary_data=True)
        tensor_out.set_shared_memory(f"{protocol}_out", BYTES)
        client.infer("double", [tensor_in], outputs=[tensor_out])
        assert np.array_equal(cudashm.get_contents_as_numpy(regions["out"], np.float32, [2, 4]), values * 2)
        client.unregister_cuda_shared_memory()
    finally:
        for handle in regions.values():
            cudashm.destroy_shared_memory_region(handle)
        client.close()
