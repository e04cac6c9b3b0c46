"""Scenario 6: the idle server's memory, and what the cache charges against what the models really
hold, after 20 mixed models — TorchScript, frozen TorchScript (weights as graph constants), handler
models whose model_fn returns a tuple rather than an nn.Module, and ExportedPrograms (`.pt2`). "Real"
is measured here from outside, with psutil: the worker's own pages (USS) above its idle start, plus
every handler worker process's own pages and the fork server's heap; the server accounts it as what
its models are charged plus what its own parts took (`serve_memory_server_bytes`: torch.export's
modules, the fork server)."""

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
    """A quarter each: TorchScript of 2–8 MiB × scale, frozen and exported of (size × 256 × scale)²
    floats, handlers of 2–8 MiB × scale."""
    names = []
    for index in range(count):
        kind, size = ("script", "frozen", "handler", "program")[index % 4], 1 + index % 4
        name = f"{kind}{index}"
        if kind == "script":
            save_model(root, name, Held(2 * size * scale), CONFIG)
        elif kind == "frozen":
            frozen = torch.jit.freeze(torch.jit.script(Layers(256 * size * scale).eval()))
            (root / name / "1").mkdir(parents=True)
            (root / name / "config.json").write_text(json.dumps(CONFIG))
            frozen.save(str(root / name / "1" / "model.pt"))
        elif kind == "program":  # no config: the server completes it from the program
            rows = {"INPUT0": {0: torch.export.Dim("batch")}}
            program = torch.export.export(Layers(256 * size * scale).eval(), (torch.ones(2, 4),), dynamic_shapes=rows)
            (root / name / "1").mkdir(parents=True)
            torch.export.save(program, root / name / "1" / "model.pt2")
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
            fork_server = sum(p.memory_info().rss - p.memory_info().shared for p in worker.children())
            metrics = server.metrics()
        finally:
            server.stop()
    real, accounted, parts = own + handlers + fork_server, metrics["serve_memory_accounted_bytes"], metrics["serve_memory_server_bytes"]
    return ["| measure | value |", "| --- | --- |",
            f"| idle server (worker RSS, torch imported) | {mib(idle_rss)} |",
            f"| {count} models: real (server's own pages above idle + handler workers' + the fork server's heap) | {mib(real)} |",
            f"| … accounted: charged to the models + taken by the server's parts | {mib(accounted)} + {mib(parts)} "
            f"({(accounted + parts) / real:.2f}× real) |",
            f"| … the server's own measurement of its models (`serve_memory_measured_bytes`) | "
            f"{mib(metrics['serve_memory_measured_bytes'])} |"]
