"""Scenario 6: the idle server's memory, and what the cache charges against what the models really
hold, after 20 mixed models — TorchScript, frozen TorchScript (weights as graph constants), and
handler models whose model_fn returns a tuple rather than an nn.Module. "Real" is measured here from
outside, with psutil: the worker's own pages (USS) above its idle start, plus every handler worker
process's own pages."""

import json
import tempfile
import textwrap
from pathlib import Path

import psutil
import torch

from bench.churn import Held
from bench.harness import Server, mib, save_model

TITLE = "Memory: idle server, and accounted against real after 20 mixed models"
CONFIG = {"backend": "pytorch", "max_batch_size": 4, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
HANDLER = """
import torch
def model_fn(model_dir):
    return torch.ones({floats}), "weights and a label"
def predict_fn(data, model):
    return data * model[0][0]
"""


class Layers(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, width), torch.nn.Linear(width, 4))

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return self.layers(INPUT0)


def build(root: Path, count: int, scale: int) -> list[str]:
    """A third each: TorchScript of 2–8 MiB × scale, frozen of (size × 256 × scale)² floats, handlers of
    2–8 MiB × scale."""
    names = []
    for index in range(count):
        kind, size = ("script", "frozen", "handler")[index % 3], 1 + index % 4
        name = f"{kind}{index}"
        if kind == "script":
            save_model(root, name, Held(2 * size * scale), CONFIG)
        elif kind == "frozen":
            frozen = torch.jit.freeze(torch.jit.script(Layers(256 * size * scale).eval()))
            (root / name / "1").mkdir(parents=True)
            (root / name / "config.json").write_text(json.dumps(CONFIG))
            frozen.save(str(root / name / "1" / "model.pt"))
        else:
            (root / name / "code").mkdir(parents=True)
            (root / name / "code" / "inference.py").write_text(textwrap.dedent(HANDLER.format(floats=size * scale * (1 << 19))))
        names.append(name)
    return names


def run(seconds: float, smoke: bool) -> list[str]:
    count, scale = (6, 1) if smoke else (20, 2)
    with tempfile.TemporaryDirectory() as scratch:
        names = build(Path(scratch), count, scale)
        server = Server(Path(scratch), SERVE_LOAD_MODELS="")
        try:
            worker = psutil.Process(server.worker_pid())
            idle_rss, idle = server.worker_rss(), worker.memory_full_info().uss
            for name in names:
                assert server.post("/models", json.dumps({"model_name": name, "url": name}).encode()) == 200, name
                for _ in range(3):  # the first executions measure the activation peak
                    assert server.post(f"/models/{name}/invoke", b"[[1, 2, 3, 4]]") == 200, name
            own = worker.memory_full_info().uss - idle
            handlers = sum(p.memory_full_info().uss for p in worker.children(recursive=True) if p.ppid() != worker.pid)
            metrics = server.metrics()
        finally:
            server.stop()
    real, accounted = own + handlers, metrics["serve_memory_accounted_bytes"]
    return ["| measure | value |", "| --- | --- |",
            f"| idle server (worker RSS, torch imported) | {mib(idle_rss)} |",
            f"| {count} models: real (server's own pages above idle + handler workers') | {mib(real)} |",
            f"| … accounted by the cache | {mib(accounted)} ({accounted / real:.2f}× real) |",
            f"| … the server's own measurement (`serve_memory_measured_bytes`) | {mib(metrics['serve_memory_measured_bytes'])} |"]
