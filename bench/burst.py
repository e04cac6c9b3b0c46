"""Scenario 12: a model that costs microseconds, with Triton's dynamic batching as an operator would
ask for it (`preferred_batch_size: [4, 8]`, a 20 ms queue delay): the mean batch size when 32
`tritonclient` connections burst two requests each, and the latency of one client alone, against the
same model served by direct execution. The server runs on its own core, the clients on the other."""

import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import tritonclient.http as http

from bench.harness import Server, inference_counts, ratio, save_model, v2_binary_request, wrk

TITLE = "Bursts batch, a lone client never waits: dynamic batching of a model that costs microseconds"
CLIENTS = 32
CONFIG = {"backend": "pytorch", "max_batch_size": 8, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}]}
MODELS = {"direct": CONFIG,
          "batching": {**CONFIG, "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 20000}}}


class Double(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return INPUT0 * 2


def run(seconds: float, smoke: bool) -> list[str]:
    values = np.arange(16, dtype=np.float32).reshape(1, 16)
    body, headers = v2_binary_request("INPUT0", values)
    with tempfile.TemporaryDirectory() as scratch:
        for name, config in MODELS.items():
            save_model(Path(scratch), name, Double(), config)
        server = Server(Path(scratch))
        try:
            server.pin()
            lone = {}
            for name in MODELS:
                wrk(f"{server.url}/v2/models/{name}/infer", body, headers, 1, 1)  # warm up: the model is judged fast
                lone[name] = wrk(f"{server.url}/v2/models/{name}/infer", body, headers, 1, seconds)
            bursts = {name: _bursts(server.url, name, values, 2 if smoke else 9) for name in MODELS}
        finally:
            server.stop()
    rows = ["| model | 1 client: requests/s | p50 ms | p99 ms | p50 vs direct | 32 clients bursting: mean batch "
            "| smallest burst mean |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in MODELS:
        load, (mean, smallest) = lone[name], bursts[name]
        rows.append(f"| {name} | {load.requests_per_s:,.0f} | {load.p50_ms:.3f} | {load.p99_ms:.3f} | "
                    f"{ratio(load.p50_ms, lone['direct'].p50_ms)} | {mean:.2f} | {smallest:.2f} |")
    return [f"Each burst: {CLIENTS} connections, already open, send two requests each (the second once the first "
            f"is answered); the mean batch is the requests over the executions the model's V2 statistics "
            f"counted, over {2 if smoke else 9} bursts.", "", *rows]


def _bursts(url: str, name: str, values: np.ndarray, count: int) -> tuple[float, float]:
    """(mean batch size over `count` bursts, the smallest burst's mean)."""
    means = []
    for _ in range(count):
        executions = inference_counts(url, name)[1]
        barrier = threading.Barrier(CLIENTS)
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(_client_burst, [url] * CLIENTS, [name] * CLIENTS, [values] * CLIENTS, [barrier] * CLIENTS))
        means.append(2 * CLIENTS / (inference_counts(url, name)[1] - executions))
    return sum(means) / len(means), min(means)


def _client_burst(url: str, name: str, values: np.ndarray, barrier: threading.Barrier) -> None:
    client = http.InferenceServerClient(url.removeprefix("http://"))
    try:
        client.is_server_live()  # the connection is open before the burst
        tensor = http.InferInput("INPUT0", list(values.shape), "FP32")
        tensor.set_data_from_numpy(values)
        barrier.wait()
        for _ in range(2):
            client.infer(name, [tensor])
    finally:
        client.close()
