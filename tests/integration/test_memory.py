"""The memory-aware cache on a real server: LRU eviction of idle models, 507s, SERVE_EVICTION=none,
memory really returned on unload, out-of-memory recovery, and what the server itself takes kept apart
from what models are charged; and large requests served from the heap that the last ones freed."""

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from container import frontends
from tests import grpc_clients
from tests.builders import (
    MIB,
    Allocates,
    Gate,
    Scale,
    Sized,
    fp32_model,
    gated_predict,
    handler_model,
    sized_model,
    wait_for,
)

OOM_ONCE = """
import torch
calls = []
def predict_fn(data, model):
    calls.append(1)
    if len(calls) == 1:  # the request says how much the failed allocation asks for, in MiB
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {data.flatten()[0].item():.2f} MiB")
    return model(data)
"""

OOM_ALWAYS = """
import torch
def predict_fn(data, model):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""

OOM_LOAD = """
import torch
def model_fn(model_dir):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
"""


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for name in "abcd":
        sized_model(root, name, 8)
    sized_model(root, "huge", 30)
    return root


@pytest.fixture(scope="module")
def lru(start_server, root):
    return start_server(root, SERVE_MEMORY_LIMIT="20MiB")


def invoke_ok(server, name) -> bool:
    return server.invoke(name, [[1, 1, 1, 1]]).status_code == 200


def test_least_recently_used_idle_model_is_evicted(lru):
    assert lru.load("a").status_code == 200 and lru.load("b").status_code == 200
    assert invoke_ok(lru, "a")  # b is now the least recently used
    assert lru.load("c").status_code == 200
    assert lru.loaded() == ["a", "c"]
    assert lru.load("d").status_code == 200  # a was used before c was loaded
    assert lru.loaded() == ["c", "d"]
    assert lru.invoke("a", [[1, 1, 1, 1]]).status_code == 404  # evicted models are unloaded for real


def test_model_larger_than_the_budget_is_507_and_evicts_nothing(lru):
    before = lru.loaded()
    answer = lru.load("huge")
    assert answer.status_code == 507 and "more than the whole budget" in answer.json()["error"]
    assert lru.loaded() == before and all(invoke_ok(lru, n) for n in before)


def test_each_version_s_statistics_show_what_the_cache_charges_it_in_triton_s_memory_usage(lru):

    name = lru.loaded()[0]
    charged = lru.metrics()[("serve_model_memory_bytes", (("device", "cpu"), ("model", name)))]
    [stats] = lru.request("GET", f"/v2/models/{name}/stats").json()["model_stats"]
    assert stats["memory_usage"] == [{"type": "CPU", "id": 0, "byte_size": charged}] and charged >= 8 * MIB
    wait_for(lru.grpc_ready, 60, "the gRPC front-end did not come up")  # it starts beside HTTP, maybe later
    with grpc_clients.InferenceServerClient(lru.grpc_url) as client:
        [over_grpc] = client.get_inference_statistics(name, as_json=True)["model_stats"]
    assert over_grpc["memory_usage"] == [{"type": "CPU", "byte_size": str(int(charged))}]  # protobuf's JSON: no id 0


def test_models_with_requests_in_flight_are_never_evicted(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("busy")
    gates = [Gate(tmp_path_factory.mktemp("gates"), f"g{i}") for i in range(2)]
    for i, gate in enumerate(gates):
        handler_model(root, f"busy{i}", gated_predict(gate), Sized(8))
    sized_model(root, "newcomer", 35)
    # each busy model is a worker process charged its USS (8 MiB of weights and its own pages, ~15 MiB):
    # both fit, and the newcomer fits only in place of one of them
    server = start_server(root, SERVE_MEMORY_LIMIT="60MiB")
    assert server.load("busy0").status_code == 200 and server.load("busy1").status_code == 200
    with ThreadPoolExecutor(2) as pool:
        inflight = [pool.submit(server.invoke, f"busy{i}", [[1.0]]) for i in range(2)]
        for gate in gates:
            gate.wait_entered()
        answer = server.load("newcomer")
        assert answer.status_code == 507 and "busy" in answer.json()["error"]
        for gate in gates:
            gate.release()
        assert [f.result().status_code for f in inflight] == [200, 200]
    assert server.load("newcomer").status_code == 200  # now an idle model makes room
    loaded = server.loaded()  # which busy model was used last depends on how the two requests raced
    assert len(loaded) == 2 and "newcomer" in loaded


def test_eviction_off_answers_507_so_sagemaker_evicts(start_server, root):
    server = start_server(root, SERVE_MEMORY_LIMIT="20MiB", SERVE_EVICTION="none")
    assert server.load("a").status_code == 200 and server.load("b").status_code == 200
    answer = server.load("c")
    assert answer.status_code == 507 and "SERVE_EVICTION=none" in answer.json()["error"]
    assert server.loaded() == ["a", "b"]
    assert server.request("DELETE", "/models/a").status_code == 200  # what the platform does next
    assert server.load("c").status_code == 200


def test_unload_returns_the_memory(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    sized_model(root, "big", 256)
    server = start_server(root)
    pid = server.worker_pid()
    before = rss(pid)
    assert server.load("big").status_code == 200 and invoke_ok(server, "big")
    loaded = rss(pid)
    assert loaded - before > 200 * MIB
    assert server.request("DELETE", "/models/big").status_code == 200
    assert rss(pid) - before < 64 * MIB  # freed before the DELETE answered


def test_out_of_memory_evicts_only_what_the_allocation_needs_then_retries_once(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("oom")
    for name in ("old", "recent"):
        sized_model(root, name, 8)
    handler_model(root, "oomonce", OOM_ONCE, Scale())
    handler_model(root, "oomalways", OOM_ALWAYS, Scale())
    handler_model(root, "oomload", OOM_LOAD)
    server = start_server(root, SERVE_MEMORY_LIMIT="256MiB")
    for name in ("old", "recent", "oomonce"):
        assert server.load(name).status_code == 200
    metrics = server.metrics()
    room = metrics[("serve_memory_budget_bytes", (("device", "cpu"),))] - metrics[("serve_memory_accounted_bytes", (("device", "cpu"),))]
    asked = (room + 4 * MIB) / MIB  # 4 MiB more than the budget has room for: the oldest idle model covers it
    answer = server.invoke("oomonce", [[asked]])
    assert answer.status_code == 200 and answer.json() == [[2 * asked]]  # retried after recovery
    assert server.loaded() == ["oomonce", "recent"]
    assert server.metrics()[("serve_memory_recoveries_total", ())] == 1
    assert server.load("oomalways").status_code == 200
    answer = server.invoke("oomalways", [[1.0]])
    assert answer.status_code == 507 and "ran out of memory" in answer.json()["error"]
    assert server.loaded() == ["oomalways", "oomonce", "recent"]  # 2 GiB more than all idle models hold: none evicted
    answer = server.load("oomload")
    assert answer.status_code == 507 and "oomload" not in server.loaded()
    assert server.load("old").status_code == 200 and invoke_ok(server, "old")


def test_a_real_allocation_failure_is_507_and_the_model_serves_on(start_server, tmp_path_factory):
    """The model asks the CPU allocator for 1 EiB: torch's own out-of-memory error, on any machine."""
    root = tmp_path_factory.mktemp("alloc")
    fp32_model(root, "greedy", Allocates(), dims=(1,))
    sized_model(root, "bystander", 8)
    server = start_server(root)
    assert server.load("bystander").status_code == 200 and server.load("greedy").status_code == 200
    answer = server.invoke("greedy", [[1024.0]])
    assert answer.status_code == 507 and "cpu ran out of memory running model 'greedy'" in answer.json()["error"]
    assert server.loaded() == ["bystander", "greedy"]  # no eviction could give 1 EiB: nothing is evicted
    assert server.invoke("greedy", [[0.0]]).json() == [[0.0]] and invoke_ok(server, "bystander")


TUPLE_MODEL = """
import torch
def model_fn(model_dir):  # not an nn.Module: a tuple holding 32 MiB of weights
    return torch.ones(8 << 20), "scale"
def predict_fn(data, model):
    return data * model[0][0]
"""


def test_a_handler_whose_model_fn_returns_no_module_is_charged_what_its_worker_holds(start_server, tmp_path):
    root = tmp_path / "models"
    handler_model(root, "pair", TUPLE_MODEL)
    server = start_server(root)
    assert server.load("pair").status_code == 200 and server.invoke("pair", [[2.0]]).json() == [[2.0]]
    metrics = server.metrics()
    charged = metrics[("serve_model_memory_bytes", (("device", "cpu"), ("model", "pair")))]
    worker = metrics[("serve_model_measured_bytes", (("device", "cpu"), ("kind", "load"), ("model", "pair")))]
    assert 32 * MIB <= worker <= charged < 64 * MIB  # the worker's own pages, its 32 MiB among them
    measured = metrics[("serve_memory_measured_bytes", (("device", "cpu"),))]
    accounted = metrics[("serve_memory_accounted_bytes", (("device", "cpu"),))]
    assert 0.8 * accounted <= measured <= 1.2 * accounted


CPU = (("device", "cpu"),)


def test_what_the_server_itself_takes_is_no_models_and_leaves_models_less_room(start_server, tmp_path):
    """The first ExportedProgram makes the model process import ~100 MiB of torch.export's modules, the
    first handler model starts the fork server (~150 MiB of its own heap), and a handler model's
    ExportedProgram needs the same modules in each worker: the server's, prepared once where they are
    shared, not the first such model's nor each worker's. Where the container's RAM bounds the budget
    (SERVE_MEMORY_LIMIT=100%), it shrinks by them."""
    root = tmp_path / "models"
    (root / "program" / "1").mkdir(parents=True)
    rows = {"x": {0: torch.export.Dim("batch")}}
    torch.export.save(torch.export.export(Scale().eval(), (torch.ones(2, 4),), dynamic_shapes=rows),
                      root / "program" / "1" / "model.pt2")
    (root / "handler").mkdir()  # SageMaker's layout: the default model_fn loads model.pt2
    shutil.copy(root / "program" / "1" / "model.pt2", root / "handler" / "model.pt2")
    server = start_server(root, SERVE_MEMORY_LIMIT="100%")

    def charged(model: str) -> float:
        return server.metrics()[("serve_model_memory_bytes", (("device", "cpu"), ("model", model)))]

    def server_part(metrics: dict, part: str) -> float:
        return metrics[("serve_memory_server_bytes", (("device", "cpu"), ("part", part)))]

    start = server.metrics()
    assert server_part(start, "runtimes") == server_part(start, "fork_server") == 0
    assert server_part(start, "front_ends") == 0  # idle, they hold less than the budget set aside for them
    assert server.load("program").status_code == 200
    loaded = server.metrics()
    runtimes = server_part(loaded, "runtimes")
    assert runtimes > 32 * MIB and charged("program") < 4 * MIB  # it was charged 99 MiB of torch's modules
    assert loaded[("serve_memory_budget_bytes", CPU)] == start[("serve_memory_budget_bytes", CPU)] - runtimes

    assert server.load("handler").status_code == 200
    assert server.invoke("handler", [[1.0, 2.0, 3.0, 4.0]]).json() == [[2.0, 4.0, 6.0, 8.0]]
    both = server.metrics()
    fork_server = server_part(both, "fork_server")
    assert server_part(both, "runtimes") == runtimes and fork_server > runtimes + 32 * MIB
    assert charged("handler") < 64 * MIB  # its worker's own pages (it was charged 140 MiB, torch.export's among them)
    shrunk = start[("serve_memory_budget_bytes", CPU)] - runtimes - fork_server - server_part(both, "front_ends")
    assert abs(both[("serve_memory_budget_bytes", CPU)] - shrunk) < 4 * MIB  # the fork server's heap, measured twice
    # what the models are measured to hold leaves the server's own parts out, as their accounting does
    assert both[("serve_memory_measured_bytes", CPU)] < both[("serve_memory_accounted_bytes", CPU)] + 16 * MIB

    assert server.request("DELETE", "/models/program").status_code == 200
    assert server.load("program").status_code == 200 and server.metrics()[
        ("serve_memory_server_bytes", (("device", "cpu"), ("part", "runtimes")))] == runtimes  # prepared once


def anonymous(pid: int) -> int:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["RssAnon"].split()[0]) * 1024


def test_what_the_front_ends_keep_after_a_burst_beyond_their_share_leaves_models_less_room(start_server, tmp_path):
    """Large JSON requests leave each front-end that decoded them holding far more than the idle size the
    budget set aside for it (glibc and Python keep freed memory for the next request): that excess is
    the server's, measured from the front-ends' pids, and a RAM-bound budget leaves it out."""
    root = tmp_path / "models"
    fp32_model(root, "wide", dims=(-1,), max_batch_size=0)
    fp32_model(root, "later")
    server = start_server(root, SERVE_MEMORY_LIMIT="100%", SERVE_HTTP_WORKERS="2", SERVE_LOAD_MODELS="wide")
    wait_for(server.ready, message="the model did not load")
    front_ends = [*server.http_pids(), *server.grpc_pids()]
    allowance = 2 * frontends.HTTP_FRONT_END_BYTES + 2 * frontends.GRPC_FRONT_END_BYTES
    start = server.metrics()
    assert start[("serve_memory_server_bytes", (("device", "cpu"), ("part", "front_ends")))] == 0
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [700_000], "data": [1.5] * 700_000}]})
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: server.request("POST", "/v2/models/wide/infer", data=body).status_code, range(16)))
    assert answers == [200] * 16
    held = sum(anonymous(pid) for pid in front_ends)
    assert server.load("later").status_code == 200  # a load charges the budget anew
    # the model process measured the front-ends between the two readings here (they may still be giving back)
    held = sorted([held, sum(anonymous(pid) for pid in front_ends)])
    after = server.metrics()
    beyond = after[("serve_memory_server_bytes", (("device", "cpu"), ("part", "front_ends")))]
    assert beyond > 32 * MIB and held[0] - allowance - 16 * MIB < beyond < held[1] - allowance + 16 * MIB, (beyond, held)
    shrunk = start[("serve_memory_budget_bytes", CPU)] - after[("serve_memory_budget_bytes", CPU)]
    assert abs(shrunk - beyond) < 16 * MIB  # TorchScript models only: no runtime, no fork server


PAGE = 4096


def minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def test_large_requests_reuse_the_heap_in_every_process_they_cross(start_server, tmp_path):
    """4 MiB in and out over HTTP (through the front-ends) and gRPC: once warm, the processes a request
    crosses fault in fewer new pages per request, all together, than its input and output hold (here
    ~550). With glibc's default thresholds they mapped their buffers afresh: 4,200-4,900 here, and up to
    ~2,000 a request in the model process or an HTTP front-end and ~8,500 in the gRPC one under load."""
    root = tmp_path / "models"
    fp32_model(root, "echo", Scale(1.0), dims=(-1,))
    server = start_server(root, SERVE_LOAD_MODELS="echo")
    wait_for(lambda: server.ready() and server.grpc_ready(), 60, "the server did not serve the model over HTTP and gRPC")
    values = np.linspace(-1, 1, 1 << 20, dtype=np.float32).reshape(1, -1)
    http_client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    grpc_client = grpc_clients.InferenceServerClient(server.grpc_url)

    def round_trip(client, module) -> None:
        tensor = module.InferInput("x", list(values.shape), "FP32")
        tensor.set_data_from_numpy(values, **({"binary_data": True} if module is triton_http else {}))
        np.testing.assert_array_equal(client.infer("echo", [tensor]).as_numpy("y"), values)

    for _ in range(4):
        round_trip(http_client, triton_http)
        round_trip(grpc_client, triton_grpc)
    processes = [server.worker_pid(), server.grpc_pid(), *server.http_pids()]
    before = list(map(minor_faults, processes))
    rounds = 8
    for _ in range(rounds):
        round_trip(http_client, triton_http)
        round_trip(grpc_client, triton_grpc)
    faults = [(after - start) / (2 * rounds) for start, after in zip(before, map(minor_faults, processes), strict=True)]
    assert sum(faults) < 2 * values.nbytes / PAGE, f"page faults a request: {faults} (the model process, gRPC, HTTP)"
