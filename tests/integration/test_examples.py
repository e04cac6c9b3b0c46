"""The repository `make serve` serves (examples/models, built by `make examples`) loads whole, and the
README's first requests get their answers: SageMaker's invoke, V2 over HTTP and gRPC, TF Serving."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import grpc_clients
from tests.builders import wait_for
from tests.conftest import PROJECT

EXAMPLES = PROJECT / "examples" / "models"


@pytest.fixture(scope="module")
def server(start_server):
    server = start_server(EXAMPLES, SERVE_LOAD_MODELS="*")
    wait_for(server.ready, 90, "the examples did not load")
    wait_for(server.grpc_ready, 60, "the gRPC front-end did not come up")
    return server


def test_every_example_loads(server):
    assert server.loaded() == ["half_plus_three", "lengths", "mlp", "mlp_export", "sentiment"]


def test_the_readmes_first_requests_are_answered(server):
    sentiment = server.invoke("sentiment", {"features": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]})
    assert sentiment.status_code == 200 and sentiment.json()[0]["label"] in ("negative", "positive")
    predicted = server.request("POST", "/v1/models/half_plus_three:predict", json={"instances": [1.0, 2.0, 5.0]})
    assert predicted.json() == {"predictions": [3.5, 4.0, 5.5]}
    features = np.array([[5.1, 3.5, 1.4, 0.2]], np.float32)
    answers = []
    for module, client_class, url in ((httpclient, httpclient.InferenceServerClient, server.url.removeprefix("http://")),
                                      (grpcclient, grpc_clients.InferenceServerClient, server.grpc_url)):
        with client_class(url) as client:
            tensor = module.InferInput("INPUT0", list(features.shape), "FP32")
            tensor.set_data_from_numpy(features)
            answers.append(client.infer("mlp", [tensor]).as_numpy("OUTPUT0"))
    assert answers[0].shape == (1, 3) and np.allclose(answers[0], answers[1]) and np.isclose(answers[0].sum(), 1)


def test_the_exported_mlp_answers_as_the_torchscript_one(server):
    features = np.array([[5.1, 3.5, 1.4, 0.2], [1, 2, 3, 4]], np.float32)
    with httpclient.InferenceServerClient(server.url.removeprefix("http://")) as client:
        scripted, exported = (httpclient.InferInput(name, list(features.shape), "FP32") for name in ("INPUT0", "ARGS[0]"))
        scripted.set_data_from_numpy(features)
        exported.set_data_from_numpy(features)
        np.testing.assert_allclose(client.infer("mlp_export", [exported]).as_numpy("RESULT"),
                                   client.infer("mlp", [scripted]).as_numpy("OUTPUT0"), rtol=1e-5)
