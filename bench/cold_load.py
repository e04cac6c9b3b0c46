"""Scenario 5: cold load — `POST /models` to 200 for a 100 MiB TorchScript model against
`torch.jit.load` of the same file in-process; and the server's memory after 50 load/unload cycles
against after the first, to show that unloading returns memory."""

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.churn import Held
from bench.harness import Server, mib, save_model

TITLE = "Cold load of a 100 MiB model, and memory across load/unload cycles"


def run(seconds: float, smoke: bool) -> list[str]:
    size, cycles, repeats = (10, 3, 2) if smoke else (100, 50, 5)
    config = {"backend": "pytorch", "max_batch_size": 4, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
    with tempfile.TemporaryDirectory() as scratch:
        save_model(Path(scratch), "big", Held(size), config)
        in_process = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.jit.load(str(Path(scratch) / "big" / "1" / "model.pt"))
            in_process.append(time.perf_counter() - start)
        server = Server(Path(scratch), SERVE_LOAD_MODELS="")
        try:
            body = json.dumps({"model_name": "big", "url": "big"}).encode()
            served, memory = [], []
            for _ in range(cycles):
                start = time.perf_counter()
                assert server.post("/models", body) == 200
                served.append(time.perf_counter() - start)
                server.delete("/models/big")
                memory.append(server.worker_rss())
        finally:
            server.stop()
    load_ms, reference_ms = statistics.median(served[:repeats]) * 1000, statistics.median(in_process) * 1000
    return ["| measure | served | in-process | ratio |", "| --- | --- | --- | --- |",
            f"| load {size} MiB (median of {repeats}) | {load_ms:,.0f} ms | {reference_ms:,.0f} ms | {load_ms / reference_ms:.2f}× |",
            "", f"Worker memory after the first load/unload: {mib(memory[0])}; after {cycles}: {mib(memory[-1])} "
                f"({mib(memory[-1] - memory[0])} more)."]

