"""Scenario: a handler model whose work is Python-bound, as SageMaker users write them: `input_fn`
decodes a PNG with PIL and resizes it, `predict_fn` runs a small CNN, `output_fn` answers the class.
Requests/s at 1, 8 and 64 clients for worker pools of 1, 2, 4 … up to the machine's cores, against the
stack SageMaker's PyTorch container runs (TorchServe with the toolkit's handler service) serving the
same directory with the same number of workers. Both servers get every core (a handler's worker is a
process of its own: a pool is only as wide as the cores it may use); wrk shares them."""

import io
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bench.harness import CORES, Server, ratio, wrk
from bench.torchserve import MISSING, TorchServe, installed

TITLE = "A Python-bound handler model (PIL decode and resize, a small CNN) in worker pools, beside TorchServe"
CLIENTS = (1, 8, 64)

INFERENCE_PY = '''
import io
import json

import numpy as np
import torch
from PIL import Image


def model_fn(model_dir):
    return torch.jit.load(f"{model_dir}/model.pt").eval()


def input_fn(body, content_type):
    image = Image.open(io.BytesIO(body)).convert("RGB").resize((96, 96), Image.BILINEAR)
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1).unsqueeze(0)


def predict_fn(data, model):
    with torch.inference_mode():
        return model(data)


def output_fn(prediction, accept):
    return json.dumps({"class": int(prediction.argmax())})
'''


def cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10)).eval()


def png(side: int) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def pools(cores: int) -> list[int]:
    sizes, size = [], 1
    while size < cores:
        sizes.append(size)
        size *= 2
    return sizes + [cores]


def run(seconds: float, smoke: bool) -> list[str]:
    body, headers = png(64 if smoke else 256), {"Content-Type": "image/png"}
    sizes = pools(len(CORES))
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch) / "model"
        (model / "code").mkdir(parents=True)
        torch.jit.script(cnn()).save(str(model / "model.pt"))
        (model / "code" / "inference.py").write_text(INFERENCE_PY)
        ours = {size: _served(model, size, body, headers, seconds) for size in sizes}
        theirs = _torchserve(model, sizes, body, headers, seconds) if installed() else {}
    lines = [] if theirs else [MISSING, ""]
    lines += ["| workers | clients | this server requests/s | p50 ms | p99 ms | errors | vs one worker "
              "| TorchServe requests/s | p99 ms | vs TorchServe |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for size in sizes:
        for clients in CLIENTS:
            load, peer = ours[size][clients], theirs.get(size, {}).get(clients)
            lines.append(f"| {size} | {clients} | {load.requests_per_s:,.0f} | {load.p50_ms:.2f} | {load.p99_ms:.2f} | "
                         f"{load.errors} | {ratio(load.requests_per_s, ours[1][clients].requests_per_s)} | "
                         f"{f'{peer.requests_per_s:,.0f} | {peer.p99_ms:.2f}' if peer else '— | —'} | "
                         f"{ratio(load.requests_per_s, peer.requests_per_s) if peer else '—'} |")
    full = min(ours[sizes[-1]][c].requests_per_s / max(ours[1][c].requests_per_s, 1e-9) for c in CLIENTS[1:])
    lines += ["", f"A pool of {sizes[-1]} (the default on a single-model endpoint here) against one worker, at 8 and 64 "
                  f"clients: at least {full:.2f}×."]
    return lines


def _served(model: Path, workers: int, body: bytes, headers: dict, seconds: float) -> dict:
    server = Server(model, cores=CORES, SAGEMAKER_MULTI_MODEL="false", SAGEMAKER_MODEL_SERVER_WORKERS=str(workers))
    try:
        wrk(f"{server.url}/invocations", body, headers, 8, 1)  # every worker has run once
        return {clients: wrk(f"{server.url}/invocations", body, headers, clients, seconds) for clients in CLIENTS}
    finally:
        server.stop()


def _torchserve(model: Path, sizes: list[int], body: bytes, headers: dict, seconds: float) -> dict:
    peer = TorchServe(model, sizes[0])
    try:
        measured = {}
        for size in sizes:
            peer.scale(size)
            url = f"{peer.url}/predictions/model"
            wrk(url, body, headers, 8, 1)
            measured[size] = {clients: wrk(url, body, headers, clients, seconds) for clients in CLIENTS}
        return measured
    finally:
        peer.stop()
