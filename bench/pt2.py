"""Scenario: PyTorch 2's own files beside TorchScript. The same MLP (1024→1024→1024, a dynamic first
dimension) as a TorchScript module, an ExportedProgram (`torch_export`) and an AOTInductor package
(`torch_aoti`): in-process per call; served to 1, 8 and 64 clients over V2 binary, one row per request,
with dynamic batching off and on, the three kinds taking turns within each row; and the cold load of a
100 MiB model (one 5120×5120 layer) each way, served and in-process."""

import contextlib
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.handler import mlp
from bench.harness import Server, in_process_calls_per_s, inference_counts, ratio, v2_binary_request
from bench.triton import combined, measure, settle

TITLE = "PyTorch 2 files: an AOTInductor package and an ExportedProgram beside TorchScript"
KINDS = {"torchscript": {"backend": "pytorch"}, "export": {"platform": "torch_export"}, "aoti": {"platform": "torch_aoti"}}
BATCHING = {"direct": {}, "batched": {"dynamic_batching": {}}}
CONCURRENCIES = (1, 8, 64)
ROWS = torch.export.Dim("batch", min=1, max=64)


def run(seconds: float, smoke: bool) -> list[str]:
    width, big = (64, None) if smoke else (1024, 5120)
    with tempfile.TemporaryDirectory() as scratch:
        files = _files(Path(scratch) / "mlp", mlp(width), width)
        lines = _in_process(files, width, 0.2 if smoke else 2)
        lines += _served(Path(scratch) / "served", files, width, seconds, smoke)
        torch.manual_seed(0)
        # a smoke run loads the MLP's files cold: a second AOTInductor compile would be most of its time
        cold = files if smoke else _files(Path(scratch) / "big", torch.nn.Linear(big, big).eval(), big)
        lines += _cold_loads(Path(scratch) / "cold", cold, width if smoke else big, 2 if smoke else 5)
    return lines


def _files(directory: Path, module: torch.nn.Module, width: int) -> dict[str, Path]:
    """kind → the module saved that way, each taking any number of rows."""
    directory.mkdir(parents=True)
    files = {"torchscript": directory / "model.pt", "export": directory / "program.pt2", "aoti": directory / "package.pt2"}
    torch.jit.script(module).save(str(files["torchscript"]))
    program = torch.export.export(module, (torch.ones(2, width),), dynamic_shapes=({0: ROWS},))
    torch.export.save(program, files["export"])
    torch._inductor.aoti_compile_and_package(program, package_path=str(files["aoti"]))
    return files


def _loaded(kind: str, file: Path):
    """The file as its own library loads it, callable."""
    if kind == "torchscript":
        return torch.jit.load(str(file))
    if kind == "export":
        return torch.export.load(str(file)).module()
    return torch._inductor.aoti_load_package(str(file))


def _in_process(files: dict[str, Path], width: int, seconds: float) -> list[str]:
    lines = ["In-process, per call (µs, the server's thread count):", "",
             "| kind | 1 row | 64 rows | 1 row vs TorchScript |", "| --- | --- | --- | --- |"]
    per_call = {}
    for kind, file in files.items():
        model = _loaded(kind, file)
        per_call[kind] = [1e6 / in_process_calls_per_s(model, torch.randn(rows, width), seconds) for rows in (1, 64)]
    for kind, (one, many) in per_call.items():
        lines.append(f"| {kind} | {one:,.1f} | {many:,.1f} | {ratio(per_call['torchscript'][0], one)} |")
    return lines + [""]


def _served(root: Path, files: dict[str, Path], width: int, seconds: float, smoke: bool) -> list[str]:
    tensors = {"input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [width]}],
               "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [width]}]}
    for kind, file in files.items():
        for batching, settings in BATCHING.items():
            _model(root, f"{kind}_{batching}", file, {**KINDS[kind], "max_batch_size": 64, **tensors, **settings})
    body, headers = v2_binary_request("INPUT__0", np.random.default_rng(0).standard_normal((1, width), np.float32), "OUTPUT__0")
    lines = ["| batching | clients | kind | requests/s | p50 ms | p99 ms | errors | mean batch | server CPU µs/request "
             "| vs TorchScript |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    server = Server(root)
    try:
        server.pin()
        for name in (f"{kind}_{batching}" for kind in KINDS for batching in BATCHING):
            measure(server.url, server.process.pid, f"/v2/models/{name}/infer", body, headers, 8, 1 if smoke else 2)  # warm
        below = []
        for batching in BATCHING:
            for connections in (8,) if smoke else CONCURRENCIES:
                rows = _row(server, batching, body, headers, connections, seconds)
                reference = rows["torchscript"][0].requests_per_s
                for kind, (load, batch, cpu_us) in rows.items():
                    lines.append(f"| {batching} | {connections} | {kind} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | "
                                 f"{load.p99_ms:.2f} | {load.errors} | {batch:.2f} | {cpu_us:,.0f} | "
                                 f"{ratio(load.requests_per_s, reference)} |")
                if rows["aoti"][0].requests_per_s < reference:
                    below.append(f"{batching} at {connections}")
    finally:
        server.stop()
    verdict = "yes" if not below else f"no ({', '.join(below)})"
    return lines + ["", f"The package at ≥ 1.0× TorchScript's requests/s in every row: {verdict}.", ""]


def _row(server: Server, batching: str, body: bytes, headers: dict, connections: int, seconds: float) -> dict:
    """kind → (load, mean batch, CPU µs per request): the kinds in turns of about two seconds, in the
    order A B C, C B A …, so that a machine that slows down within the row weighs on each alike."""
    slices = max(1, int(seconds // 2))
    taken = {kind: [] for kind in KINDS}
    before = {kind: inference_counts(server.url, f"{kind}_{batching}") for kind in KINDS}
    for turn in range(slices):
        for kind in (list(KINDS) if turn % 2 == 0 else reversed(KINDS)):
            settle([server.process.pid])
            taken[kind].append(measure(server.url, server.process.pid, f"/v2/models/{kind}_{batching}/infer", body,
                                       headers, connections, seconds / slices))
    rows = {}
    for kind in KINDS:
        inferences, executions = (after - start for after, start in
                                  zip(inference_counts(server.url, f"{kind}_{batching}"), before[kind], strict=True))
        load, cpu_us = combined(taken[kind])
        rows[kind] = (load, inferences / max(executions, 1), cpu_us)
    return rows


def _cold_loads(root: Path, files: dict[str, Path], width: int, repeats: int) -> list[str]:
    size = files["export"].stat().st_size
    tensors = {"input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [width]}],
               "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [width]}]}
    for kind, file in files.items():
        _model(root, kind, file, {**KINDS[kind], "max_batch_size": 8, **tensors})
    in_process = {kind: _median_seconds(lambda k=kind, f=file: _loaded(k, f), repeats) for kind, file in files.items()}
    served = {}
    with contextlib.ExitStack() as running:
        server = Server(root, SERVE_LOAD_MODELS="")
        running.callback(server.stop)
        for kind in files:
            def load(name=kind):
                assert server.post("/models", json.dumps({"model_name": name, "url": name}).encode()) == 200, name
                server.delete(f"/models/{name}")
            served[kind] = _median_seconds(load, repeats)
    lines = [f"Cold load of a {size / (1 << 20):,.0f} MiB model (median of {repeats}; served: `POST /models` to 200, "
             f"then unloaded):", "", "| kind | served ms | in-process ms | served vs TorchScript |", "| --- | --- | --- | --- |"]
    for kind in files:
        lines.append(f"| {kind} | {served[kind] * 1000:,.0f} | {in_process[kind] * 1000:,.0f} | "
                     f"{ratio(served['torchscript'], served[kind])} |")
    verdict = "yes" if served["aoti"] <= served["torchscript"] else "no"
    return lines + ["", f"The package's cold load no slower than TorchScript's: {verdict}. "
                        "(vs TorchScript: above 1.0× is faster.)"]


def _model(root: Path, name: str, file: Path, config: dict) -> None:
    (root / name / "1").mkdir(parents=True)
    shutil.copy(file, root / name / "1" / ("model.pt" if file.suffix == ".pt" else "model.pt2"))
    (root / name / "config.json").write_text(json.dumps(config))


def _median_seconds(action, repeats: int) -> float:
    taken = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        taken.append(time.perf_counter() - start)
    return statistics.median(taken)
