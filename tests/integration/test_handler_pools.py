"""A SageMaker handler model is a pool of worker processes, sized as SageMaker's PyTorch container sizes
TorchServe's workers: requests spread over them (the pids in the answers say so), each worker is charged,
a crash fails only the request it held, and unloading ends every worker."""

import os
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from container.resources import cpu_quota
from tests.builders import handler_model, sized_model, wait_for

# predict_fn answers with its worker's pid; a row of [-1] makes the worker die mid-request, and [0] holds
# it at a gate: its pid goes to a file, then it waits for the FIFO beside it to be opened for writing.
HANDLER = """
import os

def model_fn(model_dir):
    return b"x" * ({ballast} << 20)  # pages the worker touches: its own memory, charged to the model

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


def pool_model(root, name, gate, ballast_mib: int = 0) -> None:
    fifo, held = gate
    handler_model(root, name, HANDLER.format(held=str(held), gate=str(fifo), ballast=ballast_mib))


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


def release_all(fifo, answers) -> list:
    """Open the gate until every held request has answered: a request that reaches the gate after an
    opening waits for the next one. Returns the answers' pids."""
    def released() -> bool:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: nobody waits at the gate right now
            pass
        return all(answer.done() for answer in answers)

    wait_for(released, 60, "the held requests did not answer")
    return [answer.result().json()[0][0] for answer in answers]


def holding(held, count: int) -> None:
    wait_for(lambda: held.exists() and len(held.read_text().split()) == count, 60, f"{count} requests were not held at once")


def test_a_single_model_endpoint_has_a_worker_per_core_and_requests_spread_over_them(start_server, tmp_path, gate):
    pool_model(tmp_path, "model", gate)
    fifo, held = gate
    server = start_server(tmp_path / "model", SAGEMAKER_MULTI_MODEL="false")
    wait_for(server.ready, 60, "the model did not load")
    assert cpu_quota() >= 2  # the suite's machines have two cores or more
    pool = started(server, cpu_quota())  # a worker per core
    # SageMaker Batch Transform sends as many requests at once as the container says it serves (6 MB each,
    # within its 100 MB for them all)
    answer = server.request("GET", "/execution-parameters")
    assert answer.status_code == 200 and answer.json() == {
        "MaxConcurrentTransforms": min(cpu_quota(), 16), "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6}
    with ThreadPoolExecutor(cpu_quota()) as clients:
        held_answers = [clients.submit(server.request, "POST", "/invocations", json=[[0.0]]) for _ in pool]
        holding(held, len(pool))
        release(fifo)
        pids = {answer.result(timeout=60).json()[0][0] for answer in held_answers}
    assert pids == set(pool)  # every worker served at once: one request each


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
    answer = server.request("GET", "/execution-parameters")  # Batch Transform runs a single-model endpoint
    assert answer.status_code == 404 and "single-model endpoint" in answer.json()["error"]


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


@pytest.mark.parametrize("variable, seconds", [("SAGEMAKER_TS_RESPONSE_TIMEOUT", "2"),
                                               ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "5")])  # where the other is unset
def test_a_worker_stuck_past_the_response_timeout_is_replaced_and_its_request_told(start_server, tmp_path, gate, variable, seconds):
    pool_model(tmp_path / "models", "model", gate)
    server = start_server(tmp_path / "models", **{variable: seconds})
    assert server.load("model").status_code == 200
    [stuck] = started(server, 1)
    answer = server.invoke("model", [[2.0]])
    assert answer.status_code == 500
    assert answer.json()["error"].startswith(f"model 'model' did not finish a request within {seconds} s; its worker process was killed")
    assert server.invoke("model", [[1.0]]).status_code == 200  # a new worker, started by this request
    assert started(server, 1) != [stuck]


def test_a_pool_grows_while_requests_wait_and_its_idle_extra_workers_end(start_server, tmp_path, gate):
    """SAGEMAKER_TS_MAX_WORKERS above the starting one: three requests held at once are three workers;
    once idle past SERVE_HANDLER_IDLE_SECONDS, the pool is back to one."""
    fifo, held = gate
    pool_model(tmp_path / "models", "model", gate)
    server = start_server(tmp_path / "models", SAGEMAKER_TS_MAX_WORKERS="3", SERVE_HANDLER_IDLE_SECONDS="1")
    assert server.load("model").status_code == 200
    [first] = started(server, 1)
    with ThreadPoolExecutor(3) as clients:
        answers = [clients.submit(server.invoke, "model", [[0.0]]) for _ in range(3)]
        holding(held, 3)
        assert len(workers(server)) == 3
        pids = release_all(fifo, answers)
    assert len(set(pids)) == 3 and first in pids
    wait_for(lambda: len(workers(server)) == 1, 60, "the extra workers did not end once idle")
    assert server.invoke("model", [[1.0]]).status_code == 200


def test_a_pool_grows_only_as_far_as_the_budget_has_room(start_server, tmp_path, gate):
    """Workers of about 70 MiB each under a 160 MiB budget: room for two, though three may be asked for
    (and so whether a worker weighs 56 MiB or 80)."""
    fifo, held = gate
    pool_model(tmp_path / "models", "model", gate, ballast_mib=60)
    server = start_server(tmp_path / "models", SAGEMAKER_TS_MAX_WORKERS="3", SERVE_MEMORY_LIMIT="160MiB")
    assert server.load("model").status_code == 200
    started(server, 1)
    with ThreadPoolExecutor(3) as clients:
        answers = [clients.submit(server.invoke, "model", [[0.0]]) for _ in range(3)]
        holding(held, 2)
        pids = release_all(fifo, answers)
    assert len(set(pids)) == 2 and len(workers(server)) == 2


def test_idle_extra_workers_end_before_another_model_is_evicted(start_server, tmp_path, gate):
    """A pool of three workers of about 55 MiB under a 300 MiB budget; a 200 MiB model then fits only
    once the two extra workers end (with room to spare either way, should a worker weigh 45 or 70 MiB):
    it loads, and the pool's model serves on with its one worker."""
    fifo, held = gate
    pool_model(tmp_path / "models", "pool", gate, ballast_mib=45)
    sized_model(tmp_path / "models", "big", 200)
    server = start_server(tmp_path / "models", SAGEMAKER_TS_MAX_WORKERS="3", SERVE_MEMORY_LIMIT="300MiB")
    assert server.load("pool").status_code == 200
    with ThreadPoolExecutor(3) as clients:
        answers = [clients.submit(server.invoke, "pool", [[0.0]]) for _ in range(3)]
        holding(held, 3)
        release_all(fifo, answers)
    assert len(workers(server)) == 3
    assert server.load("big").status_code == 200
    assert set(server.loaded()) == {"pool", "big"} and len(workers(server)) == 1
    assert server.invoke("pool", [[1.0]]).status_code == 200
