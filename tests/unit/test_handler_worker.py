"""A handler model's worker process on its own (backends/handler_worker.py), without a server: what
it does when the server on the other end of its socket goes away."""

import subprocess
import sys

import pytest

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
        server_end.send((b"[[1.0, 2.0]]", "application/json", "application/json", {}, "r-1"))
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
