"""Scenario 1: a tiny model (16 floats in and out) at concurrency 1, 8 and 64 through V2 JSON, V2
binary, SageMaker invoke and TF Serving predict — per-request overhead and server CPU per request, with
the load generator's ceiling beside it, and Triton's rows for the V2 routes where `make bench-triton`
installed it."""

import json

import numpy as np
import torch

from bench.harness import PROJECT, in_process_calls_per_s, v2_binary_request, wrk
from bench.triton import side_by_side

TITLE = "Tiny model (16 floats in and out): per-request overhead by protocol"
PLOT = PROJECT / "bench" / "figures" / "tiny.svg"  # requests/s against clients, this server beside Triton


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
              ("SageMaker invoke (JSON)", "/models/tiny/invoke", invoke, {"Content-Type": "application/json"}),
              ("TF Serving predict", "/v1/models/tiny:predict", json.dumps({"instances": values.tolist()}).encode(), {})]
    config = {"backend": "pytorch", "max_batch_size": 8, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}]}

    def ceiling(server) -> list[str]:
        load = wrk(server.url + "/v2/health/live", connections=64, seconds=seconds)
        return ["", f"`GET /v2/health/live` at 64 connections (the HTTP stack alone): {load.requests_per_s:,.0f} requests/s, "
                    f"p99 {load.p99_ms:.2f} ms; wrk itself used {load.client_cpu:.0%} of one core meanwhile, so the "
                    f"server, not the load generator, set that ceiling."]

    # a smoke run checks the script, not the curve: one concurrency
    table = side_by_side({"tiny": (Double(), config)}, routes, (64,) if smoke else (1, 8, 64), seconds, also=ceiling,
                         plot=None if smoke else PLOT)
    figure = [] if smoke else ["", f"![Requests/s against clients, this server beside Triton](bench/figures/{PLOT.name})"]
    return [f"In-process torch: {reference:,.0f} calls/s. Each server runs on its own core, wrk on the other.", "", *table,
            *figure]
