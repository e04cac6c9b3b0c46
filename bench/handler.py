"""Scenario 7: the cost of a SageMaker handler model's own worker process. The same MLP is served as a
TorchScript model in the server's process and as a SageMaker-layout model (default handlers) in a
worker; both take the same JSON body through SageMaker invoke."""

import json
import re
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import torch

from bench.harness import Server, in_process_calls_per_s, mib, save_model, wrk

TITLE = "Handler model in a worker process vs the same TorchScript model in the server's process"


def mlp(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)).eval()


def run(seconds: float, smoke: bool) -> list[str]:
    width = 64 if smoke else 256
    module = torch.jit.script(mlp(width))
    values = np.linspace(-1, 1, width, dtype=np.float32).reshape(1, width)
    reference = in_process_calls_per_s(module, torch.from_numpy(values), 0.2 if smoke else 2)
    body, headers = json.dumps(values.tolist()).encode(), {"Content-Type": "application/json"}
    config = {"backend": "pytorch", "max_batch_size": 8, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [width]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [width]}]}
    lines = [f"MLP {width}→{width}→{width}; in-process torch: {reference:,.0f} calls/s.", "",
             "| model | concurrency | requests/s | p50 ms | p99 ms | errors | model memory |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        save_model(root, "torchscript", module, config)
        (root / "handler").mkdir()
        module.save(str(root / "handler" / "model.pt"))
        server = Server(root)
        try:
            memory = model_memory(server)
            for name in ("torchscript", "handler"):
                for connections in (1, 8, 64):
                    load = wrk(f"{server.url}/models/{name}/invoke", body, headers, connections, seconds)
                    lines.append(f"| {name} | {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | "
                                 f"{load.p99_ms:.2f} | {load.errors} | {mib(memory[name])} |")
        finally:
            server.stop()
    lines += ["", "Model memory is what the cache charges: parameter bytes for the TorchScript model, the worker's USS "
                  "(its own pages, given back when it ends) for the handler model."]
    return lines


def model_memory(server: Server) -> dict[str, float]:
    """Each model's accounted host bytes, from /metrics."""
    text = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    pattern = r'^serve_model_memory_bytes\{device="cpu",model="([^"]+)"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}
