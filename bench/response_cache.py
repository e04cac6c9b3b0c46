"""Scenario: the response cache — the MLP 1024→1024→1024 over V2 binary, one server, the model once
with `response_cache` enabled and once without: the same request again and again (every request a hit
but the first), and a different request each time (every request a miss: what keying and keeping
responses cost)."""

import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.harness import Server, inference_counts, ratio, save_model, v2_binary_request, wrk
from bench.mlp import MLP, WIDTH

TITLE = "Response cache: the MLP's repeated and distinct requests, cached against not"
CONCURRENCIES = (1, 8)
# wrk's request() for distinct requests: the body's last four bytes (the tensor's last float) count up
# from `start`, which each run sets apart so that no run repeats another's requests
_DISTINCT = """
local counter = {start}
request = function()
  counter = counter + 1
  local tail = string.char(counter % 256, math.floor(counter / 256) % 256, math.floor(counter / 65536) % 256, 63)
  return wrk.format(nil, nil, nil, string.sub(wrk.body, 1, -5) .. tail)
end
"""


def run(seconds: float, smoke: bool) -> list[str]:
    torch.manual_seed(0)
    config = {"backend": "pytorch", "max_batch_size": 8,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}]}
    body, headers = v2_binary_request("INPUT0", np.random.default_rng(0).standard_normal((1, WIDTH), np.float32))
    rows = ["| requests | concurrency | cached: requests/s | p50 ms | its hits | not cached: requests/s | p50 ms | cached vs not |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as scratch:
        module = MLP().eval()
        save_model(Path(scratch), "cached", module, {**config, "response_cache": {"enable": True}})
        save_model(Path(scratch), "plain", module, config)
        server = Server(Path(scratch), SERVE_RESPONSE_CACHE_SIZE="256MiB")
        try:
            server.pin()
            for name in ("cached", "plain"):  # both models' first executions (torch's, the server's) before any measure
                wrk(f"{server.url}/v2/models/{name}/infer", body, headers, 8, 1, _DISTINCT.format(start=0))
            runs = 0
            for workload, distinct in (("the same", False), ("distinct", True)):
                for connections in CONCURRENCIES[:1] if smoke else CONCURRENCIES:
                    loads, hits, served = {}, _hits(server), inference_counts(server.url, "cached")[0]
                    for name in ("cached", "plain") if connections == CONCURRENCIES[0] else ("plain", "cached"):  # both go first
                        runs += 1
                        lua = _DISTINCT.format(start=runs * 2_000_000) if distinct else ""
                        loads[name] = wrk(f"{server.url}/v2/models/{name}/infer", body, headers, connections, seconds, lua)
                    cached, plain = loads["cached"], loads["plain"]
                    assert cached.errors == plain.errors == 0, (cached, plain)
                    share = (_hits(server) - hits) / max(inference_counts(server.url, "cached")[0] - served, 1)
                    rows.append(f"| {workload} | {connections} | {cached.requests_per_s:,.0f} | {cached.p50_ms:.2f} | "
                                f"{share:.0%} | {plain.requests_per_s:,.0f} | {plain.p50_ms:.2f} | "
                                f"{ratio(cached.requests_per_s, plain.requests_per_s)} |")
            held = server.metrics().get("serve_response_cache_bytes", 0)
        finally:
            server.stop()
    return [f"One server on its own core, wrk on the other; `SERVE_RESPONSE_CACHE_SIZE=256MiB`. After the runs the "
            f"cache held {held / (1 << 20):.1f} MiB.", "", *rows]


def _hits(server) -> float:
    return server.labelled_metrics().get(("nv_cache_num_hits_per_model_total", (("model", "cached"), ("version", "1"))), 0)
