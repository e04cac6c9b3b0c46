"""Scenario 9: cold load of a 100 MiB model from S3 (moto's server on a local port, reached over HTTP
as S3 would be): `POST /models {"url": "s3://…"}` to 200, against the same model from local disk,
against the same model again from the download cache, and against `boto3 download_file` +
`torch.jit.load` in-process — the least a client of S3 could do."""

import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import boto3
import torch
from moto.server import ThreadedMotoServer

from bench.churn import Held
from bench.harness import Server, save_model

TITLE = "Cold load of a 100 MiB model from S3, against local disk and in-process boto3 + torch.jit.load"
CONFIG = {"backend": "pytorch", "max_batch_size": 4, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
KEYS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench", "region_name": "us-east-1"}


def run(seconds: float, smoke: bool) -> list[str]:
    size, repeats = (10, 2) if smoke else (100, 5)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request lines
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        with tempfile.TemporaryDirectory() as scratch:
            root = Path(scratch) / "models"
            save_model(root, "big", Held(size), CONFIG)
            client = boto3.client("s3", endpoint_url=endpoint, **KEYS)
            client.create_bucket(Bucket="bench")
            for copy in range(repeats):  # a prefix per cold load: none is in the download cache
                for path in (root / "big").rglob("*"):
                    if path.is_file():
                        client.upload_file(str(path), "bench", f"copy{copy}/{path.relative_to(root / 'big')}")
            in_process = []
            for copy in range(repeats):
                start = time.perf_counter()
                target = Path(scratch) / f"fetched{copy}.pt"
                client.download_file("bench", f"copy{copy}/1/model.pt", str(target))
                torch.jit.load(str(target))
                in_process.append(time.perf_counter() - start)
            server = Server(root, SERVE_LOAD_MODELS="", SERVE_S3_ROOTS="s3://bench", AWS_ENDPOINT_URL_S3=endpoint,
                            AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                            SERVE_DOWNLOAD_CACHE=str(Path(scratch) / "cache"))
            try:
                cold = [_load(server, f"s3://bench/copy{copy}") for copy in range(repeats)]
                cached = [_load(server, f"s3://bench/copy{copy}") for copy in range(repeats)]
                local = [_load(server, "big") for _ in range(repeats)]
            finally:
                server.stop()
    finally:
        moto.stop()
    reference = statistics.median(in_process) * 1000
    rows = [("from S3, cold (download + load)", cold), ("from S3, in the download cache", cached), ("from local disk", local)]
    lines = [f"In-process `boto3 download_file` + `torch.jit.load`: {reference:,.0f} ms (median of {repeats}).", "",
             f"| load {size} MiB (median of {repeats}) | served | ratio to in-process |", "| --- | --- | --- |"]
    for label, times in rows:
        median = statistics.median(times) * 1000
        lines.append(f"| {label} | {median:,.0f} ms | {median / reference:.2f}× |")
    return lines


def _load(server: Server, url: str) -> float:
    start = time.perf_counter()
    assert server.post("/models", json.dumps({"model_name": "big", "url": url}).encode()) == 200, url
    elapsed = time.perf_counter() - start
    server.delete("/models/big")
    return elapsed
