"""Worker processes of user code started under concurrency: loads of handler models and python-backend
models at once, from HTTP and gRPC, round after round, with every number of front-ends; and a worker
whose start never completes."""

import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests import grpc_clients
from tests.builders import Gate, handler_model, python_model, wait_for
from tests.conftest import Server
from tests.integration.test_python_backend import SCALE_PY, infer, scale_config

ROUNDS = 6
HANDLER = """
def model_fn(model_dir):
    return 3.0

def predict_fn(data, model):
    return [[value * model for value in row] for row in data]
"""


@pytest.mark.parametrize("front_ends", ["0", "1", "2"])
def test_concurrent_loads_of_worker_models_never_hang(start_server, tmp_path, front_ends):
    root = tmp_path / "models"
    handler_model(root, "handler", HANDLER)
    for n in range(4):
        python_model(root, f"python{n}", SCALE_PY, scale_config(2.0))
    server = start_server(root, SERVE_HTTP_WORKERS=front_ends)
    wait_for(server.grpc_ready, 60, "the gRPC front-end did not come up")
    with ThreadPoolExecutor(8) as pool, grpc_clients.InferenceServerClient(server.grpc_url) as grpc:
        for round_ in range(ROUNDS):
            handlers = [f"h{round_}-{n}" for n in range(4 + round_ % 2)]  # 5 to 8 loads a round
            pythons = [f"python{n}" for n in range(4)]

            def load_python(name):
                grpc.load_model(name, client_timeout=60)
                return 200

            loads = [pool.submit(lambda name=name: server.load(name, "handler").status_code) for name in handlers]
            loads += [pool.submit(load_python, name) for name in pythons]
            assert [load.result(timeout=90) for load in loads] == [200] * len(loads), f"round {round_}"
            for name in handlers:
                assert server.invoke(name, [[1.0, 2.0]]).json() == [[3.0, 6.0]]
            for name in pythons:
                assert infer(server, name, [1, 2, 3, 4]).status_code == 200
            unloads = [pool.submit(lambda name=name: server.request("DELETE", f"/models/{name}").status_code)
                       for name in handlers]
            unloads += [pool.submit(lambda name=name: grpc.unload_model(name, client_timeout=60) or 200)
                        for name in pythons]
            assert [unload.result(timeout=90) for unload in unloads] == [200] * len(unloads), f"round {round_}"
    assert server.loaded() == []


def blocked_at_import(gate: Gate, flag) -> str:
    """inference.py whose import waits at `gate` while `flag` exists."""
    return f"""
import os
if os.path.exists({str(flag)!r}):
    {gate.code()}

def model_fn(model_dir):
    return 1.0

def predict_fn(data, model):
    return data
"""


def test_a_worker_whose_start_never_completes_fails_its_load_within_the_bound(tmp_path):
    flag = tmp_path / "block"
    flag.touch()
    gate = Gate(tmp_path, "import")
    handler_model(tmp_path / "models", "stuck", blocked_at_import(gate, flag))
    server = Server(tmp_path / "models", SERVE_LOAD_TIMEOUT="3")
    try:
        answer = server.load("stuck")
        assert answer.status_code == 500
        assert answer.json()["error"].startswith("model 'stuck' did not finish model_fn within 3 s; its worker "
                                                 "process was killed")
        assert server.loaded() == []
        assert server.request("GET", "/ping").status_code == 200
        flag.unlink()
        assert server.load("stuck").status_code == 200  # the name is loadable again
        assert server.invoke("stuck", [[2.0]]).json() == [[2.0]]

        flag.touch()  # a second load stuck at its import when SIGTERM comes
        with ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(server.load, "stuck-again", "stuck")
            gate.wait_entered()
            os.killpg(server.process.pid, signal.SIGTERM)
            assert server.process.wait(timeout=40) == 0  # within the 30 s graceful timeout, and a little
            try:
                stuck.result(timeout=5)
            except requests.RequestException:
                pass  # the server ended before it answered
        wait_for(lambda: not _session(server.process.pid), 10, "processes of the server outlived it")
    finally:
        server.stop()


def _session(sid: int) -> list[str]:
    """Processes still in the server's session (it was started as one)."""
    found = subprocess.run(["ps", "-o", "pid=,args=", "-s", str(sid)], capture_output=True, text=True)
    return found.stdout.splitlines()
