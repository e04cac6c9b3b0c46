"""Scenario 2: an MLP 1024→1024→1024 (float32, one row per request) over V2 binary tensors at
concurrency 1, 8 and 64, without and with dynamic batching, against in-process torch at its best
batch size."""

import tempfile
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
             "| model | concurrency | requests/s | p50 ms | p99 ms | errors | vs in-process best |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    body, headers = v2_binary_request("INPUT0", np.random.default_rng(0).standard_normal((1, WIDTH), np.float32))
    config = {"backend": "pytorch", "max_batch_size": 64,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}]}
    with tempfile.TemporaryDirectory() as scratch:
        save_model(Path(scratch), "mlp_direct", module, config)
        save_model(Path(scratch), "mlp_batched", module, {**config, "dynamic_batching": {}})
        server = Server(Path(scratch))
        try:
            for name in ("mlp_direct", "mlp_batched"):
                wrk(f"{server.url}/v2/models/{name}/infer", body, headers, 8, 1 if smoke else 2)  # warm up
                for connections in (1, 8, 64):
                    load = wrk(f"{server.url}/v2/models/{name}/infer", body, headers, connections, seconds)
                    lines.append(f"| {name} | {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | "
                                 f"{load.p99_ms:.2f} | {load.errors} | {load.requests_per_s / reference[best_batch]:.2f}× |")
        finally:
            server.stop()
    return lines
