"""A real server for integration tests: `./serve` (gunicorn, one gevent worker) on a free port."""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import free_port
from container.logs import SERVER_FAULTS
from tests import grpc_clients
from tests.builders import descriptors, wait_for

PROJECT = Path(__file__).resolve().parent.parent


class Server:
    logs: Path | None = None  # where servers write their logs (set per session below; default: the temporary directory)

    def __init__(self, model_root: Path, port: int | None = None, wrapper: tuple[str, ...] = (), answering: bool = True, **env):
        """`port`: where it listens for HTTP (default: a free one); `wrapper`: a command that runs it (`prlimit …`);
        `answering`: return once it answers (False: once it is started)."""
        self.model_root = model_root
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_port = free_port()
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        environment = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "SAGEMAKER_BIND_TO_PORT": str(self.port),
            "SERVE_GRPC_PORT": str(self.grpc_port),
            "SERVE_MODEL_ROOT": str(model_root),
            "SERVE_LOG_LEVEL": "warning",
            **env,
        }
        environment = {k: str(v) for k, v in environment.items() if v is not None}  # NAME=None: left unset
        # not beside the model root: that may be the repository's own examples/
        with tempfile.NamedTemporaryFile(prefix=f"server-{self.port}-", suffix=".log", dir=self.logs, delete=False) as log:
            self.log = Path(log.name)
            self.process = subprocess.Popen([*wrapper, str(PROJECT / "serve")], cwd=PROJECT, env=environment,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if answering:
                wait_for(self._answers, 60, f"server did not answer /ping (log: {self.log})")
        except BaseException:
            self.stop()
            raise

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"server exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
        try:  # the model process answers liveness once it runs, while the models named at start still load
            return requests.get(self.url + "/v2/health/live", timeout=1).status_code in (200, 403)  # 403: restricted
        except requests.RequestException:  # the server is still booting
            return False

    def ready(self) -> bool:
        """Whether the models named at start have loaded: in multi-model mode `/ping` says only that the
        model process is alive, as SageMaker's contract has it."""
        return self.request("GET", "/v2/health/ready").status_code == 200

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", 60)
        return requests.request(method, self.url + path, **kwargs)

    def load(self, name: str, url: str | None = None) -> requests.Response:
        return self.request("POST", "/models", json={"model_name": name, "url": url or name})

    def invoke(self, name: str, payload, **kwargs) -> requests.Response:
        return self.request("POST", f"/models/{name}/invoke", json=payload, **kwargs)

    def loaded(self) -> list[str]:
        return [m["modelName"] for m in self.request("GET", "/models?limit=1000").json()["models"]]

    def grpc_ready(self) -> bool:
        """Whether the gRPC front-end answers ServerReady with true (False while its port is not open)."""
        import tritonclient.grpc as triton_grpc

        with grpc_clients.InferenceServerClient(self.grpc_url) as client:
            try:
                return client.is_server_ready()
            except triton_grpc.InferenceServerException:
                return False

    def worker_pid(self) -> int:
        """The gunicorn worker: the model process (the master's other children are front-ends)."""
        return next(iter(self.worker_pids()))

    def worker_pids(self) -> list[int]:
        """Every gunicorn worker running (one, but while gunicorn replaces it)."""
        return [pid for pid, command in self._children() if "gunicorn" in command]

    def grpc_pid(self) -> int:
        """The first gRPC front-end's pid (StopIteration while none runs)."""
        return next(iter(self.grpc_pids()))

    def grpc_pids(self) -> list[int]:
        """The gRPC front-ends' pids, ordered as the master started them."""
        return [pid for pid, command in self._children() if "container.grpc_api" in command]

    def http_pids(self) -> list[int]:
        """The HTTP front-end processes, by the order the master started them."""
        return [pid for pid, command in self._children() if "container.http_frontend" in command]

    def _children(self) -> list[tuple[int, str]]:
        # each thread lists the children it started: the front-ends are the master's thread's
        pids = [pid for task in Path(f"/proc/{self.process.pid}/task").iterdir() for pid in _read(task / "children").split()]
        children = []
        for pid in pids:
            try:
                children.append((int(pid), Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")))
            except OSError:  # exited meanwhile
                pass
        return children

    def channel_peers(self) -> int:
        """Front-end processes connected to the model process's channel now (its Unix sockets in the
        connected state; the listener is not one)."""
        inodes = {target[8:-1] for target in descriptors(self.worker_pid()) if target.startswith("socket:[")}
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
        return sum(1 for line in lines if len(fields := line.split()) > 7 and fields[6] in inodes and fields[5] == "03"
                   and fields[7].endswith("models.sock"))

    def replaced(self, worker: int) -> bool:
        """gunicorn runs a worker other than `worker` (False between the old one's exit and the new one's start)."""
        try:
            return self.worker_pid() != worker
        except (StopIteration, OSError):
            return False

    def metrics(self) -> dict[tuple, float]:
        """Every sample of /metrics by (name, sorted labels); counters read as `…_total`."""
        answer = self.request("GET", "/metrics")
        assert answer.status_code == 200, answer.text
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(answer.text) for sample in family.samples}

    def terminate(self) -> None:
        """SIGTERM to each of its processes: it stops (`stop` waits for it)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # a thread that ended meanwhile
        return ""


def bugs_logged(server: Server) -> list[str]:
    found = []
    for line in _read(server.log).splitlines():
        try:
            message = json.loads(line).get("message")
        except (ValueError, AttributeError):
            continue
        if message in SERVER_FAULTS:
            found.append(line[:3000])
    return found


def servers_started():
    """A fixture's body: it gives `start(root, port=None, **env)`, and stops every server it started at
    the end of the fixture's scope, which fails if any logged a bug of its own (`SERVER_FAULTS`): a test
    passes only if its server had nothing to hide."""
    servers = []

    def start(model_root: Path, port: int | None = None, **env) -> Server:
        servers.append(Server(model_root, port, **env))
        return servers[-1]

    yield start
    for server in servers:  # all at once: a module may have started a dozen
        server.terminate()
    for server in servers:
        server.stop()
    if bugs := [line for server in servers for line in bugs_logged(server)]:
        pytest.fail("the server logged bugs of its own:\n" + "\n".join(bugs), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def server_logs(tmp_path_factory):
    """The session's server logs in pytest's own temporary directory, of which it keeps the last three
    sessions': a long-lived machine does not gather every run's logs."""
    Server.logs = tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="module")
def start_server():
    """Start servers for a test module (`start_server(root, **env)`); all are stopped at its end."""
    yield from servers_started()


def pytest_collection_modifyitems(items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU; torch sees none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
