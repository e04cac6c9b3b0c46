"""A sticky CUDA error (an illegal address, a device-side assert) breaks the process's CUDA context for
good: health turns red and gunicorn replaces the worker. The model raises the error's own text, so
the path runs without a GPU; the gpu-marked test in test_gpu.py triggers a real one."""

import requests

from container.app import create_app
from container.settings import Settings
from tests.builders import Faults, fp32_model, wait_for
from tests.integration.test_observability import log_lines


def test_health_turns_red_on_a_sticky_error(tmp_path):
    fp32_model(tmp_path, "faulty", Faults(), dims=(1,))
    app = create_app(Settings.from_env({"SERVE_MODEL_ROOT": str(tmp_path)}))
    registry, faults = app.extensions["registry"], []
    registry.on_fault = faults.append  # in this process, record instead of restarting
    app.extensions["started"].set()  # no models named at start
    client = app.test_client()
    assert client.post("/models", json={"model_name": "faulty", "url": "faulty"}).status_code == 200
    assert client.post("/models/faulty/invoke", json=[[1.0]]).status_code == 200
    for path in ("/ping", "/v2/health/live", "/v2/health/ready"):
        assert client.get(path).status_code == 200
    answer = client.post("/models/faulty/invoke", json=[[-1.0]])
    assert answer.status_code == 500 and "illegal memory access" in answer.json["error"]
    assert len(faults) == 1 and "CUDA context is unusable" in faults[0]
    for path in ("/ping", "/v2/health/live", "/v2/health/ready"):
        red = client.get(path)
        assert red.status_code == 503 and "restarting its worker" in red.json["error"], path


def test_a_sticky_error_restarts_the_worker_which_serves_again(start_server, tmp_path):
    root = tmp_path / "models"
    fp32_model(root, "faulty", Faults(), dims=(1,))
    server = start_server(root, SERVE_LOAD_MODELS="faulty")
    wait_for(lambda: server.loaded() == ["faulty"], message="the model did not load at start")
    first = server.worker_pid()
    answer = server.invoke("faulty", [[-1.0]])
    assert answer.status_code == 500 and "illegal memory access" in answer.json()["error"]
    wait_for(lambda: server.replaced(first), 60, "gunicorn did not start a fresh worker")
    wait_for(lambda: _answers(server), 60, "the fresh worker did not serve the model")
    assert [line for line in log_lines(server) if line["message"] == "sticky device error: restarting the worker process"]


def _answers(server) -> bool:
    try:
        return server.invoke("faulty", [[2.0]], timeout=5).json() == [[2.0]]
    except (requests.RequestException, ValueError):
        return False
