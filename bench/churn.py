"""Scenario 4: model churn — 20 models of 8 MiB, a budget for 5, requests through /invocations with
targets drawn from a skewed (Zipf) distribution, so models load on first use and the least recently
used idle ones are evicted."""

import json
import random
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import torch

from bench.harness import Server, save_model, wrk

TITLE = "Model churn: 20 models, a budget for 5, Zipf-distributed targets"
MODELS, BUDGET_MODELS, MIB = 20, 5, 1 << 20


class Held(torch.nn.Module):
    def __init__(self, mib: int):
        super().__init__()
        self.register_buffer("weights", torch.ones(mib * MIB // 4))

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return INPUT0 + self.weights[0]


def zipf_lua(names: list[str], body: bytes) -> str:
    weights = [1 / (rank + 1) for rank in range(len(names))]
    cumulative, total = [], 0.0
    for weight in weights:
        total += weight
        cumulative.append(total / sum(weights))
    return f"""
local names = {{{", ".join(json.dumps(n) for n in names)}}}
local cumulative = {{{", ".join(f"{c:.6f}" for c in cumulative)}}}
local body = {json.dumps(body.decode())}
request = function()
  local r = math.random()
  local i = 1
  while cumulative[i] < r do i = i + 1 end
  wrk.headers["X-Amzn-SageMaker-Target-Model"] = names[i]
  wrk.headers["Content-Type"] = "application/json"
  return wrk.format("POST", "/invocations", wrk.headers, body)
end
"""


def in_process(directory: Path, names: list[str], seconds: float) -> float:
    """The same draws against an in-process LRU of BUDGET_MODELS modules: torch.jit.load on a miss."""
    weights = [1 / (rank + 1) for rank in range(len(names))]
    rng, resident = random.Random(0), OrderedDict()
    example = torch.ones(1, 4)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        name = rng.choices(names, weights)[0]
        if name not in resident:
            if len(resident) >= BUDGET_MODELS:
                resident.popitem(last=False)
            resident[name] = torch.jit.load(str(directory / name / "1" / "model.pt"))
        resident.move_to_end(name)
        with torch.inference_mode():
            resident[name](example)
        count += 1
    return count / (time.perf_counter() - start)


def run(seconds: float, smoke: bool) -> list[str]:
    size = 1 if smoke else 8
    names = [f"model{i:02d}" for i in range(MODELS)]
    config = {"backend": "pytorch", "max_batch_size": 4, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
    body = b"[[1, 2, 3, 4]]"
    lines = ["| concurrency | requests/s | p50 ms | p99 ms | errors | loads | evictions | hits | misses |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as scratch:
        module = Held(size)
        for name in names:
            save_model(Path(scratch), name, module, config)
        reference = in_process(Path(scratch), names, seconds)
        lines = [f"In-process torch (an LRU of {BUDGET_MODELS}, `torch.jit.load` on a miss, same draws): {reference:,.0f} requests/s.",
                 "", *lines]
        # a model is charged its weights and what its load, threads and executions measurably add (≈ 1.6 MiB)
        server = Server(Path(scratch), SERVE_MEMORY_LIMIT=f"{BUDGET_MODELS * (size + 2)}MiB", SERVE_LOAD_MODELS="")
        try:
            for connections in (1, 8):
                before = server.metrics()
                load = wrk(server.url + "/invocations", connections=connections, seconds=seconds, lua=zipf_lua(names, body))
                after = server.metrics()
                counts = [after.get(k, 0) - before.get(k, 0) for k in
                          ("serve_model_loads_total", "serve_model_evictions_total", "serve_cache_hits_total", "serve_cache_misses_total")]
                lines.append(f"| {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | {load.p99_ms:.2f} | "
                             f"{load.errors} | " + " | ".join(f"{c:,.0f}" for c in counts) + " |")
        finally:
            server.stop()
    return lines
