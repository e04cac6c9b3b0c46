"""Scenario: the GPU. (1) Twelve handler models of about 4 GiB of device memory each, a 20 GiB GPU
budget, 16 clients through the SageMaker contract (/invocations with the target-model header): first
on as many models as the budget holds, loaded one by one, where what the server accounts and measures
on the GPU is set against what nvidia-smi reports for its processes at five moments; then for two
minutes on all twelve: loads, evictions, 507s, wrong answers, lost requests and 5xx. (2) A real CUDA
out-of-memory error met by evicting an idle model: the wall time of the request that recovers, beside
the same request once it fits. (3) The MLP on the GPU over V2 binary, with and without dynamic
batching, at 1/8/64 clients, against in-process torch on the same GPU at its best batch.
Without a GPU it says so and measures nothing: a GPU figure comes from a GPU or not at all."""

import json
import random
import subprocess
import tempfile
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import requests
import torch

from bench.harness import (
    SERVER_CORES,
    Server,
    cpu_seconds,
    executions,
    inference_counts,
    ratio,
    save_model,
    tree,
    v2_binary_request,
    wrk,
)
from bench.mlp import MLP, WIDTH

TITLE = "The GPU: twelve 4 GiB models over a 20 GiB budget, a CUDA out-of-memory recovery, the MLP on the GPU"
GIB = 1 << 30
MODELS, MODEL_GIB, BUDGET_GIB, CLIENTS = 12, 4, 20, 16
CONTEXT_GIB = 0.5  # a handler worker's own CUDA context (518 MiB on an H200), charged with its model
ON_GPU = {"instance_group": [{"kind": "KIND_GPU", "count": 1}]}

# Each model holds `gib` GiB of device memory filled with its own factor, and answers its input times that
# factor, read back from the device: a model that answered for another, or from lost memory, is caught.
HOLDER = """
import torch

def model_fn(model_dir):
    return torch.full(({gib} * (1 << 28),), {factor}.0, device="cuda")

def predict_fn(data, model):
    return (torch.as_tensor(data, device="cuda") * model[-1]).tolist()
"""


class Grabs(torch.nn.Module):
    """Holds x[0] GiB of scratch on its device for the length of one execution."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grabbed = torch.ones([int(x[0, 0].item()) * (1 << 30)], dtype=torch.uint8, device=x.device)
        return x + grabbed[0].float() - 1


def run(seconds: float, smoke: bool) -> list[str]:
    if not torch.cuda.is_available():
        return ["No GPU here (torch sees none): nothing measured. Run it on a GPU machine."]
    name = torch.cuda.get_device_name(0)
    driver = _smi("--query-gpu=driver_version")[0][0]
    lines = [f"{name}, driver {driver}, torch {torch.__version__} (CUDA {torch.version.cuda}).", ""]
    lines += _many_models(10 if smoke else 120, 1 if smoke else MODEL_GIB)
    lines += ["", *_out_of_memory_recovery()]
    lines += ["", *mlp_on_the_gpu(seconds, smoke)]
    return lines


def _many_models(duration: float, gib: int) -> list[str]:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for index in range(MODELS):
            code = root / f"holder{index:02d}" / "code"
            code.mkdir(parents=True)
            (code / "inference.py").write_text(textwrap.dedent(HOLDER.format(gib=gib, factor=index + 1)))
        server = Server(root, SERVE_LOAD_MODELS="", SERVE_GPU_MEMORY_LIMIT=f"{BUDGET_GIB * gib // MODEL_GIB}GiB",
                        SERVE_HTTP_WORKERS="auto")
        try:
            steady = _steady(server, duration / 6, gib)
            return [*steady, "", *_churn(server, duration, gib)]
        finally:
            server.stop()


def _steady(server: Server, duration: float, gib: int) -> list[str]:
    """As many models as the budget holds, loaded one by one and then kept busy by CLIENTS clients: GPU
    memory at five moments when nothing loads or is evicted, so what the server accounts and measures
    and what nvidia-smi reports describe the same models."""
    fitting = int(BUDGET_GIB * gib / MODEL_GIB // (gib + CONTEXT_GIB))
    for index in range(fitting):  # one request each loads them, one at a time
        _load(server, duration, [index], clients=1, each=1)
    statuses, wrong, lost, _, samples = _load(server, duration, range(fitting), sample=True)
    lines = [f"Steady: {fitting} of the models (as many as the budget holds) loaded one by one, then {CLIENTS} clients on "
             f"them alone for {duration:.0f} s ({sum(statuses.values()):,} requests, {statuses[200]:,} answered 200, "
             f"{wrong[0]} wrong, {lost[0]} lost). GPU "
             "memory on cuda:0 at five moments: what the server accounts, what its resident models measurably hold, and "
             "what nvidia-smi reports for the server's processes (the model process's own CUDA context, outside the "
             "budget, included).", ""]
    return lines + _memory_table(samples)


def _churn(server: Server, duration: float, gib: int) -> list[str]:
    """CLIENTS clients, each sending one request after another to any of the MODELS, four times what the
    budget holds, each answer checked: loads, evictions and 507s, and memory at five moments meanwhile."""
    before = server.labelled_metrics()
    statuses, wrong, lost, latencies, samples = _load(server, duration, range(MODELS), sample=True)
    after = server.labelled_metrics()
    counts = {key: after.get(key, 0) - before.get(key, 0) for key in
              [("serve_model_loads_total", (("outcome", "success"),)), ("serve_model_loads_total", (("outcome", "failure"),)),
               ("serve_model_evictions_total", ())]}
    served = sum(statuses.values())
    latencies.sort()
    lines = [f"Churn: {MODELS} handler models of {gib} GiB each on cuda:0 (each in its own worker process with its own CUDA "
             f"context), a {BUDGET_GIB * gib // MODEL_GIB} GiB budget, {CLIENTS} clients for {duration:.0f} s through "
             "`/invocations` (models load on first use, the least recently used idle ones are evicted).", "",
             "| requests | requests/s | p50 ms | p99 ms | 200 | 507 | other 4xx | 5xx | wrong answers | lost | loads | loads refused | evictions |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
             f"| {served:,} | {served / duration:,.1f} | {latencies[len(latencies) // 2] * 1e3:.1f} | "
             f"{latencies[int(len(latencies) * 0.99)] * 1e3:.1f} | {statuses[200]:,} | {statuses[507]:,} | "
             f"{sum(n for s, n in statuses.items() if 400 <= s < 500 and s != 507):,} | "
             f"{sum(n for s, n in statuses.items() if s >= 500 and s != 507):,} | {wrong[0]} | {lost[0]} | "
             + " | ".join(f"{count:,.0f}" for count in counts.values()) + " |", "",
             "GPU memory at five moments of the churn (accounted includes the reservations of loads in flight).", ""]
    return lines + _memory_table(samples)


def _load(server: Server, duration: float, models, clients: int = CLIENTS, each: int | None = None,
          sample: bool = False) -> tuple:
    """`clients` threads, each sending one request after another (`each` of them, or until `duration`
    has passed) to one of `models` drawn at random, each answer checked; with `sample`, memory at five
    moments meanwhile. (statuses, [wrong], [lost], latencies, samples)."""
    statuses, wrong, lost, latencies = Counter(), [0], [0], []
    lock, deadline, models = threading.Lock(), time.monotonic() + duration, list(models)

    def client(seed: int) -> None:
        draw, session, sent = random.Random(seed), requests.Session(), 0
        while time.monotonic() < deadline and (each is None or sent < each):
            index, sent = draw.choice(models), sent + 1
            started = time.perf_counter()
            try:
                answer = session.post(server.url + "/invocations", data=b"[[1, 2, 3, 4]]", timeout=300,
                                      headers={"Content-Type": "application/json",
                                               "X-Amzn-SageMaker-Target-Model": f"holder{index:02d}"})
            except requests.RequestException:
                with lock:
                    lost[0] += 1
                continue
            with lock:
                statuses[answer.status_code] += 1
                latencies.append(time.perf_counter() - started)
                if answer.status_code == 200 and answer.json() != [[(index + 1) * v for v in (1, 2, 3, 4)]]:
                    wrong[0] += 1

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
    for thread in threads:
        thread.start()
    samples = []
    for moment in range(1, 6) if sample else ():
        time.sleep(max(0.0, deadline - duration + moment * duration / 5.5 - time.monotonic()))  # a sampling period
        samples.append(_memory_now(server))
    for thread in threads:
        thread.join()
    return statuses, wrong, lost, latencies, samples


def _memory_table(samples: list[tuple]) -> list[str]:
    lines = ["| moment | models resident | accounted | measured | nvidia-smi, server's processes | measured ÷ nvidia-smi |",
             "| --- | --- | --- | --- | --- | --- |"]
    for moment, (resident, accounted, measured, reported) in enumerate(samples, 1):
        lines.append(f"| {moment} | {resident} | {accounted / GIB:.2f} GiB | {measured / GIB:.2f} GiB | {reported / GIB:.2f} GiB | "
                     f"{ratio(measured, reported)} |")
    return lines


def _memory_now(server: Server) -> tuple[int, float, float, float]:
    """(models resident, bytes accounted and measured on cuda:0, bytes nvidia-smi gives the server's processes)."""
    metrics = server.labelled_metrics()
    accounted = metrics.get(("serve_memory_accounted_bytes", (("device", "cuda:0"),)), 0.0)
    measured = metrics.get(("serve_memory_measured_bytes", (("device", "cuda:0"),)), 0.0)
    resident = sum(1 for (name, labels), value in metrics.items()
                   if name == "serve_model_memory_bytes" and ("device", "cuda:0") in labels and value > 0)
    pids = _processes(server.process.pid)
    reported = sum(int(used) for pid, used in _smi("--query-compute-apps=pid,used_memory") if int(pid) in pids) * (1 << 20)
    return resident, accounted, measured, reported


def _processes(pid: int) -> set[int]:
    """The server's process tree; walked again when a process (an evicted model's worker) ends mid-walk."""
    for _ in range(5):
        try:
            return set(tree(pid))
        except FileNotFoundError:
            continue
    return {pid}


def _out_of_memory_recovery() -> list[str]:
    """Two idle handler models hold 40% of the GPU each; a TorchScript model then asks for 35% in one
    execution: CUDA fails the allocation, the server evicts the least recently used idle model and runs
    the request again. Timed against the same request once there is room."""
    total = torch.cuda.get_device_properties(0).total_memory
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for name in ("idle1", "idle2"):
            (root / name / "code").mkdir(parents=True)
            (root / name / "code" / "inference.py").write_text(textwrap.dedent(f"""
                import torch
                def model_fn(model_dir):
                    return torch.ones({int(total * 0.4)}, dtype=torch.uint8, device="cuda")
                def predict_fn(data, model):
                    return data
                """))
        config = {"backend": "pytorch", "max_batch_size": 1, **ON_GPU,
                  "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
                  "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}
        save_model(root, "greedy", Grabs(), config)
        server = Server(root, SERVE_LOAD_MODELS="", SERVE_GPU_MEMORY_LIMIT="100%")
        try:
            for name in ("idle1", "idle2", "greedy"):
                assert server.post("/models", json.dumps({"model_name": name, "url": name}).encode()) == 200, name
            asked = [[float(int(total * 0.35 / GIB))]]
            recovering, recovered = _timed(server, asked), _timed(server, asked)
            resident = sorted(m["modelName"] for m in requests.get(server.url + "/models", timeout=10).json()["models"])
            recoveries = server.labelled_metrics().get(("serve_memory_recoveries_total", ()), 0)
        finally:
            server.stop()
    return [f"CUDA out-of-memory recovery: two idle handler models hold 40% of the GPU each; `greedy` asks for {asked[0][0]:.0f} GiB "
            f"in one execution. The request that met CUDA's error answered {recovering[0]} in {recovering[1] * 1e3:,.0f} ms "
            f"(the error, one eviction, the retry); the same request with room answered {recovered[0]} in "
            f"{recovered[1] * 1e3:,.0f} ms. Recoveries counted: {recoveries:.0f}; resident afterwards: {', '.join(resident)}."]


def _timed(server: Server, rows) -> tuple[int, float]:
    started = time.perf_counter()
    answer = requests.post(server.url + "/models/greedy/invoke", json=rows, timeout=300)
    return answer.status_code, time.perf_counter() - started


def mlp_on_the_gpu(seconds: float, smoke: bool) -> list[str]:
    torch.manual_seed(0)
    module = MLP().eval()
    reference = _in_process_rows_per_s(module.cuda(), (1, 8) if smoke else (1, 8, 32, 64, 128), 0.2 if smoke else 2)
    best = max(reference, key=reference.get)
    lines = [f"The MLP on cuda:0. In-process torch on the same GPU (input copied to the device, output back): "
             f"{reference[best]:,.0f} rows/s at batch {best} ({', '.join(f'b{b}: {r:,.0f}' for b, r in reference.items())}).",
             "Batches on threads: `SERVE_INLINE_BELOW_US=0`, as against batches the judge lets run on the event loop, "
             "where the loop waits for the GPU.", "",
             "| model | front-ends | batches | clients | requests/s | p50 ms | p99 ms | errors | mean batch | on the loop "
             "| model process µs/request | vs in-process batch 1 | vs in-process best |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    config = {"backend": "pytorch", "max_batch_size": 64, **ON_GPU,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}]}
    body, headers = v2_binary_request("INPUT0", np.random.default_rng(0).standard_normal((1, WIDTH), np.float32))
    clients = (1, 8) if smoke else (1, 8, 64)
    # (front-ends, batches on threads only) → (model, clients): the model process serving HTTP itself, then
    # with a front-end on each of its cores (as `auto` would give it), the judge's way and threads only
    runs = {(0, False): [("mlp_direct", clients), ("mlp_batched", clients)]}
    if not smoke:
        runs[(len(SERVER_CORES), False)] = [("mlp_batched", clients[1:])]
        runs[(len(SERVER_CORES), True)] = [("mlp_batched", clients[-1:])]
    with tempfile.TemporaryDirectory() as scratch:
        for name, batching in (("mlp_direct", {}), ("mlp_batched", {"dynamic_batching": {}})):
            save_model(Path(scratch), name, module.cpu(), {**config, **batching})
        for (front_ends, on_threads), cells in runs.items():
            server = Server(Path(scratch), SERVE_HTTP_WORKERS=str(front_ends), **({"SERVE_INLINE_BELOW_US": "0"} if on_threads else {}))
            server.pin()
            try:
                for name, counts in cells:
                    lines += [_mlp_row(server, name, front_ends, on_threads, n, body, headers, seconds, reference, best)
                              for n in counts]
            finally:
                server.stop()
    return lines


def _mlp_row(server: Server, name: str, front_ends: int, on_threads: bool, clients: int, body: bytes, headers: dict,
             seconds: float, reference: dict, best: int) -> str:
    before, runs_before = inference_counts(server.url, name), executions(server.url, name)
    pid = server.worker_pid()
    cpu_before = cpu_seconds(pid, False)
    load = wrk(f"{server.url}/v2/models/{name}/infer", body, headers, clients, seconds)
    in_model = cpu_seconds(pid, False) - cpu_before
    after, runs_after = inference_counts(server.url, name), executions(server.url, name)
    batch = (after[0] - before[0]) / max(after[1] - before[1], 1)
    on_loop = (runs_after[1] - runs_before[1]) / max(runs_after[0] - runs_before[0], 1)
    per_request = in_model / max(after[0] - before[0], 1) * 1e6
    return (f"| {name} | {front_ends} | {'threads' if on_threads else 'judged'} | {clients} | {load.requests_per_s:,.0f} | "
            f"{load.p50_ms:.2f} | {load.p99_ms:.2f} | {load.errors} | {batch:.1f} | {on_loop:.0%} | {per_request:,.0f} | "
            f"{ratio(load.requests_per_s, reference[1])} | {ratio(load.requests_per_s, reference[best])} |")


def _in_process_rows_per_s(module, batch_sizes, seconds: float) -> dict[int, float]:
    rates = {}
    with torch.inference_mode():
        for batch in batch_sizes:
            example = torch.randn(batch, WIDTH)
            module(example.cuda()).cpu()
            count, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                module(example.cuda()).cpu()  # .cpu() waits for the device, as an answer must
                count += 1
            rates[batch] = batch * count / (time.perf_counter() - started)
    return rates


def _smi(query: str) -> list[list[str]]:
    output = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    return [[field.strip() for field in line.split(",")] for line in output.splitlines() if line.strip()]
