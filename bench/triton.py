"""Triton as a peer row: the `tritonserver` binary and python backend that the `nvidia-pytriton` wheel
ships, serving the same TorchScript models through a small python-backend `model.py` (the wheel has
no libtorch backend). `make bench-triton` installs it into its own venv, with torch==2.13.0 in the
same pip command so the CPU wheel is kept; without it, scenarios leave the Triton rows out and say so.
"""

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from google.protobuf import json_format, text_format

from bench.harness import (
    PROJECT,
    SERVER_CORES,
    Load,
    Server,
    cpu_seconds,
    end_group,
    free_port,
    pin_apart,
    ratio,
    save_model,
    starting_on,
    wait_ready,
    wrk,
)
from bench.plot import line_chart
from container.models.triton_schema import model_config_pb2 as pb

VENV = Path(os.environ.get("TRITON_VENV", PROJECT / "bench" / ".triton"))
MISSING = "Triton: not installed here (`make bench-triton` installs it), so its rows are left out."

MODEL_PY = '''
import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)
        config = json.loads(args["model_config"])
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]
        self.module = torch.jit.load(f"{args['model_repository']}/{args['model_version']}/model.pt").eval()

    def execute(self, requests):
        """The requests Triton's dynamic batcher hands over run as one batch, as libtorch's backend runs them."""
        columns = [[pb_utils.get_input_tensor_by_name(r, n).as_numpy() for r in requests] for n in self.inputs]
        rows = [len(array) for array in columns[0]]
        with torch.inference_mode():
            result = self.module(*[torch.from_numpy(np.concatenate(arrays)) for arrays in columns])
        result = result if isinstance(result, tuple) else (result,)
        splits = [r.numpy() for r in result]
        responses, start = [], 0
        for count in rows:
            tensors = [pb_utils.Tensor(n, np.ascontiguousarray(out[start:start + count])) for n, out in zip(self.outputs, splits)]
            responses.append(pb_utils.InferenceResponse(tensors))
            start += count
        return responses
'''


def side_by_side(models: dict, routes: list, concurrencies, seconds: float, also=None, plot: Path | None = None,
                 **server_env) -> list[str]:
    """One table: each route at each concurrency through this server and, for the V2 routes, through
    Triton serving the same `models` — requests/s, latency, the server's CPU per request (its whole
    process tree), and the ratio of the two. Both servers run at once, pinned apart from wrk, and take
    turns within each row (`alternately`), so a noisy machine moves both alike; every route at one
    concurrency is measured before the next, so the routes compared with each other (TF Serving predict
    with V2 JSON, say) are measured within a minute. `also(server)` may add lines measured on this
    server before it stops. `plot`: where to write requests/s against clients of the routes Triton
    serves too, both servers side by side (bench/plot.py)."""
    measured, peer_rows, extra = {}, {}, []
    with both_servers(models, **server_env) as (server, peer):
        for connections in concurrencies:
            for label, path, body, headers in routes:
                both = {"peer": peer} if peer is not None and path.startswith("/v2/") else {}
                rows = alternately({"server": server, **both}, path, body, headers, connections, seconds)
                measured[label, connections] = rows["server"]
                if both:
                    peer_rows[label, connections] = rows["peer"]
        extra = also(server) if also else []
    if plot is not None:
        _plot(plot, measured, peer_rows, [label for label, path, *_ in routes if path.startswith("/v2/")], concurrencies)
    in_order = [(label, connections) for label, *_ in routes for connections in concurrencies]
    rows = [("this server", *key, measured[key]) for key in in_order]
    rows += [("Triton (python backend)", *key, peer_rows[key]) for key in in_order if key in peer_rows]
    lines = [] if peer_rows else [MISSING, ""]
    lines += ["| server | protocol | concurrency | requests/s | p50 ms | p99 ms | errors | server CPU µs/request | vs Triton |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for who, label, connections, (load, cpu_us) in rows:
        peer_row = peer_rows.get((label, connections)) if who == "this server" else None
        versus = ratio(load.requests_per_s, peer_row[0].requests_per_s) if peer_row else "—"
        lines.append(f"| {who} | {label} | {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | "
                     f"{load.p99_ms:.2f} | {load.errors} | {cpu_us:,.0f} | {versus} |")
    return lines + extra


@contextlib.contextmanager
def both_servers(models: dict, **server_env):
    """(this server, Triton or None where it is not installed), serving the same `models` ({name:
    (TorchScript module, config)}), both pinned apart from the load generator; stopped at the end."""
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as running:
        for name, (module, config) in models.items():
            save_model(Path(scratch), name, module, config)
        server = Server(Path(scratch), **server_env)
        running.callback(server.stop)
        peer = Triton(models) if tritonserver() else None
        if peer is not None:
            running.callback(peer.stop)
            peer.pin()
        server.pin()
        yield server, peer


def _plot(path: Path, measured: dict, peer_rows: dict, labels: list[str], concurrencies) -> None:
    series = {}
    for label in labels:
        series[f"this server, {label}"] = [measured[label, c][0].requests_per_s for c in concurrencies]
        if peer_rows:
            series[f"Triton, {label}"] = [peer_rows[label, c][0].requests_per_s for c in concurrencies]
    line_chart(path, "Requests/s against clients, one server core", list(concurrencies), series)


def measure(url: str, pid: int, path: str, body: bytes, headers: dict, connections: int, seconds: float):
    """wrk against `url + path`, and the server's CPU time per request meanwhile (its whole process tree)."""
    before = cpu_seconds(pid)
    load = wrk(url + path, body, headers, connections, seconds)
    used = cpu_seconds(pid) - before
    return load, used / max(load.requests_per_s * max(1, round(seconds)), 1) * 1e6


def alternately(servers: dict, path: str, body: bytes, headers: dict, connections: int, seconds: float) -> dict:
    """who → what `measure` gives, for each of `servers` ({who: server}) in turn: `seconds` each, in
    slices of about two seconds, in the order A B, B A, A B …, so that a machine that slows down or
    speeds up within the row (a shared VM's neighbours: 25% within a minute here) weighs on every
    server alike. Requests/s and CPU per request are over all slices; p50 is their median, p99 the worst."""
    slices = max(1, int(seconds // 2))
    taken = {who: [] for who in servers}
    pids = [server.process.pid for server in servers.values()]
    for turn in range(slices):
        for who, server in (list(servers.items()) if turn % 2 == 0 else reversed(servers.items())):
            settle(pids)
            taken[who].append(measure(server.url, server.process.pid, path, body, headers, connections, seconds / slices))
    return {who: combined(measured) for who, measured in taken.items()}


def settle(pids: list[int], limit: float = 15.0) -> None:
    """Until the servers' process trees go idle (under 5% of a core for 0.1 s), at most `limit` seconds:
    work that requests of the last slice left behind when wrk closed their connections must not fall
    into the next (3 MB JSON bodies at 64 connections left ~1.6 s, and the next row's p99 read 1.8 s)."""
    deadline = time.monotonic() + limit
    used = sum(map(cpu_seconds, pids))
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = sum(map(cpu_seconds, pids))
        if now - used < 0.005:
            return
        used = now


def combined(measured: list) -> tuple:
    """One (Load, CPU µs per request) from slices of equal length."""
    loads = [load for load, _ in measured]
    served = sum(load.requests_per_s for load in loads)
    load = Load(served / len(loads), statistics.median(load.p50_ms for load in loads), max(load.p99_ms for load in loads),
                sum(load.errors for load in loads), statistics.fmean(load.client_cpu for load in loads))
    return load, sum(load.requests_per_s * cpu_us for load, cpu_us in measured) / max(served, 1)


def tritonserver() -> Path | None:
    binary = _package() / "tritonserver" / "bin" / "tritonserver" if _package() else None
    return binary if binary and binary.is_file() else None


def _package() -> Path | None:
    found = sorted(VENV.glob("lib/python3*/site-packages/pytriton"))
    return found[0] if found else None


class Triton:
    """tritonserver on free ports serving `models` ({name: (TorchScript module, config as a dict in
    the shape of config.json)}), each through the python backend, with dynamic batching where the config asks."""

    def __init__(self, models: dict, cores=SERVER_CORES, repository: Path | None = None, arguments=()):
        """`cores`: where it starts (Server's); `repository`: a model repository to serve as it is, instead of
        `models`; `arguments`: tritonserver's own, added."""
        self._scratch = tempfile.TemporaryDirectory(prefix="bench-triton-")
        scratch, package = Path(self._scratch.name), _package()
        backends = scratch / "backends"
        shutil.copytree(package / "tritonserver" / "backends" / "python", backends / "python")
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        shutil.copy(package / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub", backends / "python")
        for name, (module, config) in models.items():
            self._write_model(scratch / "models" / name, module, config)
        repository = repository or scratch / "models"
        ports = [free_port() for _ in range(3)]
        self.url = f"http://127.0.0.1:{ports[0]}"
        self.grpc_url = f"http://127.0.0.1:{ports[1]}"
        self.metrics_url = f"http://127.0.0.1:{ports[2]}/metrics"
        self.log = scratch / "triton.log"
        # the wheel's libraries first; then any the environment names (bench/device/run: the stub's libpython)
        libraries = [str(package.parent / "nvidia_pytriton.libs"), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        environment = {**os.environ, "LD_LIBRARY_PATH": ":".join(libraries)}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [str(tritonserver()), f"--model-repository={repository}", f"--backend-directory={backends}",
                 f"--http-port={ports[0]}", f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}", "--log-verbose=0",
                 *arguments],
                env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=starting_on(cores))
        wait_ready(self, self.log)

    def _write_model(self, directory: Path, module, config: dict) -> None:
        import torch

        (directory / "1").mkdir(parents=True)
        document = {k: v for k, v in config.items() if k != "backend"}
        message = json_format.ParseDict({**document, "backend": "python", "instance_group": [{"kind": "KIND_CPU", "count": 1}],
                                         "parameters": {"EXECUTION_ENV_PATH": {"string_value": str(VENV)}}}, pb.ModelConfig())
        (directory / "config.pbtxt").write_text(text_format.MessageToString(message))
        (directory / "1" / "model.py").write_text(MODEL_PY)
        torch.jit.script(module).save(str(directory / "1" / "model.pt"))

    def pin(self) -> None:
        pin_apart(self.process.pid)

    def stop(self) -> None:
        end_group(self.process)
        self._scratch.cleanup()
