"""The same SageMaker-layout models answered in-process by SageMaker's own PyTorch toolkit
(`sagemaker-inference` + `sagemaker-pytorch-inference`, the code inside SageMaker's PyTorch container)
and by this server: the answers must agree, byte for byte for JSON and CSV."""

import io
import sys
import textwrap

import numpy as np
import pytest
import torch
from sagemaker_inference.transformer import Transformer
from sagemaker_pytorch_serving_container.default_pytorch_inference_handler import DefaultPytorchInferenceHandler

from container.backends.handler_context import Context
from tests.builders import defined, handler_model

STATE_DICT_HANDLER = """
import os
import torch
from net import Net

def model_fn(model_dir):
    model = Net()
    model.load_state_dict(torch.load(os.path.join(model_dir, "weights.pth")))
    return model
"""

NET = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(3, 8)
        self.drop = torch.nn.Dropout(0.3)
        self.out = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.out(self.drop(torch.tanh(self.hidden(x))))
"""


def npy(array) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


REQUESTS = [
    (b"[[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]]", "application/json", "application/json"),
    (b"[0.5, -1.0, 2.0]", "application/json", "text/csv"),
    (b"0.5,-1.0,2.0\n1.0,1.0,1.0\n", "text/csv", "text/csv"),
    (b"0.5,-1.0,2.0", "text/csv", "application/json"),  # one CSV row is a vector
    (npy(np.array([[0.25, 0.5, 0.75]], dtype=np.float32)), "application/x-npy", "application/json"),
    (npy(np.array([[0.25, 0.5, 0.75]], dtype=np.float32)), "application/x-npy", "application/x-npy"),
    (b"[[1, 2, 3]]", "application/json", "text/csv;q=0.5, application/json"),
    (b"[[1, 2, 3]]", "application/json", "*/*, text/csv"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(1)
    mlp = defined(NET, "Net")()
    scripted = handler_model(root, "scripted")  # the toolkit's default model_fn: one TorchScript file
    torch.jit.trace(mlp.eval(), torch.zeros(1, 3)).save(str(scripted / "model.pt"))
    stateful = handler_model(root, "stateful", STATE_DICT_HANDLER)
    (stateful / "code" / "net.py").write_text(textwrap.dedent(NET))
    torch.save(mlp.state_dict(), stateful / "weights.pth")
    return root


@pytest.fixture(scope="module")
def server(start_server, models):
    server = start_server(models)
    for name in ("scripted", "stateful"):
        assert server.load(name).status_code == 200
    return server


def toolkit(model_dir, body: bytes, content_type: str, accept: str) -> tuple[bytes, str]:
    """One request through the toolkit's Transformer, as its TorchServe handler service runs it."""
    code = str(model_dir / "code")
    sys.path.insert(0, code)
    try:
        transformer = Transformer(default_inference_handler=DefaultPytorchInferenceHandler())
        context = Context(model_dir.name, str(model_dir), "cpu")
        context.start(None, {"Content-Type": content_type, "Accept": accept})
        [response] = transformer.transform([{"body": bytearray(body)}], context)  # as TorchServe's worker reads it
    finally:
        sys.path.remove(code)
        for name in ("inference", "net"):
            sys.modules.pop(name, None)
    assert context.response.status == 200, response
    return (response.encode() if isinstance(response, str) else response), context.response.content_type


@pytest.mark.parametrize("name", ["scripted", "stateful"])
@pytest.mark.parametrize("body, content_type, accept", REQUESTS)
def test_answers_match_sagemakers_pytorch_toolkit(server, models, name, body, content_type, accept):
    expected, _ = toolkit(models / name, body, content_type, accept)
    answer = server.request("POST", f"/models/{name}/invoke", data=body, headers={"Content-Type": content_type, "Accept": accept})
    assert answer.status_code == 200, answer.text
    if answer.headers["Content-Type"] == "application/x-npy":
        ours, theirs = np.load(io.BytesIO(answer.content)), np.load(io.BytesIO(expected))
        assert ours.dtype == np.float32 and theirs.dtype == np.float64  # we keep the tensor's dtype, on purpose
        np.testing.assert_array_equal(ours.astype(np.float64), theirs)
    else:
        assert answer.content == expected
