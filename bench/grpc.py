"""Scenario: Triton's gRPC `ModelInfer` (raw tensors) on the tiny model, the MLP and a 4 MB echo at
1, 8 and 64 clients, through this server's gRPC front-end and Triton's own gRPC endpoint, driven by h2load (C,
HTTP/2) with one call in flight per connection. The server's CPU per request counts its whole process
tree: the front-end process, the worker and the hop between them. Then the HTTP rows that the
front-end must not slow: tiny over V2 binary with gRPC off and on, in the same run. Beside them, grpcio's
floor (bench/grpc_floor.py): what a call costs the library the front-end is built on, with nothing else."""

import contextlib
import json
import subprocess
import sys
import urllib.request

import numpy as np
import torch
from tritonclient.grpc import service_pb2 as pb

from bench.harness import Server, cpu_seconds, free_port, h2load, pin_apart, ratio, v2_binary_request
from bench.mlp import MLP, WIDTH
from bench.tiny import Double
from bench.triton import MISSING, both_servers, measure

TITLE = "gRPC ModelInfer beside Triton's gRPC, and what the gRPC front-end costs HTTP"
FLOOR = "grpcio alone (canned answer)"
METHOD = "/inference.GRPCInferenceService/ModelInfer"
CONCURRENCIES = (1, 8, 64)


def _config(width: int, **more) -> dict:
    return {"backend": "pytorch", "max_batch_size": 8, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [width]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [width]}], **more}


class Echo(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return INPUT0 * 1.0


LARGE = 1_000_000  # floats: 4 MB in and out, which crosses between the processes through shared memory
MODELS = {"tiny": (Double(), _config(16)), "mlp": (MLP(), _config(WIDTH)), "echo_4mb": (Echo(), _config(-1))}


def infer_message(model: str, width: int) -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, width])
    request.raw_input_contents.append(np.random.default_rng(0).random((1, width), np.float32).tobytes())
    return request.SerializeToString()


def measure_grpc(url: str, pid: int, message: bytes, connections: int, seconds: float):
    before = cpu_seconds(pid)
    load = h2load(url, METHOD, message, connections, seconds)
    used = cpu_seconds(pid) - before
    return load, used / max(load.requests_per_s * max(1, round(seconds)), 1) * 1e6


def _inferences(server, model: str) -> int:
    """The model's inference count (V2 statistics): h2load sees HTTP statuses only, this sees successes."""
    with urllib.request.urlopen(f"{server.url}/v2/models/{model}/stats", timeout=10) as answer:
        return json.load(answer)["model_stats"][0]["inference_count"]


def run(seconds: float, smoke: bool) -> list[str]:
    rows, unanswered = {}, []
    concurrencies = (8,) if smoke else CONCURRENCIES  # a smoke run checks the script, not the curve
    with both_servers(MODELS) as (server, peer):
        for model, width in (("tiny", 16), ("mlp", WIDTH), ("echo_4mb", LARGE)):
            message = infer_message(model, width)
            for connections in concurrencies:
                if peer is not None:
                    rows["Triton (python backend)", model, connections] = measure_grpc(
                        peer.grpc_url, peer.process.pid, message, connections, seconds)
                before = _inferences(server, model)
                rows["this server", model, connections] = load, _ = measure_grpc(
                    server.grpc_url, server.process.pid, message, connections, seconds)
                answered = _inferences(server, model) - before
                if answered < load.requests_per_s * max(1, round(seconds)) * 0.9:  # h2load counted calls that failed
                    unanswered.append(f"{model} at {connections}: {answered} inferences for h2load's "
                                      f"{load.requests_per_s * round(seconds):,.0f} calls")
        with _grpcio_floor() as (url, pid):
            for connections in concurrencies:
                rows[FLOOR, "tiny", connections] = measure_grpc(url, pid, infer_message("tiny", 16), connections, seconds)
        http = _http_cost(server, seconds, concurrencies)
    lines = [] if peer is not None else [MISSING, ""]
    lines += ["| server | model | concurrency | requests/s | p50 ms | p99 ms | errors | server CPU µs/request | vs Triton |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    order = {"this server": 0, FLOOR: 1}
    for (who, model, connections), (load, cpu_us) in sorted(rows.items(), key=lambda item: (item[0][1], item[0][2], order.get(item[0][0], 2))):
        peer_row = rows.get(("Triton (python backend)", model, connections)) if who in order else None
        versus = ratio(load.requests_per_s, peer_row[0].requests_per_s) if peer_row else "—"
        lines.append(f"| {who} | {model} | {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | {load.p99_ms:.2f} | "
                     f"{load.errors} | {cpu_us:,.0f} | {versus} |")
    if unanswered:
        lines += ["", "Calls the server did not count as answered: " + "; ".join(unanswered)]
    return lines + ["", *http]


@contextlib.contextmanager
def _grpcio_floor():
    """(url, pid) of bench/grpc_floor.py's server, pinned where this server runs."""
    port = free_port()
    floor = subprocess.Popen([sys.executable, "-m", "bench.grpc_floor", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        if floor.stdout.readline().strip() != "ready":
            raise RuntimeError("bench.grpc_floor did not start")
        pin_apart(floor.pid)
        yield f"http://127.0.0.1:{port}", floor.pid
    finally:
        floor.kill()
        floor.wait()


def _http_cost(with_grpc: Server, seconds: float, concurrencies: tuple[int, ...]) -> list[str]:
    """Tiny over V2 binary through a server without gRPC and the one with it, measured turn about."""
    without = Server(with_grpc.model_root, SERVE_GRPC_PORT="off")
    try:
        without.pin()
        body, headers = v2_binary_request("INPUT0", np.arange(16, dtype=np.float32).reshape(1, 16))
        lines = ["| V2 binary, tiny | concurrency | requests/s, gRPC off | requests/s, gRPC on | on / off | p50 ms off / on |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for connections in concurrencies:
            off, _ = measure(without.url, without.process.pid, "/v2/models/tiny/infer", body, headers, connections, seconds)
            on, _ = measure(with_grpc.url, with_grpc.process.pid, "/v2/models/tiny/infer", body, headers, connections, seconds)
            lines.append(f"| | {connections} | {off.requests_per_s:,.0f} | {on.requests_per_s:,.0f} | "
                         f"{ratio(on.requests_per_s, off.requests_per_s)} | {off.p50_ms:.2f} / {on.p50_ms:.2f} |")
        return lines
    finally:
        without.stop()
