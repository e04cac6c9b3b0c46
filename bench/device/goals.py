"""Issue 54's goals on the GPU machine, in one run that fits a device lease (about four minutes):
    bench/device/run python3 bench/device/goals.py [SECONDS]
1. tiny V2 binary, without and with dynamic batching, at 64 connections from 0 to 16 HTTP front-ends,
   beside Triton: requests/s and the model process's CPU per request (bench/frontends.py's cells);
2. tiny gRPC ModelInfer at 8 and 64 connections with 1, 4 and 8 front-ends, beside Triton's gRPC, both
   on the same half of the cores and h2load on the other (bench/grpc.py's cells);
3. where the model process's time goes at two front-ends (py-spy, where it is on the PATH: the bundle's);
4. the MLP on cuda:0 with and without dynamic batching at 1, 8 and 64 clients, and with front-ends
   (bench/gpu.py's), where a GPU exists.
Parts 1 and 2 hide the GPU from the servers (`CUDA_VISIBLE_DEVICES=`), as Triton's models run on CPU here:
where a GPU exists, a model with no instance group runs on it (Triton's default), and the tiny model would
pay a copy to the GPU and back on each request (as it did on 2026-11-30, serving 0.77× Triton)."""

import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

from bench import frontends, grpc
from bench.gpu import mlp_on_the_gpu
from bench.harness import CORES, Server, ratio, save_model, wrk
from bench.triton import both_servers

GRPC_FRONT_ENDS = (1, 4, 8)


def _frontends(seconds: float) -> list[str]:
    server_cores = CORES[:-1] if len(CORES) > 2 else CORES
    routes = [route for route in frontends.scenario_routes() if route[:2] in (("tiny", "V2 binary"), (frontends.BATCHED, "V2 binary"))]
    counts = [n for n in frontends.COUNTS if n <= len(CORES)]
    return frontends.throughput_table(frontends.scenario_models(), routes, counts, server_cores, seconds, with_triton=True)


def _grpc(seconds: float) -> list[str]:
    message = grpc.infer_message("tiny", 16)
    models = {"tiny": grpc.MODELS["tiny"]}
    lines = ["| server | connections | requests/s | p50 ms | p99 ms | errors | server CPU µs/request | vs Triton |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    peer_rates: dict[int, float] = {}
    for count in GRPC_FRONT_ENDS:
        with both_servers(models, SERVE_HTTP_WORKERS=str(count)) as (server, peer):
            if peer is not None and not peer_rates:
                for connections in (8, 64):
                    load, cpu_us = grpc.measure_grpc(peer.grpc_url, peer.process.pid, message, connections, seconds)
                    peer_rates[connections] = load.requests_per_s
                    lines.append(f"| Triton | {connections} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | "
                                 f"{load.p99_ms:.2f} | {load.errors} | {cpu_us:,.0f} | — |")
            for connections in (8, 64):
                load, cpu_us = grpc.measure_grpc(server.grpc_url, server.process.pid, message, connections, seconds)
                versus = ratio(load.requests_per_s, peer_rates[connections]) if connections in peer_rates else "—"
                lines.append(f"| this server, {count} gRPC front-end{'s' * (count > 1)} | {connections} | "
                             f"{load.requests_per_s:,.0f} | {load.p50_ms:.2f} | {load.p99_ms:.2f} | {load.errors} | "
                             f"{cpu_us:,.0f} | {versus} |")
    return lines


def _profile(seconds: float) -> list[str]:
    """The functions the model process's samples were in most (py-spy, only while it holds the GIL), tiny V2
    binary at 64 connections through two front-ends."""
    if not shutil.which("py-spy"):
        return ["py-spy is not on the PATH: no profile."]
    _, _, path, body, headers = next(route for route in frontends.scenario_routes() if route[:2] == ("tiny", "V2 binary"))
    with tempfile.TemporaryDirectory() as scratch:
        module, config = frontends.scenario_models()["tiny"]
        save_model(Path(scratch), "tiny", module, config)
        server = Server(Path(scratch), CORES[:-1] if len(CORES) > 2 else CORES, SERVE_HTTP_WORKERS="2")
        try:
            load = threading.Thread(target=wrk, args=(server.url + path, body, headers, 64, seconds + 2))
            load.start()
            samples = Path(scratch) / "samples.txt"
            subprocess.run(["py-spy", "record", "--gil", "--nonblocking", "-r", "200", "-d", str(round(seconds)), "-f", "raw",
                            "-o", str(samples), "--pid", str(server.worker_pid())], capture_output=True, check=True)
            load.join()
        finally:
            server.stop()
        own = collections.Counter()
        for line in samples.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            own[stack.rsplit(";", 1)[-1]] += int(count)
    total = sum(own.values()) or 1
    return [f"{total} samples; the functions most of them were in, by themselves:", "",
            *(f"- {count / total:.1%} {frame}" for frame, count in own.most_common(15))]


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"{len(CORES)} cores, torch {torch.__version__}, {seconds:g} s a cell.\n", flush=True)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the servers started now inherit it; this process has not touched CUDA
    print("## Tiny V2 binary, 64 connections, on CPU\n", *_frontends(seconds), "", sep="\n", flush=True)
    print("## Tiny gRPC ModelInfer, on CPU\n", *_grpc(seconds), "", sep="\n", flush=True)
    print("## The model process's time, on CPU\n", *_profile(seconds), "", sep="\n", flush=True)
    del os.environ["CUDA_VISIBLE_DEVICES"]
    if torch.cuda.is_available():
        print("## The MLP on the GPU\n", *mlp_on_the_gpu(seconds, False), sep="\n", flush=True)
    else:
        print("No GPU here: the MLP on the GPU is left out.")


if __name__ == "__main__":
    main()
