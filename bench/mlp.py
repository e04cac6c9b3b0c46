"""Scenario 2: an MLP 1024→1024→1024 (float32, one row per request) over V2 binary tensors at
concurrency 1, 8 and 64: direct execution, dynamic batching without a queue delay, and with Triton's
usual 500 µs delay; against in-process torch at its best batch size and against direct execution.
The mean batch is the model's inference count over its execution count during the run (V2 stats)."""

import json
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import torch

from bench.harness import (
    Server,
    in_process_rows_per_s,
    save_model,
    v2_binary_request,
    wrk,
)

TITLE = "MLP 1024→1024→1024, one row per request, V2 binary, with and without dynamic batching"
MODELS = {"mlp_direct": {}, "mlp_batched": {"dynamic_batching": {}},
          "mlp_delay_500us": {"dynamic_batching": {"max_queue_delay_microseconds": 500}}}
WIDTH = 1024


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return self.layers(INPUT0)


def run(seconds: float, smoke: bool) -> list[str]:
    torch.manual_seed(0)
    module = MLP().eval()
    reference = in_process_rows_per_s(module, WIDTH, (1, 8) if smoke else (1, 8, 16, 32, 64), 0.2 if smoke else 2)
    best_batch = max(reference, key=reference.get)
    lines = [f"In-process torch: {reference[best_batch]:,.0f} rows/s at batch {best_batch} "
             f"({', '.join(f'b{b}: {r:,.0f}' for b, r in reference.items())}).", "",
             "| model | concurrency | requests/s | p50 ms | p99 ms | errors | mean batch | vs direct | vs in-process best |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    body, headers = v2_binary_request("INPUT0", np.random.default_rng(0).standard_normal((1, WIDTH), np.float32))
    config = {"backend": "pytorch", "max_batch_size": 64,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}]}
    direct: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, batching in MODELS.items():
            save_model(Path(scratch), name, module, {**config, **batching})
        server = Server(Path(scratch))
        server.pin()
        try:
            for name in MODELS:
                wrk(f"{server.url}/v2/models/{name}/infer", body, headers, 8, 1 if smoke else 2)  # warm up
                for connections in (1, 8, 64):
                    before = _counts(server, name)
                    load = wrk(f"{server.url}/v2/models/{name}/infer", body, headers, connections, seconds)
                    inferences, executions = (after - start for after, start in zip(_counts(server, name), before, strict=True))
                    direct.setdefault(connections, load.requests_per_s)
                    lines.append(f"| {name} | {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | "
                                 f"{load.p99_ms:.2f} | {load.errors} | {inferences / max(executions, 1):.2f} | "
                                 f"{load.requests_per_s / direct[connections]:.2f}× | "
                                 f"{load.requests_per_s / reference[best_batch]:.2f}× |")
        finally:
            server.stop()
    return lines


def _counts(server: Server, name: str) -> tuple[int, int]:
    """The model's inference and execution counts so far."""
    stats = json.load(urllib.request.urlopen(f"{server.url}/v2/models/{name}/stats", timeout=10))["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]
