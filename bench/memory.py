"""Scenario 6: the idle server's memory, and what each loaded model costs against its own bytes."""

import json
import tempfile
from pathlib import Path

from bench.churn import Held
from bench.harness import Server, mib, save_model

TITLE = "Memory: idle server, and per loaded model against the model's own bytes"


def run(seconds: float, smoke: bool) -> list[str]:
    size, count = (4, 2) if smoke else (50, 5)
    config = {"backend": "pytorch", "max_batch_size": 4, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(count):
            save_model(Path(scratch), f"m{index}", Held(size), config)
        server = Server(Path(scratch), SERVE_LOAD_MODELS="")
        try:
            idle = server.worker_rss()
            for index in range(count):
                assert server.post("/models", json.dumps({"model_name": f"m{index}", "url": f"m{index}"}).encode()) == 200
            loaded = server.worker_rss()
        finally:
            server.stop()
    per_model = (loaded - idle) / count
    return ["| measure | value |", "| --- | --- |", f"| idle server (worker RSS, torch imported) | {mib(idle)} |",
            f"| per loaded model of {size} MiB | {mib(per_model)} ({per_model / (size << 20):.2f}× its bytes) |"]
