"""Scenario 1: a tiny model (16 floats in and out) at concurrency 1, 8 and 64 through V2 JSON, V2
binary and SageMaker invoke — per-request overhead, with the load generator's ceiling beside it."""

import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.harness import (
    Server,
    in_process_calls_per_s,
    save_model,
    v2_binary_request,
    wrk,
)

TITLE = "Tiny model (16 floats in and out): per-request overhead by protocol"


class Double(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return INPUT0 * 2


def run(seconds: float, smoke: bool) -> list[str]:
    values = np.arange(16, dtype=np.float32).reshape(1, 16)
    reference = in_process_calls_per_s(Double(), torch.from_numpy(values), 0.2 if smoke else 2)
    binary, binary_headers = v2_binary_request("INPUT0", values)
    v2_json = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": values.ravel().tolist()}]}).encode()
    invoke = json.dumps(values.tolist()).encode()
    routes = [("V2 JSON", "/v2/models/tiny/infer", v2_json, {}),
              ("V2 binary", "/v2/models/tiny/infer", binary, binary_headers),
              ("SageMaker invoke (JSON)", "/models/tiny/invoke", invoke, {"Content-Type": "application/json"})]
    lines = [f"In-process torch: {reference:,.0f} calls/s.", "",
             "| protocol | concurrency | requests/s | p50 ms | p99 ms | errors |", "| --- | --- | --- | --- | --- | --- |"]
    config = {"backend": "pytorch", "max_batch_size": 8, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}]}
    with tempfile.TemporaryDirectory() as scratch:
        save_model(Path(scratch), "tiny", Double(), config)
        server = Server(Path(scratch))
        try:
            ceiling = wrk(server.url + "/v2/health/live", connections=64, seconds=seconds)
            for label, path, body, headers in routes:
                for connections in (1, 8, 64):
                    load = wrk(server.url + path, body, headers, connections, seconds)
                    lines.append(f"| {label} | {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | "
                                 f"{load.p99_ms:.2f} | {load.errors} |")
        finally:
            server.stop()
    lines += ["", f"`GET /v2/health/live` at 64 connections (the HTTP stack alone): {ceiling.requests_per_s:,.0f} requests/s, "
                  f"p99 {ceiling.p99_ms:.2f} ms; wrk itself used {ceiling.client_cpu:.0%} of one core meanwhile, so the "
                  f"server, not the load generator, set that ceiling."]
    return lines
