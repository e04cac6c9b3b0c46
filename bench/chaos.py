"""Chaos: clients on every protocol at once (V2 over HTTP and gRPC, a decoupled stream, sequences that cross
both, SageMaker's invocations, TF Serving's predict, BLS and an ensemble, an ExportedProgram, tensors of up to
8 MiB beside the small ones, past the payload limit too, reads of every kind, shared memory regions
registered, unregistered and read by clients at once), loads and unloads through all three control APIs (V2
over HTTP and gRPC, SageMaker's), clients that hang up mid-body, a handler model's pool that may grow, and
SIGKILL to worker processes (and, beyond the smoke run, to front-ends and now and then to the model process
itself), under a memory budget that evicts. Every call has a deadline and a set of answers it may give while
models come and go and processes die; anything else is counted and shown. Then every model is loaded and asked
once more, the server's log is read for the lines only a fault of its own writes, and the run ends as `docker
stop` ends a container: SIGTERM to the master alone while clients call. It found a load that hung for ever, an
ensemble's load failing with a KeyError, evictions that lost sequences, front-ends started again too late, and
stops that hung on gRPC streams or left new clients unanswered; a hunt like it, a region closed under the
request reading it."""

import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import numpy as np
import requests
import tritonclient.utils.shared_memory as shm

from bench.chaos_calls import DEADLINE, PAYLOAD_MB, REGION_BYTES, REGIONS, Tally, calling
from bench.chaos_models import MODELS, TENSOR_MODELS, X, build, v2_inputs
from bench.harness import Server, mib, run_together, tree
from container.logs import SERVER_FAULTS

TITLE = "Chaos: every protocol, loads, unloads, hang-ups and killed processes at once"
SLOW_STOP = 5.0  # seconds: a stop this long prints what the server logged meanwhile (Docker kills at 10)


def kill(server: Server, rng: random.Random, whole: bool, kills: Counter) -> None:
    """SIGKILL to a worker process (a python model's instance, a handler's worker); in a `whole` run, to a
    front-end too, and one time in eight to the model process, which the master starts again."""
    try:
        worker = server.worker_pid()
        candidates = {"worker process": [pid for pid in tree(worker) if pid != worker]}
        if whole:
            candidates["front-end"] = server.http_front_end_pids() + server.grpc_front_end_pids()
            if rng.random() < 1 / 8:
                candidates = {"model process": [worker]}
    except (FileNotFoundError, ProcessLookupError, IndexError):  # a process ended while it was read
        return
    kind = rng.choice([k for k, pids in candidates.items() if pids] or [None])
    if kind is not None:
        try:
            os.kill(rng.choice(candidates[kind]), signal.SIGKILL)
            kills[kind] += 1
        except ProcessLookupError:
            pass


def healthy_after(server: Server) -> list[str]:
    """Each model loaded and asked once more: the ones that did not answer, and why."""
    failures = []
    for name in MODELS:
        load = requests.post(f"{server.url}/v2/repository/models/{name}/load", timeout=DEADLINE)
        if name in TENSOR_MODELS:
            answer = requests.post(f"{server.url}/v2/models/{name}/infer", json={"inputs": v2_inputs(name)}, timeout=DEADLINE)
        elif name == "handler":
            answer = requests.post(f"{server.url}/models/handler/invoke", json=X, timeout=DEADLINE)
        else:
            answer = load
        if answer.status_code != 200:
            failures.append(f"{name}: {load.status_code}, then {answer.status_code} {answer.text[:200]}")
    return failures


def left_in_shared_memory(server: Server) -> list[str]:
    """The channel's data in /dev/shm that a living process of the server wrote and nobody took, once every
    call has been answered: a leak. (A killed process's own may stay until the next model process exits, or
    the server stops: at most what it had under way when it died.)"""
    left = []
    for path in Path("/dev/shm").glob(f"container-{server.process.pid}-*"):
        writer = int(path.name.split("-")[2])
        if Path(f"/proc/{writer}").exists():
            left.append(path.name)
    return left


def stopped_under_load(server: Server, keys: list[str], clients: int, seconds: float) -> dict:
    """SIGTERM to the master alone, as `docker stop` and Kubernetes send it, `seconds` after `clients` start
    calling: its exit status and seconds to exit, what of it is left (processes, the channel's data in
    /dev/shm), and what the clients met meanwhile. A stop may answer 503 or UNAVAILABLE, refuse a
    connection or drop an idle one; a call gRPC's own stop cancelled (one that arrived in the instant its
    port closed) is counted apart."""
    tally, stop = Tally(), threading.Event()
    threads = [threading.Thread(target=calling, args=(server, tally, seed, keys, True, stop)) for seed in range(clients, 2 * clients)]
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    pids = _processes(server)
    signalled, signalled_at = time.monotonic(), time.time()
    os.kill(server.process.pid, signal.SIGTERM)
    try:
        status = server.process.wait(DEADLINE)
    except subprocess.TimeoutExpired:
        status = None
    took = time.monotonic() - signalled
    stop.set()
    for thread in threads:
        thread.join(DEADLINE * 2)
    stuck = sum(thread.is_alive() for thread in threads)
    cancelled = sum(n for (_, what), n in tally.unexpected.items() if "CANCELLED" in what)
    return {"status": status, "seconds": took, "stuck": stuck, "cancelled": cancelled,
            "unexpected": sum(tally.unexpected.values()) - cancelled, "unanswered": tally.missed["unanswered"],
            "processes": sum(_alive(pid) for pid in pids),
            "files": len(list(Path("/dev/shm").glob(f"container-{server.process.pid}-*"))),
            "what": [f"{call} ×{n}: {what}" for (call, what), n in tally.unexpected.most_common(5)],
            "logged": _logged_since(Path(server.log.name), signalled_at) if took >= SLOW_STOP else []}


def _logged_since(log: Path, since: float) -> list[str]:
    """What the server logged from `since` (a wall-clock time) on, but the answers it made in under a
    second: what a slow stop waited for."""
    found = []
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
            when = datetime.fromisoformat(entry["time"]).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        if when >= since and (entry.get("message") != "request" or entry.get("duration_ms", 0) >= 1000):
            found.append(line[:300])
    return found[:30]


def _processes(server: Server) -> list[int]:
    """Every process of the server now (read again when one ends while it is read: a client's unload ends
    a python model's worker processes)."""
    for _ in range(100):
        try:
            return tree(server.process.pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
    raise RuntimeError("the server's processes kept ending while they were read")


def _alive(pid: int) -> bool:
    """Whether `pid` runs (an exited one whose new parent, init, has not reaped it yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def faults_logged(log: Path) -> list[str]:
    """Each fault's line, its traceback's innermost frames and exception kept: the log goes with the run."""
    found = []
    for line in log.read_text().splitlines():
        try:
            fault = json.loads(line)
            if fault.get("message") in SERVER_FAULTS:
                found.append(f"{fault['time']} {fault['message']}: {fault.get('traceback', '')[-1500:]}")
        except (ValueError, AttributeError, KeyError):
            continue
    return found


def run(seconds: float, smoke: bool) -> list[str]:
    clients, seconds = (4, max(seconds, 4)) if smoke else (12, max(seconds, 30))
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        build(root)
        budget = 40 << 20  # room for about four python models' workers: loads evict
        server = Server(root, cores=list(os.sched_getaffinity(0)), SERVE_HTTP_WORKERS="2", SERVE_MEMORY_LIMIT=str(budget),
                        SERVE_LOG_LEVEL="info", SERVE_LOAD_MODELS="*", SERVE_ALLOW_CLIENT_SHM="true",
                        SAGEMAKER_MAX_PAYLOAD_IN_MB=str(PAYLOAD_MB), SAGEMAKER_TS_MAX_WORKERS="3")
        tally, kills, stop = Tally(), Counter(), threading.Event()
        keys = [f"/chaos_{index}_{server.port}" for index in range(REGIONS)]
        regions = [shm.create_shared_memory_region(f"chaos{index}", key, REGION_BYTES) for index, key in enumerate(keys)]
        try:
            for region in regions:
                shm.set_shared_memory_region(region, [np.array([X], np.float32)])

            def killer() -> None:
                rng = random.Random(-1)
                while not stop.wait(rng.uniform(0.5, 1.5) if smoke else rng.uniform(1.5, 4)):
                    kill(server, rng, not smoke, kills)  # the smoke run's kills drop no connection

            threads = [threading.Thread(target=calling, args=(server, tally, seed, keys, not smoke, stop)) for seed in range(clients)]
            stuck = run_together([*threads, threading.Thread(target=killer)], seconds, stop, DEADLINE * 6)
            failures = healthy_after(server)
            left = left_in_shared_memory(server)
            stopped = stopped_under_load(server, keys, clients, 2 if smoke else 5)
            faults = faults_logged(Path(server.log.name))
        finally:
            server.stop()
            for region in regions:
                shm.destroy_shared_memory_region(region)
    unexpected = sum(tally.unexpected.values())
    lines = [
        f"{clients} clients for {seconds:.0f} s over {len(MODELS)} models, a budget of {mib(budget)}, two HTTP front-ends "
        f"and two gRPC ones; SIGKILL to {'worker processes' if smoke else 'worker processes, front-ends and the model process'} "
        f"every {'0.5–1.5' if smoke else '1.5–4'} s ({', '.join(f'{kind} ×{n}' for kind, n in sorted(kills.items()))}). "
        f"Every call has a {DEADLINE} s deadline.",
        "",
        "| calls | unexpected answers | without an answer | clients stuck | cut by a killed front-end | sequences: whole / ended by an unload / refused "
        "| processes killed | healthy after | server faults logged | data left in /dev/shm |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {sum(tally.calls.values()):,} | {unexpected} | {tally.missed['unanswered']} | {stuck} | {tally.missed['cut']} | "
        f"{tally.sequences['whole']} / {tally.sequences['ended by an unload']} / {tally.sequences['refused']} | "
        f"{sum(kills.values())} | {'yes' if not failures else 'no'} | {len(faults)} | {len(left)} |",
        "",
        f"Then SIGTERM to the master alone while {clients} clients call, {2 if smoke else 5} s after they start:",
        "",
        "| exit status | seconds to exit | processes left | data left in /dev/shm | unexpected answers | without an answer "
        "| clients stuck | calls cancelled by gRPC's stop |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {stopped['status']} | {stopped['seconds']:.1f} | {stopped['processes']} | {stopped['files']} | {stopped['unexpected']} | "
        f"{stopped['unanswered']} | {stopped['stuck']} | {stopped['cancelled']} |",
        *([f"\nThe stop took {SLOW_STOP:.0f} s or more; what the server logged after SIGTERM (but answers made in "
           f"under a second):", "", *stopped["logged"]] if stopped["logged"] else []),
        "",
        "| call | times |",
        "| --- | --- |",
        *(f"| {call} | {n:,} |" for call, n in sorted(tally.calls.items())),
    ]
    for (call, what), n in tally.unexpected.most_common(8):
        lines.append(f"\nUnexpected: {call} ×{n}: {what}")
    lines += [f"\nNot healthy after: {failure}" for failure in failures]
    lines += [f"\nServer fault: {fault}" for fault in faults[:5]]
    lines += [f"\nLeft in /dev/shm: {name}" for name in left[:5]]
    lines += [f"\nDuring the stop: {what}" for what in stopped["what"]]
    return lines
