"""Scenario 11: what a large classification answer costs the server's memory — the V2 codec asked for
every class of a 1.5 M-value output, answered as binary data and as JSON — against the answer's own
size. Each measure runs in a process of its own, its high-water mark reset (`/proc/self/clear_refs`)
once the input exists, so the peak is that answer's alone."""

import subprocess
import sys

TITLE = "Memory of a 1.5 M-class classification answer, against the answer's size"
_MEASURE = """
import sys, time
from pathlib import Path
import numpy as np
from container import content
from container.v2.codec import classify, to_binary

class Signature:
    max_batch_size = 0

def status(field):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field))
    return int(line.split()[1]) * 1024

values = np.random.default_rng(0).random({count}, dtype=np.float32)
Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again from here
start = status("VmRSS:")
began = time.perf_counter()
classes = classify("y", values, {count}, [], Signature())
answer = to_binary(classes, "BYTES") if sys.argv[1] == "binary" else content.encode_json({{"data": classes}})
seconds = time.perf_counter() - began
print(len(answer), status("VmHWM:") - start, seconds)
"""


def run(seconds: float, smoke: bool) -> list[str]:
    count = 10_000 if smoke else 1_500_000
    rows = ["| answer | its size | peak memory above the start | ratio | seconds |", "| --- | --- | --- | --- | --- |"]
    for kind in ("binary", "JSON"):
        output = subprocess.run([sys.executable, "-c", _MEASURE.format(count=count), kind.lower()], check=True,
                                capture_output=True, text=True).stdout.split()
        size, peak, took = int(output[0]), int(output[1]), float(output[2])
        rows.append(f"| {kind} | {size / (1 << 20):.1f} MiB | {peak / (1 << 20):.0f} MiB | {peak / size:.1f}× | {took:.2f} |")
    return [f"Every class of {count:,} float32 values, as `\"classification\": {count}` asks.", "", *rows]
