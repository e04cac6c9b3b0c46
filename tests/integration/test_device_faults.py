"""A sticky CUDA error (an illegal address, a device-side assert) breaks the process's CUDA context for
good: gunicorn replaces the worker, which serves again. The model raises the error's own text, so the
path runs without a GPU; the gpu-marked test in test_gpu.py triggers a real one, and
tests/unit/test_core.py holds health red in between."""

import requests

from tests.builders import Faults, fp32_model, wait_for
from tests.integration.test_observability import log_lines


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
