"""Scenario: a flood of large requests. 400 connections each send 5.5 MiB tensors (within
SAGEMAKER_MAX_PAYLOAD_IN_MB) to a model without batching, one after another as fast as they are answered:
wrk over V2 binary HTTP, h2load over gRPC. The server runs two HTTP front-ends and two gRPC ones, with
the requests each front-end process holds bounded (SERVE_MAX_BODIES_SIZE: its default, 1% of the RAM)
and, for comparison, practically unbounded (100%). What it measures is memory: the machine's memory in
use above the idle server's, the highest resident size of any front-end of each kind and of the model
process, and /dev/shm, where large tensors cross between them, each at its peak during the run; and how
long a small call waited meanwhile, one after another: `GET /ping` during the HTTP flood, a V2 inference
of 4 values during the gRPC one (a small request must not wait behind the large ones for room)."""

import contextlib
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2 as pb

from bench.chaos_models import Scaled
from bench.harness import CORES, Server, h2load, mib, save_model, tree, v2_binary_request, wrk

TITLE = "A flood of large requests: memory with the requests each front-end holds bounded, and without"
VALUES = 11 << 17  # FP32: 5.5 MiB a request
CONNECTIONS = 400
CONFIG = {"backend": "pytorch", "max_batch_size": 0, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1]}],
          "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1]}]}
BUDGETS = {"default (1%)": None, "unbounded (100%)": "100%"}
_EVERY = 0.05  # seconds between looks at the processes' memory, and between small calls
_SMALL_DEADLINE = 30  # seconds


def run(seconds: float, smoke: bool) -> list[str]:
    root = Path(tempfile.mkdtemp())
    save_model(root, "big", Scaled(), CONFIG)
    connections = 8 if smoke else CONNECTIONS
    values = np.arange(VALUES, dtype=np.float32)
    lines = [f"{connections} connections; the server on every core with wrk or h2load ({len(CORES)} here). "
             f"Memory is each process's resident size (shared pages count in each) and the machine's memory in use, "
             f"which holds the sockets' buffers too.", "",
             "| protocol | SERVE_MAX_BODIES_SIZE | requests/s | machine memory, more at peak | HTTP front-end, most | "
             "gRPC front-end, most | model process | /dev/shm | a small call meanwhile, ms: median / most |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for protocol in ("V2 binary HTTP", "gRPC"):
        for label, budget in (list(BUDGETS.items())[:1] if smoke else BUDGETS.items()):
            # a server each: glibc keeps a process's freed heap (resources.keep_freed_heap), so a peak stays
            server = Server(root, cores=CORES, SERVE_HTTP_WORKERS="2", **({"SERVE_MAX_BODIES_SIZE": budget} if budget else {}))
            try:
                load, peaks, waits = _flood(server, protocol, values, connections, seconds)
            finally:
                server.stop()
            lines.append(f"| {protocol} | {label} | {load.requests_per_s:,.0f} | {mib(peaks['machine'])} | "
                         f"{mib(peaks['http'])} | {mib(peaks['grpc'])} | {mib(peaks['model'])} | {mib(peaks['shm'])} | "
                         f"{_waits(waits)} |")
    return lines


def _flood(server: Server, protocol: str, values: np.ndarray, connections: int, seconds: float):
    """The load generator's figures, the peaks of memory while it ran, and each small call's wait in seconds
    (None: it failed, or passed its deadline)."""
    peaks, waits = dict.fromkeys(("machine", "http", "grpc", "model", "shm"), 0), []
    idle, done = _in_use(), threading.Event()
    watchers = [threading.Thread(target=_watch, args=(server, peaks, idle, done)),
                threading.Thread(target=_small_calls, args=(server, protocol, waits, done))]
    for watcher in watchers:
        watcher.start()
    try:
        if protocol == "gRPC":
            request = pb.ModelInferRequest(model_name="big")
            request.inputs.add(name="x", datatype="FP32", shape=[len(values)])
            request.raw_input_contents.append(values.tobytes())
            load = h2load(server.grpc_url, "/inference.GRPCInferenceService/ModelInfer", request.SerializeToString(),
                          connections, seconds)
        else:
            body, headers = v2_binary_request("x", values, output="y")
            load = wrk(server.url + "/v2/models/big/infer", body, headers, connections, seconds)
    finally:
        done.set()
        for watcher in watchers:
            watcher.join()
    return load, peaks, waits


def _small_calls(server: Server, protocol: str, waits: list, done: threading.Event) -> None:
    """One small call after another until `done`: each one's wait, or None when it failed."""
    small = triton_grpc.InferInput("x", [4], "FP32")
    small.set_data_from_numpy(np.ones(4, np.float32))
    with contextlib.ExitStack() as closing:
        if protocol == "gRPC":
            client = closing.enter_context(triton_grpc.InferenceServerClient(server.grpc_url.removeprefix("http://")))
            call = partial(client.infer, "big", [small], client_timeout=_SMALL_DEADLINE)
        else:
            def call():
                urllib.request.urlopen(server.url + "/ping", timeout=_SMALL_DEADLINE).read()
        while not done.wait(_EVERY):
            started = time.perf_counter()
            try:
                call()
                waits.append(time.perf_counter() - started)
            except Exception:  # refused, or past its deadline
                waits.append(None)


def _waits(waits: list) -> str:
    answered = [wait * 1000 for wait in waits if wait is not None]
    failed = len(waits) - len(answered)
    text = f"{statistics.median(answered):,.1f} / {max(answered):,.0f}" if answered else "—"
    return text + (f" ({failed} of {len(waits)} failed)" if failed else "")


def _watch(server: Server, peaks: dict, idle: int, done: threading.Event) -> None:
    kinds = {pid: "http" for pid in server.http_front_end_pids()} | {pid: "grpc" for pid in server.grpc_front_end_pids()}
    kinds[server.worker_pid()] = "model"
    while not done.wait(_EVERY):
        peaks["machine"] = max(peaks["machine"], _in_use() - idle)
        peaks["shm"] = max(peaks["shm"], shutil.disk_usage("/dev/shm").used)
        for pid in tree(server.process.pid):
            if pid in kinds:
                try:
                    peaks[kinds[pid]] = max(peaks[kinds[pid]], psutil.Process(pid).memory_info().rss)
                except psutil.Error:  # it ended meanwhile
                    pass


def _in_use() -> int:
    memory = psutil.virtual_memory()
    return memory.total - memory.available
