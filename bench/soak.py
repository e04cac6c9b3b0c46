"""Soak: 64 clients mix invoke, load, unload and eviction through all three APIs for the whole run,
with a memory budget for a quarter of the models. Every answer is checked: a wrong value, a status
outside what that call may answer under churn, or a request with no answer at all is counted.
/ping is timed alongside, and the worker's RSS sampled against the budget."""

import http.client
import json
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.harness import Server, mib, run_together, save_model

TITLE = "Soak: 64 clients of load, unload, invoke and eviction through all three APIs"
CLIENTS, MODELS, RESIDENT = 64, 12, 3
CONFIG = {"backend": "pytorch", "max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
          "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]}
X = [[1.0, 2.0, 3.0, 4.0]]


class Weighted(torch.nn.Module):
    """Holds `size` MiB, so the cache has something to evict; answers x × factor."""

    def __init__(self, size: float, factor: float):
        super().__init__()
        self.register_buffer("weights", torch.full((int(size * (1 << 20)) // 4,), factor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weights[0]


def _expected(name: str) -> list[list[float]]:
    factor = int(name.removeprefix("m")) + 1
    return [[v * factor for v in row] for row in X]


# What each call may answer while models come and go: anything else is counted as unexpected.
# /invocations loads on demand, so only 507 (every resident model busy) may stand in for a 200.
ACTIONS = {
    "invocations": (40, {200, 507}),
    "sagemaker_invoke": (15, {200, 404, 507}),
    "v2_infer": (15, {200, 404, 503, 507}),  # 503: only for a model still loading, to retry (LOADING_503)
    "tfserving_predict": (10, {200, 404, 507}),
    "sagemaker_load": (6, {200, 409, 507}),
    "sagemaker_unload": (5, {200, 404}),
    "v2_load": (5, {200, 409, 507}),
    "v2_unload": (4, {200, 404}),
}
LOADING_503 = b"is still loading"  # V2's answer for a model another client is loading; any other 503 is unexpected


@dataclass
class Tally:
    latencies: list = field(default_factory=list)  # seconds of every answered invoke
    statuses: Counter = field(default_factory=Counter)
    unexpected: Counter = field(default_factory=Counter)
    wrong: int = 0
    lost: int = 0


class Client:
    def __init__(self, port: int, names: list[str], seed: int):
        self.port, self.names, self.rng = port, names, random.Random(seed)
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def request(self, method: str, path: str, body=None, headers=None) -> tuple[int, bytes]:
        try:
            self.connection.request(method, path, body, headers or {})
            response = self.connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            self.connection.close()
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            return 0, b""

    def act(self, tally: Tally) -> None:
        action = self.rng.choices(list(ACTIONS), [w for w, _ in ACTIONS.values()])[0]
        name = self.rng.choice(self.names)
        started = time.perf_counter()
        status, body, answer = self._send(action, name)
        elapsed = time.perf_counter() - started
        tally.statuses[(action, status)] += 1
        if status == 0:
            tally.lost += 1
        elif status not in ACTIONS[action][1] or (status == 503 and LOADING_503 not in body):
            tally.unexpected[(action, status, body[:120])] += 1
        if status == 200 and answer is not None:
            tally.latencies.append(elapsed)
            if answer(body) != _expected(name):
                tally.wrong += 1

    def _send(self, action: str, name: str):
        json_headers = {"Content-Type": "application/json"}
        if action == "invocations":
            headers = {**json_headers, "X-Amzn-SageMaker-Target-Model": name}
            return (*self.request("POST", "/invocations", json.dumps(X), headers), json.loads)
        if action == "sagemaker_invoke":
            return (*self.request("POST", f"/models/{name}/invoke", json.dumps(X), json_headers), json.loads)
        if action == "v2_infer":
            body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X[0]}]}
            return (*self.request("POST", f"/v2/models/{name}/infer", json.dumps(body), json_headers),
                    lambda answer: [json.loads(answer)["outputs"][0]["data"]])
        if action == "tfserving_predict":
            return (*self.request("POST", f"/v1/models/{name}:predict", json.dumps({"instances": X}), json_headers),
                    lambda answer: json.loads(answer)["predictions"])
        if action == "sagemaker_load":
            return (*self.request("POST", "/models", json.dumps({"model_name": name, "url": name}), json_headers), None)
        if action == "sagemaker_unload":
            return (*self.request("DELETE", f"/models/{name}"), None)
        if action == "v2_load":
            return (*self.request("POST", f"/v2/repository/models/{name}/load"), None)
        return (*self.request("POST", f"/v2/repository/models/{name}/unload"), None)


def _percentile(values: list[float], percent: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(percent) - 1] if len(values) > 1 else (values or [0.0])[0]


def run(seconds: float, smoke: bool) -> list[str]:
    size = 1 if smoke else 16
    seconds = max(seconds, 5)
    names = [f"m{i}" for i in range(MODELS)]
    with tempfile.TemporaryDirectory() as scratch:
        for index, name in enumerate(names):
            save_model(Path(scratch), name, Weighted(size, index + 1), CONFIG)
        budget = RESIDENT * 2 * size * (1 << 20)  # a model is charged about twice its weights (file and tensors)
        server = Server(Path(scratch), SERVE_MEMORY_LIMIT=str(budget), SERVE_LOAD_MODELS="")
        try:
            server.pin()
            baseline = server.worker_rss()
            tally, stop = Tally(), threading.Event()
            pings, peak_rss = [], [baseline]

            def client(seed: int) -> None:
                worker = Client(server.port, names, seed)
                while not stop.is_set():
                    worker.act(tally)

            def watch() -> None:
                watcher = Client(server.port, names, -1)
                while not stop.is_set():
                    started = time.perf_counter()
                    status, _ = watcher.request("GET", "/ping")
                    pings.append(time.perf_counter() - started if status == 200 else float("inf"))
                    peak_rss.append(server.worker_rss())
                    time.sleep(0.1)

            threads = [threading.Thread(target=client, args=(seed,)) for seed in range(CLIENTS)]
            run_together([*threads, threading.Thread(target=watch)], seconds, stop)
            health = Client(server.port, names, -2).request("POST", "/invocations", json.dumps(X),
                                                            {"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": "m0"})
            counters = server.metrics()
        finally:
            server.stop()
    total = sum(tally.statuses.values())
    latencies = sorted(tally.latencies)
    lines = [
        f"{CLIENTS} clients for {seconds:.0f} s over {MODELS} models of {size} MiB, a budget of {mib(budget)} "
        f"(room for {RESIDENT}); server and clients on different cores.",
        "",
        "| requests | wrong answers | unexpected statuses | lost | invoke p50 ms | invoke p99 ms | /ping p99 ms | /ping max ms "
        "| loads | evictions | worker RSS: start → peak | healthy after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {total:,} | {tally.wrong} | {sum(tally.unexpected.values())} | {tally.lost} | "
        f"{_percentile(latencies, 50) * 1000:.1f} | {_percentile(latencies, 99) * 1000:.1f} | "
        f"{_percentile(pings, 99) * 1000:.0f} | {max(pings, default=0) * 1000:.0f} | "
        f"{counters.get('serve_model_loads_total', 0):,.0f} | {counters.get('serve_model_evictions_total', 0):,.0f} | "
        f"{mib(baseline)} → {mib(max(peak_rss))} | {'yes' if health[0] == 200 else f'no ({health[0]})'} |",
        "",
        "| call | answers |",
        "| --- | --- |",
    ]
    for action in ACTIONS:
        counts = sorted((status, n) for (a, status), n in tally.statuses.items() if a == action)
        lines.append(f"| {action} | " + ", ".join(f"{status or 'lost'}: {n:,}" for status, n in counts) + " |")
    for (action, status, body), n in tally.unexpected.most_common(5):
        lines.append(f"\nUnexpected: {action} answered {status} ×{n}: {body.decode(errors='replace')}")
    return lines
