"""Scenario: HTTP front-end processes. The tiny model (16 floats) and the MLP (1024→1024→1024, one row)
over V2 binary, V2 JSON and SageMaker invoke (the tiny one over TF Serving's predict too, and with dynamic
batching over V2 binary), a SageMaker handler model whose script does nothing over invoke, and a python
model whose `execute` does nothing (no batcher) over V2 binary, at 64 connections, served by one process (SERVE_HTTP_WORKERS=0) and by
1, 2, 4, 8 and 16 front-ends (as many as the server's cores allow), beside Triton on the same cores,
with where each request's CPU went: the model process (the one process every request passes through,
whose cost bounds what any number of front-ends can serve) and how busy it was, the front-ends
together, and wrk. On 16 cores wrk takes one and 16 front-ends share the other 15, as the default
would on a 16-vCPU instance. Then memory: RSS and PSS of every process at 1, 4 and 16 front-ends
with ten models loaded — the models are in the model process once, whatever the front-ends."""

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.harness import (
    CORES,
    Server,
    context_switches,
    cpu_seconds,
    executions,
    mib,
    ratio,
    save_model,
    tree,
    v2_binary_request,
    wrk,
)
from bench.mlp import MLP, WIDTH
from bench.python_backend import ECHO_PY as PYTHON_ECHO
from bench.python_backend import python_model
from bench.tiny import Double
from bench.triton import MISSING, Triton, tritonserver

TITLE = "HTTP front-end processes: requests/s from one process to 16 front-ends, and memory per process"
HANDLER = "echo"  # a SageMaker handler model whose script costs nothing: what the server spends around it
PYTHON = "echo_python"  # ... and a python model whose execute does nothing, without a batcher (an execute apiece)
BATCHED = "tiny_batched"  # the tiny model with dynamic batching: requests that came together, one execution
ECHO_PY = """
def model_fn(model_dir):
    return None


def transform_fn(model, body, content_type, accept):
    return body, "application/json"
"""
COUNTS = (0, 1, 2, 4, 8, 16)  # front-end processes; 0 is the model process serving HTTP itself
CONNECTIONS = 64


def run(seconds: float, smoke: bool) -> list[str]:
    server_cores = CORES[:-1] if len(CORES) > 2 else CORES  # wrk gets a core of its own where there are three
    counts = [n for n in COUNTS if n <= len(CORES)][: 2 if smoke else None]
    models = scenario_models()
    where = (f"The server (every process) and Triton on cores {server_cores[0]}–{server_cores[-1]}, wrk on core {CORES[-1]}."
             if server_cores != CORES else
             f"Only {len(CORES)} cores here: the server, Triton and wrk share them, so these figures understate every "
             f"server alike; scaling needs more cores (BENCHMARKS.md has a 16-core run).")
    routes = scenario_routes()
    if smoke:  # a smoke run checks the script: each model's first route
        firsts: dict[str, tuple] = {}
        for route in routes:
            firsts.setdefault(route[0], route)
        routes = list(firsts.values())
    lines = [where, "", *throughput_table(models, routes, counts, server_cores, seconds, with_triton=not smoke)]
    return lines + ["", *_memory((1,) if smoke else (1, 4, 16))]


def scenario_models() -> dict:
    torch.manual_seed(0)
    tiny = {"backend": "pytorch", "max_batch_size": 8, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}]}
    mlp = {"backend": "pytorch", "max_batch_size": 8, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
           "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}]}
    batched = {**tiny, "max_batch_size": 64, "dynamic_batching": {}}
    return {"tiny": (Double(), tiny), "mlp": (MLP().eval(), mlp), BATCHED: (Double(), batched)}


def scenario_routes() -> list[tuple]:
    routes = []
    for model, width in (("tiny", 16), ("mlp", WIDTH)):
        values = np.linspace(-1, 1, width, dtype=np.float32).reshape(1, width)
        binary, headers = v2_binary_request("INPUT0", values)
        document = {"inputs": [{"name": "INPUT0", "shape": [1, width], "datatype": "FP32", "data": values.ravel().tolist()}]}
        routes += [(model, "V2 binary", f"/v2/models/{model}/infer", binary, headers),
                   (model, "V2 JSON", f"/v2/models/{model}/infer", json.dumps(document).encode(), {}),
                   (model, "SageMaker invoke", f"/models/{model}/invoke", json.dumps(values.tolist()).encode(),
                    {"Content-Type": "application/json"})]
    routes.append(("tiny", "TF Serving predict", "/v1/models/tiny:predict",
                   json.dumps({"instances": np.linspace(-1, 1, 16).reshape(1, 16).tolist()}).encode(), {}))
    binary, headers = v2_binary_request("INPUT0", np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16))
    routes.append((BATCHED, "V2 binary", f"/v2/models/{BATCHED}/infer", binary, headers))
    return routes + [(HANDLER, "SageMaker invoke", f"/models/{HANDLER}/invoke", b"[[1.0, 2.0]]",
                      {"Content-Type": "application/json"}),
                     (PYTHON, "V2 binary", f"/v2/models/{PYTHON}/infer", binary, headers)]


def throughput_table(models: dict, routes: list, counts: list[int], cores: list[int], seconds: float,
                with_triton: bool) -> list[str]:
    """`with_triton`: beside Triton too (a smoke run leaves it out: the tiny scenario runs it already)."""
    rates: dict[tuple, float] = {}
    spent: dict[tuple, tuple] = {}  # with front-ends: _measure's account of where the CPU went
    with tempfile.TemporaryDirectory() as scratch:
        for name, (module, config) in models.items():
            save_model(Path(scratch), name, module, config)
        (Path(scratch) / HANDLER / "code").mkdir(parents=True)
        (Path(scratch) / HANDLER / "code" / "inference.py").write_text(ECHO_PY)
        python_model(Path(scratch), PYTHON, {**models["tiny"][1], "backend": "python"}, PYTHON_ECHO)
        for count in counts:
            server = Server(Path(scratch), cores, SERVE_HTTP_WORKERS=str(count))
            try:
                for model, label, path, body, headers in routes:
                    rates[model, label, count], account = _measure(server, model, path, body, headers, seconds)
                    if count and account:
                        spent[model, label, count] = account
            finally:
                server.stop()
    peer = _triton(models, routes, cores, seconds) if with_triton else {}
    head = " | ".join(("one process" if n == 0 else f"{n} front-end{'s' * (n > 1)}") for n in counts)
    lines = [] if peer else [MISSING if with_triton else "Triton: left out of a smoke run.", ""]
    lines += [f"Requests/s at {CONNECTIONS} connections (a failed request zeroes its cell).", "",
              f"| model | protocol | {head} | Triton | most / one process | most / Triton |",
              "| --- | --- | " + "--- | " * len(counts) + "--- | --- | --- |"]
    for model, label, *_ in routes:
        row = [rates[model, label, n] for n in counts]
        triton = peer.get((model, label))
        lines.append(f"| {model} | {label} | " + " | ".join(f"{r:,.0f}" for r in row)
                     + f" | {f'{triton:,.0f}' if triton else '—'} | {ratio(max(row), row[0])} | "
                     + f"{ratio(max(row), triton) if triton else '—'} |")
    return lines + ["", *_model_process(routes, [n for n in counts if n], spent)]


def _model_process(routes: list, counts: list[int], spent: dict) -> list[str]:
    """Where each request's CPU went with front-ends: µs in the model process / µs in all the
    front-ends together, the model process's busy share of one core, wrk's, and where the executions ran
    (the inline judge, scheduling/inline.py); then the requests/s the
    model process serves at most, a whole core of its own doing nothing else, at the cheapest of them:
    the ceiling front-ends cannot lift."""
    head = " | ".join(f"{n} front-end{'s' * (n > 1)}" for n in counts)
    lines = ["CPU µs per request in the model process / in the front-ends together, then the model process's busy "
             "share of one core and wrk's, the share of the model's executions its event loop ran itself, the model "
             "process's context switches per request, and the requests/s one core of the model process serves at most.", "",
             f"| model | protocol | {head} | ceiling, requests/s |", "| --- | --- | " + "--- | " * len(counts) + "--- |"]
    for model, label, *_ in routes:
        cells = [spent.get((model, label, n)) for n in counts]
        text = " | ".join(f"{c[0]:,.0f} / {c[1]:,.0f} µs, {c[2]:.0%} / {c[3]:.0%}, loop {c[4]:.0%}, {c[5]:.2f} switches"
                          if c else "—" for c in cells)
        known = [c[0] for c in cells if c]
        lines.append(f"| {model} | {label} | {text} | {f'{1e6 / min(known):,.0f}' if known else '—'} |")
    return lines


def _measure(server: Server, model: str, path: str, body: bytes, headers: dict, seconds: float) -> tuple[float, tuple | None]:
    """One cell: requests/s (0 when any request failed), and where the CPU went: µs per request in the
    model process and in the front-ends together, the model process's busy share of a core, wrk's, the
    share of the model's executions the event loop ran itself, and the model process's context switches
    per request (None when nothing was served)."""
    pid = server.worker_pid()
    runs_before = executions(server.url, model)  # read outside the CPU counted: a scrape costs the model process
    # the model process alone: a handler model's workers are its children, and pay for the script
    switches_before = context_switches(pid)
    before, front_ends_before, started = cpu_seconds(pid, False), _front_ends_cpu(server), time.perf_counter()
    load = wrk(server.url + path, body, headers, CONNECTIONS, seconds)
    elapsed = time.perf_counter() - started
    in_model, in_front_ends = cpu_seconds(pid, False) - before, _front_ends_cpu(server) - front_ends_before
    switches = context_switches(pid) - switches_before
    runs, on_loop = (after - earlier for after, earlier in zip(executions(server.url, model), runs_before, strict=True))
    served = load.requests_per_s * max(1, round(seconds))
    if not served:
        return 0.0, None
    return (load.requests_per_s if not load.errors else 0.0,
            (in_model / served * 1e6, in_front_ends / served * 1e6, in_model / elapsed, load.client_cpu, on_loop / max(runs, 1),
             switches / served))


def _front_ends_cpu(server: Server) -> float:
    return sum(cpu_seconds(pid) for pid in server.http_front_end_pids())


def _triton(models: dict, routes: list, cores: list[int], seconds: float) -> dict[tuple, float]:
    if not tritonserver():
        return {}
    peer = Triton(models, cores)
    try:
        return {(model, label): wrk(peer.url + path, body, headers, CONNECTIONS, seconds).requests_per_s
                for model, label, path, body, headers in routes if path.startswith("/v2/") and model in models}
    finally:
        peer.stop()


def _memory(counts) -> list[str]:
    lines = ["Memory with ten MLPs loaded (8 MiB of weights each): each process's RSS and PSS (a page shared by n "
             "processes counts 1/n in each PSS).", "",
             "| front-ends | model process RSS | model process PSS | each front-end RSS (mean) | each front-end PSS (mean) "
             "| each gRPC front-end RSS (mean) | each gRPC front-end PSS (mean) | every process, PSS |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        module, config = scenario_models()["mlp"]
        for index in range(10):
            save_model(root, f"mlp{index}", module, config)
        for count in counts:
            server = Server(root, SERVE_HTTP_WORKERS=str(count))
            try:
                model = _sizes(server.worker_pid())
                front_ends = [_sizes(pid) for pid in server.http_front_end_pids()]
                grpc = [_sizes(pid) for pid in server.grpc_front_end_pids()]
                total = sum(_sizes(pid)[1] for pid in tree(server.process.pid))
            finally:
                server.stop()
            means = " | ".join(mib(sum(sizes[i] for sizes in kind) / len(kind)) for kind in (front_ends, grpc) for i in (0, 1))
            lines.append(f"| {count} | {mib(model[0])} | {mib(model[1])} | {means} | {mib(total)} |")
    return lines


def _sizes(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of `pid`, in bytes."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    return int(fields["Rss"].split()[0]) * 1024, int(fields["Pss"].split()[0]) * 1024
