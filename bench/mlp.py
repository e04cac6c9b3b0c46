"""Scenario 2: an MLP 1024→1024→1024 (float32, one row per request) over V2 binary tensors at
concurrency 1, 8 and 64: direct execution, dynamic batching without a queue delay, and with Triton's
usual 500 µs delay; against in-process torch at its best batch size and against direct execution.
The mean batch is the model's inference count over its execution count during the run (V2 stats)."""

import contextlib
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.harness import (
    Server,
    in_process_rows_per_s,
    inference_counts,
    ratio,
    save_model,
    v2_binary_request,
    wrk,
)
from bench.triton import MISSING, Triton, alternately, tritonserver

TITLE = "MLP 1024→1024→1024, one row per request, V2 binary, with and without dynamic batching"
MODELS = {"mlp_direct": {}, "mlp_batched": {"dynamic_batching": {}},
          "mlp_delay_500us": {"dynamic_batching": {"max_queue_delay_microseconds": 500}}}
WIDTH = 1024
CONCURRENCIES = (1, 8, 64)


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
             "| server | model | concurrency | requests/s | p50 ms | p99 ms | errors | mean batch | server CPU µs/request "
             "| vs direct | vs in-process best | vs Triton |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    body, headers = v2_binary_request("INPUT0", np.random.default_rng(0).standard_normal((1, WIDTH), np.float32))
    config = {"backend": "pytorch", "max_batch_size": 64,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}]}
    models = {name: (module, {**config, **batching}) for name, batching in MODELS.items()}
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as running:
        for name, (model, model_config) in models.items():
            save_model(Path(scratch), name, model, model_config)
        servers = {"this server": Server(Path(scratch))}
        running.callback(servers["this server"].stop)
        if tritonserver():
            servers["Triton (python backend)"] = Triton(models)
            running.callback(servers["Triton (python backend)"].stop)
        measured = _rows(servers, body, headers, seconds, smoke)
    ours, triton = measured["this server"], measured.get("Triton (python backend)", {})
    lines[0:0] = [] if triton else [MISSING, ""]
    for who, rows in (("this server", ours), ("Triton (python backend)", triton)):
        for name, connections in ((n, c) for n in MODELS for c in CONCURRENCIES if (n, c) in rows):
            load, batch, cpu_us = rows[name, connections]
            peer = triton.get((name, connections)) if who == "this server" else None
            lines.append(f"| {who} | {name} | {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | "
                         f"{load.p99_ms:.2f} | {load.errors} | {batch:.2f} | {cpu_us:,.0f} | "
                         f"{ratio(load.requests_per_s, rows[('mlp_direct', connections)][0].requests_per_s)} | "
                         f"{ratio(load.requests_per_s, reference[best_batch])} | "
                         f"{ratio(load.requests_per_s, peer[0].requests_per_s) if peer else '—'} |")
    return lines


def _rows(servers: dict, body: bytes, headers: dict, seconds: float, smoke: bool) -> dict:
    """who → (model, concurrency) → (wrk's load, mean batch, server CPU µs per request); the servers take
    turns within each row (`alternately`), all servers pinned apart from wrk, and every model
    at one concurrency before the next, so the models compared with each other (batched with direct)
    are measured within a minute."""
    rows = {who: {} for who in servers}
    for server in servers.values():
        server.pin()
    for name in MODELS:
        for server in servers.values():
            wrk(f"{server.url}/v2/models/{name}/infer", body, headers, 8, 1 if smoke else 2)  # warm up
    for connections in (8,) if smoke else CONCURRENCIES:  # a smoke run checks the script, not the curve
        for name in MODELS:
            before = {who: inference_counts(server.url, name) for who, server in servers.items()}
            measured = alternately(servers, f"/v2/models/{name}/infer", body, headers, connections, seconds)
            for who, server in servers.items():
                inferences, executions = (after - start for after, start in zip(inference_counts(server.url, name), before[who], strict=True))
                load, cpu_us = measured[who]
                rows[who][name, connections] = (load, inferences / max(executions, 1), cpu_us)
    return rows

