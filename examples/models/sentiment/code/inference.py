"""A SageMaker PyTorch handler: model.pt is loaded by default; requests are {"features": [[8 floats], ...]}."""

import json

import torch


def input_fn(body, content_type):
    if content_type != "application/json":
        raise ValueError(f"send application/json, not {content_type}")
    return torch.tensor(json.loads(body)["features"], dtype=torch.float32)


def output_fn(prediction, accept):
    labels = ["negative", "positive"]
    return json.dumps([{"label": labels[int(p.argmax())], "score": float(p.max())} for p in prediction]), "application/json"
