"""A handler model's worker process on its own (backends/handler_worker.py), without a server: what
it does when the server on the other end of its socket goes away."""

import subprocess
import sys

import pytest

from container.backends.handler_worker import spread
from container.backends.worker_process import charged
from tests.builders import Scale, handler_model

# The worker's `serve` in a process of its own, its server's end of the socket pair run by a thread
# that hangs up at the moment the test names: before the load has finished, or during a request.
WORKER = """
import socket, sys, threading
from multiprocessing.connection import Connection
from container.backends.handler_worker import WorkerOptions, serve
server_end, worker_end = (Connection(s.detach()) for s in socket.socketpair())
def server(hang_up):
    if hang_up == "during a request":
        assert server_end.recv()[0] == "ok"
        server_end.send((0, [(b"[[1.0, 2.0]]", "application/json", "application/json", {}, "r-1")]))  # message 0
    server_end.close()
thread = threading.Thread(target=server, args=(sys.argv[2],))
thread.start()
serve(worker_end, "m", sys.argv[1], "cpu", WorkerOptions())
thread.join()
"""


@pytest.mark.parametrize("hang_up", ["during its load", "during a request"])
def test_a_worker_whose_server_hangs_up_ends_without_writing_to_the_servers_log(tmp_path, hang_up):
    model = handler_model(tmp_path, "m", None, Scale())
    worker = subprocess.run([sys.executable, "-c", WORKER, str(model), hang_up], capture_output=True, text=True,
                            timeout=120)
    assert (worker.returncode, worker.stderr) == (0, "")


@pytest.mark.parametrize("device, gpus, expected", [
    ("cpu", [], ["cpu"]),
    ("cpu", ["cuda:0", "cuda:1"], ["cpu"]),  # a model placed on CPU stays there
    ("cuda:0", ["cuda:0"], ["cuda:0"]),
    ("cuda:1", ["cuda:0", "cuda:1", "cuda:2"], ["cuda:1", "cuda:2", "cuda:0"]),  # from its own GPU, in turn
    ("cuda:10", ["cuda:2", "cuda:10", "cuda:9"], ["cuda:10", "cuda:2", "cuda:9"]),  # numbered, not spelled, order
])
def test_a_pools_workers_take_every_gpu_in_turn_from_the_models_own(device, gpus, expected):
    assert spread(device, gpus) == expected


class Measured:
    """A worker as `charged` sees it: its own pages and its requests' peak."""

    def __init__(self, uss: int, peak: int):
        self.sizes = (uss, peak)

    def measured(self) -> tuple[int, int]:
        return self.sizes


def test_each_worker_is_charged_a_cuda_context_on_its_own_gpu():
    workers = [Measured(100, 5), Measured(120, 9), Measured(110, 7)]
    cost = charged(workers, {"cuda:0": 1000, "cuda:1": 400}, {"cuda:0": 50, "cuda:1": 60}, ["cuda:0", "cuda:1", "cuda:0"])
    assert cost == {"load": {"cpu": 330, "cuda:0": 1100, "cuda:1": 460}, "activation_peak": {"cpu": 9}}
    assert charged(workers, {}, {}, ["cpu"] * 3)["load"] == {"cpu": 330}
