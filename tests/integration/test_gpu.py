"""The GPU paths on a real GPU: placement, charging, a real CUDA out-of-memory error met by eviction,
a real device-side assert. Skipped, saying so, where torch sees no GPU (conftest.py)."""

import pytest
import requests
import torch

from bench.gpu import Grabs
from tests.builders import Sized, fp32_model, handler_model, wait_for
from tests.conftest import servers_started
from tests.integration.test_observability import log_lines

pytestmark = pytest.mark.gpu
GIB = 1 << 30
ON_GPU = {"instance_group": [{"kind": "KIND_GPU", "count": 1}]}


class Asserts(torch.nn.Module):
    """Indexes out of bounds on the device when x[0] is negative: a real device-side assert."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x[0, 0].item() < 0:
            return x + x.flatten()[torch.tensor([1 << 20], device=x.device)].sum()
        return x


HOG = """
import torch
def model_fn(model_dir):  # {share} of the GPU, held by the model's own worker process
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return torch.ones(int(total * {share}), dtype=torch.uint8, device="cuda")
def predict_fn(data, model):
    return data
"""


@pytest.fixture
def start_server():
    """A server per test, stopped at its end: one test's models (and the CUDA context of each of its
    processes) must not hold the device while the next server measures what it may use."""
    yield from servers_started()


def gpu_bytes(metrics, model: str) -> float:
    return metrics.get(("serve_model_memory_bytes", (("device", "cuda:0"), ("model", model))), 0)


def test_a_model_loads_on_the_gpu_and_is_charged_there(start_server, tmp_path):
    root = tmp_path / "models"
    fp32_model(root, "weights", Sized(256), **ON_GPU)
    server = start_server(root)
    assert server.load("weights").status_code == 200
    assert server.invoke("weights", [[1, 1, 1, 1]]).json() == [[2.0, 2.0, 2.0, 2.0]]  # computed on the GPU
    metrics = server.metrics()
    assert 256 << 20 <= gpu_bytes(metrics, "weights") < (256 << 20) * 1.1
    assert metrics[("serve_memory_measured_bytes", (("device", "cuda:0"),))] >= 256 << 20


def test_a_real_cuda_out_of_memory_evicts_idle_models_then_serves(start_server, tmp_path):
    root = tmp_path / "models"
    for name in ("hog1", "hog2"):
        handler_model(root, name, HOG.format(share=0.3))
    fp32_model(root, "greedy", Grabs(), dims=(1,), **ON_GPU)
    server = start_server(root, SERVE_GPU_MEMORY_LIMIT="100%")
    for name in ("hog1", "hog2", "greedy"):
        assert server.load(name).status_code == 200, name
    total = torch.cuda.get_device_properties(0).total_memory
    asked = int(total * 0.5 / GIB)  # with both hogs (60%) it cannot fit; with one gone it does
    answer = server.invoke("greedy", [[float(asked)]])
    assert answer.status_code == 200 and answer.json() == [[float(asked)]], answer.text
    assert server.loaded() == ["greedy", "hog2"]  # the least recently used hog made room, the other stayed
    impossible = server.invoke("greedy", [[float(2 * total // GIB)]])
    assert impossible.status_code == 507 and "cuda:0 ran out of memory" in impossible.json()["error"]
    assert server.loaded() == ["greedy", "hog2"] and server.invoke("greedy", [[1.0]]).json() == [[1.0]]


def test_two_models_share_a_device_within_its_budget(start_server, tmp_path):
    """Models sized from the budget the server reports (the GPU's share less what was in use before any
    model, this server's own CUDA context included): two fit, a third evicts the least recently used."""
    root = tmp_path / "models"
    root.mkdir()
    server = start_server(root, SERVE_GPU_MEMORY_LIMIT="4GiB")
    budget = server.metrics()[("serve_memory_budget_bytes", (("device", "cuda:0"),))]
    for name in ("first", "second", "third"):
        fp32_model(root, name, Sized(budget * 0.4 / (1 << 20)), **ON_GPU)
    for name in ("first", "second", "third"):
        assert server.load(name).status_code == 200
    assert server.loaded() == ["second", "third"]  # the third evicted the least recently used
    assert server.invoke("third", [[1, 2, 3, 4]]).json() == [[2.0, 3.0, 4.0, 5.0]]
    metrics = server.metrics()
    assert metrics[("serve_memory_accounted_bytes", (("device", "cuda:0"),))] <= budget


def test_a_device_side_assert_turns_health_red_and_the_worker_restarts(start_server, tmp_path):
    root = tmp_path / "models"
    fp32_model(root, "asserts", Asserts(), dims=(4,), **ON_GPU)
    server = start_server(root, SERVE_LOAD_MODELS="asserts")
    wait_for(lambda: server.loaded() == ["asserts"], message="the model did not load at start")
    first = server.worker_pid()
    answer = server.invoke("asserts", [[-1.0, 0, 0, 0]])
    assert answer.status_code == 500 and "device-side assert" in answer.json()["error"]
    wait_for(lambda: server.replaced(first), 60, "gunicorn did not start a fresh worker")
    wait_for(lambda: _answer(server, "asserts", [[1.0, 2, 3, 4]]) == [[1.0, 2.0, 3.0, 4.0]], 120,
             "the fresh worker did not serve the model")
    assert [line for line in log_lines(server) if line["message"] == "sticky device error: restarting the worker process"]


def _answer(server, name: str, rows):
    """The model's answer, or None while the fresh worker cannot give one."""
    try:
        return server.invoke(name, rows, timeout=5).json()
    except (requests.RequestException, ValueError):
        return None


WHERE = """
import os
import torch
def model_fn(model_dir):
    return torch.ones(1 << 20, device="cuda")  # 4 MiB on the worker's GPU
def predict_fn(data, model):
    return [[os.getpid(), torch.cuda.current_device()]]
"""


def test_a_handler_pool_spreads_over_the_gpus_and_each_worker_is_charged_there(start_server, tmp_path):
    """Two workers a GPU: requests taken in turn by the idle workers reach every one of them; each GPU has
    two, and is charged at least their two CUDA contexts and copies of the model."""
    gpus = torch.cuda.device_count()
    handler_model(tmp_path / "models", "spread", WHERE)
    server = start_server(tmp_path / "models", SAGEMAKER_MODEL_SERVER_WORKERS=str(2 * gpus))
    assert server.load("spread").status_code == 200
    gpu_of: dict[int, int] = {}  # worker pid → its GPU

    def every_worker_answered() -> bool:
        pid, gpu = server.invoke("spread", [[0]]).json()[0]
        gpu_of[pid] = gpu
        return len(gpu_of) == 2 * gpus

    wait_for(every_worker_answered, 120, "every worker did not answer")
    assert sorted(gpu_of.values()) == sorted(list(range(gpus)) * 2)
    metrics = server.metrics()
    for index in range(gpus):
        assert metrics[("serve_model_memory_bytes", (("device", f"cuda:{index}"), ("model", "spread")))] >= 2 * (4 << 20)
