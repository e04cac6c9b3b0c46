"""Scenario: perf_analyzer, Triton's own load generator, run as its users run it, in each of its modes
(HTTP and gRPC, sync and async, gRPC streams, system shared memory, sequences, batches, a request rate,
an ensemble, BYTES, a decoupled model, its metrics collection), against tritonserver and against this
server serving the same repository of python models (bench/fidelity_models.py). Each mode's requests/s on
both, 4 clients at once, and what perf_analyzer said where it failed. Needs `make bench-triton` and `make
bench-perf-analyzer`; without them, the scenario says so."""

import os
import re
import subprocess
import tempfile
from pathlib import Path

from bench.fidelity_models import REPOSITORY, write_repository
from bench.harness import PROJECT, Server, ratio
from bench.triton import MISSING as TRITON_MISSING
from bench.triton import Triton, tritonserver

TITLE = "perf_analyzer, Triton's load generator, in each of its modes against tritonserver and here"
DIRECTORY = Path(os.environ.get("PERF_ANALYZER_DIR", PROJECT / "bench" / ".perf_analyzer"))
MISSING = "perf_analyzer: not installed here (`make bench-perf-analyzer` installs it), so this scenario is left out."
# Counts each sequence's requests; perf_analyzer's random data would overflow a sum (fidelity's `total`)
COUNTER_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.counts = {}

    def execute(self, requests):
        answers = []
        for request in requests:
            key, flags = request.correlation_id(), request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.counts[key] = 0
            if key not in self.counts:
                answers.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"sequence {key} was not started")))
                continue
            self.counts[key] += 1
            count = self.counts.pop(key) if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END else self.counts[key]
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("total", np.array([[count]], np.int32))]))
        return answers
'''
MODES = (  # label, protocol, perf_analyzer's arguments ({data}: a file of input values)
    ("one call after another", "http", ["-m", "double"]),
    ("one call after another", "grpc", ["-m", "double"]),
    ("async", "http", ["-m", "double", "--async"]),
    ("a stream", "grpc", ["-m", "double", "--streaming", "--async"]),
    ("system shared memory", "http", ["-m", "double", "--shared-memory", "system"]),
    ("system shared memory", "grpc", ["-m", "double", "--shared-memory", "system"]),
    ("batches of 4", "http", ["-m", "double", "-b", "4"]),
    ("a request rate (500/s)", "http", ["-m", "double", "--request-rate-range", "500"]),
    ("zeros in JSON", "http", ["-m", "flat", "--shape", "x:3", "--input-data", "zero"]),
    ("sequences of 4", "http", ["-m", "total", "--sequence-length", "4"]),
    ("sequences of 4, async", "grpc", ["-m", "total", "--sequence-length", "4", "--async"]),
    ("sequences of 4 on a stream", "grpc", ["-m", "total", "--sequence-length", "4", "--streaming"]),
    ("an ensemble", "http", ["-m", "twice"]),
    ("BOOL, FP16, INT64, UINT64, BYTES", "http", ["-m", "types", *(f"--shape={name}:2" for name in "bhlsu")]),
    ("a decoupled model", "grpc", ["-m", "count", "--streaming", "--async", "--input-data", "{data}"]),
    ("with metrics", "http", ["-m", "double", "--collect-metrics", "--metrics-url", "{metrics}"]),
)


def perf_analyzer() -> Path | None:
    binary = DIRECTORY / "perf_analyzer"
    return binary if binary.is_file() else None


def run(seconds: float, smoke: bool) -> list[str]:
    if not tritonserver():
        return [TRITON_MISSING]
    if not perf_analyzer():
        return [MISSING]
    modes = MODES[:2] if smoke else MODES
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        write_repository(root / "models", {**{k: v for k, v in REPOSITORY.items() if k != "broken"},
                                           "total": (REPOSITORY["total"][0], COUNTER_PY)})
        (root / "count.json").write_text('{"data": [{"n": [2]}]}')
        results = {}
        for name in ("tritonserver", "here"):
            target = (Triton({}, repository=root / "models", arguments=("--model-control-mode=explicit", "--load-model=*"))
                      if name == "tritonserver" else Server(root / "models", SERVE_ALLOW_CLIENT_SHM="true"))
            try:
                for label, protocol, arguments in modes:
                    filled = [a.format(data=root / "count.json", metrics=target.metrics_url) for a in arguments]
                    results[name, label, protocol] = _measure(target, protocol, filled, seconds)
            finally:
                target.stop()
    return _table(modes, results)


def _measure(target, protocol: str, arguments: list[str], seconds: float) -> tuple[float | None, str]:
    """(requests/s, or None when it failed; perf_analyzer's first error line, else "")."""
    url = (target.grpc_url if protocol == "grpc" else target.url).removeprefix("http://")
    window = str(max(500, round(seconds * 1000 / 3)))
    rate = any(a.startswith("--request-rate") for a in arguments)
    command = [str(perf_analyzer()), "-i", protocol, "-u", url, *arguments, *([] if rate else ["--concurrency-range", "4"]),
               "--measurement-interval", window, "-p", window, "--max-trials", "3", "--stability-percentage", "100"]
    # its CUDA runtime and libb64 lie beside it; the CUDA runtime serves its CUDA shared memory mode alone
    environment = {**os.environ, "LD_LIBRARY_PATH": str(DIRECTORY / "lib")}
    finished = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120 + 10 * seconds)
    output = finished.stdout + finished.stderr
    served = re.findall(r"throughput: ([\d.]+) infer/sec", output)
    # a worker thread's own error says why; the summary line above it only that one failed
    errors = sorted((line.strip() for line in output.splitlines() if "error" in line.lower() or "failed" in line.lower()),
                    key=lambda line: "had error" not in line)
    if finished.returncode or not served:
        return None, (errors[0] if errors else f"exit status {finished.returncode}")[:300]
    return float(served[-1]), ""


def _table(modes, results: dict) -> list[str]:
    lines = ["perf_analyzer 2.41 (the last tritonclient wheel that carries it), 4 clients at once (a mode with a "
             "request rate sends at that rate), on the same cores for both servers.", "",
             "| mode | protocol | tritonserver, requests/s | here, requests/s | here / tritonserver |",
             "| --- | --- | --- | --- | --- |"]
    failures = []
    for label, protocol, _ in modes:
        cells = []
        for name in ("tritonserver", "here"):
            served, error = results[name, label, protocol]
            cells.append(f"{served:,.0f}" if served is not None else "failed")
            if error:
                failures.append(f"- **{label}, {protocol}**, {name}: {error}")
        theirs, ours = (results[name, label, protocol][0] for name in ("tritonserver", "here"))
        lines.append(f"| {label} | {protocol} | {cells[0]} | {cells[1]} | "
                     f"{ratio(ours, theirs) if theirs and ours else '—'} |")
    return lines + ([""] + failures if failures else [])
