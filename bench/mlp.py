"""Scenario: an MLP 1024→1024→1024 (float32, one row per request) over V2 binary tensors at
concurrency 1, 8 and 64, without and with dynamic batching, against in-process torch at its best
batch size in the same run.

    python -m bench.mlp [--seconds N] [--markdown BENCHMARKS.md]
"""

import argparse
import json
import platform
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.harness import Server, in_process_rows_per_s, v2_binary_request, wrk
from container import resources

WIDTH = 1024
CONCURRENCY = (1, 8, 64)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return self.layers(INPUT0)


def write_models(root: Path, module) -> None:
    scripted = torch.jit.script(module)
    base = {"backend": "pytorch", "max_batch_size": 64,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}]}
    for name, extra in (("mlp_direct", {}), ("mlp_batched", {"dynamic_batching": {}})):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.json").write_text(json.dumps({**base, **extra}))
        scripted.save(str(root / name / "1" / "model.pt"))


def run(seconds: int) -> list[str]:
    torch.manual_seed(0)
    module = MLP().eval()
    reference = in_process_rows_per_s(module, WIDTH, (1, 8, 16, 32, 64))
    best_batch = max(reference, key=reference.get)
    lines = [f"In-process torch: {reference[best_batch]:,.0f} rows/s at batch {best_batch} "
             f"({', '.join(f'b{b}: {r:,.0f}' for b, r in reference.items())}).", "",
             "| model | concurrency | requests/s | p50 ms | p99 ms | errors | vs in-process best |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    body, headers = v2_binary_request("INPUT0", np.random.default_rng(0).standard_normal((1, WIDTH), np.float32))
    with tempfile.TemporaryDirectory() as scratch:
        write_models(Path(scratch), module)
        server = Server(Path(scratch))
        try:
            ceiling = wrk(server.url + "/v2/health/live", connections=64, seconds=seconds)
            for name in ("mlp_direct", "mlp_batched"):
                wrk(f"{server.url}/v2/models/{name}/infer", body, headers, 8, 2)  # warm up
                for connections in CONCURRENCY:
                    load = wrk(f"{server.url}/v2/models/{name}/infer", body, headers, connections, seconds)
                    ratio = load.requests_per_s / reference[best_batch]
                    lines.append(f"| {name} | {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | "
                                 f"{load.p99_ms:.2f} | {load.errors} | {ratio:.2f}× |")
        finally:
            server.stop()
    lines += ["", f"Load generator ceiling (wrk, 64 connections, `GET /v2/health/live`): "
                  f"{ceiling.requests_per_s:,.0f} requests/s, p99 {ceiling.p99_ms:.2f} ms."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="duration of each measurement")
    arguments = parser.parse_args()
    machine = f"{platform.machine()}, {resources.cpu_quota()} cores, torch {torch.__version__}"
    print(f"## MLP 1024→1024→1024, one row per request, V2 binary ({machine})\n")
    print("\n".join(run(arguments.seconds)))


if __name__ == "__main__":
    main()
