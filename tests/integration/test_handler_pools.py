"""A SageMaker handler model is a pool of worker processes, sized as SageMaker's PyTorch container sizes
TorchServe's workers: requests spread over them (the pids in the answers say so), each worker is charged,
a crash fails only the request it held, and unloading ends every worker."""

import os
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from container.resources import cpu_quota
from tests.builders import handler_model, wait_for

# predict_fn answers with its worker's pid; a row of [-1] makes the worker die mid-request, and [0] holds
# it at a gate: its pid goes to a file, then it waits for the FIFO beside it to be opened for writing.
HANDLER = """
import os

def model_fn(model_dir):
    return None

def predict_fn(data, model):
    if data[0][0] < 0:
        os._exit(3)
    if data[0][0] == 2:
        open({gate!r}).read()  # held until the test releases it, or the response timeout kills the worker
    if data[0][0] == 0:
        with open({held!r}, "a") as held:
            held.write(f"{{os.getpid()}}\\n")
        open({gate!r}).read()
    return [[os.getpid()]]
"""


@pytest.fixture
def gate(tmp_path):
    fifo = tmp_path / "gate.fifo"
    os.mkfifo(fifo)
    return fifo, tmp_path / "held"


def pool_model(root, name, gate) -> None:
    fifo, held = gate
    handler_model(root, name, HANDLER.format(held=str(held), gate=str(fifo)))


def workers(server) -> list[int]:
    """The pids of the handler workers: the fork server's children."""
    forkservers = [p for p in psutil.Process(server.worker_pid()).children()
                   if "container.backends.forkserver" in " ".join(p.cmdline())]
    return sorted(child.pid for forkserver in forkservers for child in forkserver.children())


def started(server, count: int) -> list[int]:
    """The workers once `count` have started: the model serves from its first, the others join it."""
    return wait_for(lambda: len(pids := workers(server)) == count and pids, 60, f"{count} workers did not start")


def release(fifo) -> None:
    os.close(os.open(fifo, os.O_WRONLY))


def test_a_single_model_endpoint_has_a_worker_per_core_and_requests_spread_over_them(start_server, tmp_path, gate):
    pool_model(tmp_path, "model", gate)
    fifo, held = gate
    server = start_server(tmp_path / "model", SAGEMAKER_MULTI_MODEL="false")
    wait_for(server.ready, 60, "the model did not load")
    assert cpu_quota() >= 2  # the suite's machines have two cores or more
    pool = started(server, cpu_quota())  # a worker per core
    with ThreadPoolExecutor(2) as clients:
        held_answers = [clients.submit(server.request, "POST", "/invocations", json=[[0.0]]) for _ in range(2)]
        wait_for(lambda: held.exists() and len(held.read_text().split()) == 2, 30, "two requests were not held at once")
        release(fifo)
        pids = {answer.result(timeout=60).json()[0][0] for answer in held_answers}
    assert len(pids) == 2 and pids <= set(pool)  # two workers served at once: one request each


def test_model_server_workers_sizes_every_pool_and_unloading_ends_them(start_server, tmp_path, gate):
    pool_model(tmp_path / "models", "three", gate)
    pool_model(tmp_path / "models", "one", gate)
    server = start_server(tmp_path / "models", SAGEMAKER_MODEL_SERVER_WORKERS="3")
    assert server.load("three").status_code == 200
    pids = started(server, 3)
    answered = {server.invoke("three", [[1.0]]).json()[0][0] for _ in range(9)}
    assert answered <= set(pids)
    charged = server.metrics()[("serve_model_memory_bytes", (("device", "cpu"), ("model", "three")))]
    assert charged >= 0.9 * sum(psutil.Process(pid).memory_full_info().uss for pid in pids)  # each worker charged
    assert server.request("DELETE", "/models/three").status_code == 200
    wait_for(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                             for pid in pids), 30, "a worker outlived its model")


def test_a_multi_model_endpoint_has_one_worker_a_model_by_default(start_server, tmp_path, gate):
    pool_model(tmp_path / "models", "model", gate)
    server = start_server(tmp_path / "models")
    assert server.load("model").status_code == 200
    assert len(workers(server)) == 1


def test_a_crash_fails_only_the_request_it_held_and_the_pool_replaces_the_worker(start_server, tmp_path, gate):
    pool_model(tmp_path / "models", "model", gate)
    server = start_server(tmp_path / "models", SAGEMAKER_MODEL_SERVER_WORKERS="2")
    assert server.load("model").status_code == 200
    before = started(server, 2)
    crashed = server.invoke("model", [[-1.0]])
    assert crashed.status_code == 500 and "exited with code 3" in crashed.json()["error"]
    answers = [server.invoke("model", [[1.0]]) for _ in range(4)]
    assert {answer.status_code for answer in answers} == {200}
    after = started(server, 2)
    assert len(set(after) - set(before)) == 1  # one new worker, in the dead one's place


def test_a_worker_stuck_past_the_response_timeout_is_replaced_and_its_request_told(start_server, tmp_path, gate):
    pool_model(tmp_path / "models", "model", gate)
    server = start_server(tmp_path / "models", SAGEMAKER_TS_RESPONSE_TIMEOUT="2")
    assert server.load("model").status_code == 200
    [stuck] = started(server, 1)
    answer = server.invoke("model", [[2.0]])
    assert answer.status_code == 500
    assert answer.json()["error"].startswith("model 'model' did not finish a request within 2 s; its worker process was killed")
    assert server.invoke("model", [[1.0]]).status_code == 200  # a new worker, started by this request
    assert started(server, 1) != [stuck]
