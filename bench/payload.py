"""Scenario 3: a large input, float32 [1, 3, 224, 224] (588 KiB), as V2 JSON, V2 binary and
SageMaker invoke with application/x-npy; the model answers a small tensor, so decoding is measured."""

import io
import json

import numpy as np
import torch

from bench.harness import in_process_calls_per_s, v2_binary_request
from bench.triton import side_by_side

TITLE = "Large payload: float32 [1, 3, 224, 224] in, [1, 3] out"


class ChannelMean(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return INPUT0.mean(dim=(2, 3))


def run(seconds: float, smoke: bool) -> list[str]:
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    reference = in_process_calls_per_s(ChannelMean(), torch.from_numpy(image), 0.2 if smoke else 2)
    binary, binary_headers = v2_binary_request("INPUT0", image)
    v2_json = json.dumps({"inputs": [{"name": "INPUT0", "shape": list(image.shape), "datatype": "FP32",
                                      "data": image.ravel().tolist()}]}).encode()
    npy = io.BytesIO()
    np.save(npy, image)
    routes = [("V2 JSON", "/v2/models/image/infer", v2_json, {}),
              ("V2 binary", "/v2/models/image/infer", binary, binary_headers),
              ("SageMaker invoke (x-npy)", "/models/image/invoke", npy.getvalue(),
               {"Content-Type": "application/x-npy", "Accept": "application/json"})]
    config = {"backend": "pytorch", "max_batch_size": 4, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3, 224, 224]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]}]}
    table = side_by_side({"image": (ChannelMean(), config)}, routes, (1, 8, 64), seconds, SAGEMAKER_MAX_PAYLOAD_IN_MB="16")
    return [f"In-process torch: {reference:,.0f} calls/s. Body sizes: V2 JSON {len(v2_json) / 1e6:.1f} MB, "
            f"binary {len(binary) / 1e6:.2f} MB, npy {len(npy.getvalue()) / 1e6:.2f} MB.", "", *table]
