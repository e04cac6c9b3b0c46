"""KServe as its users run it: the server started exactly as deploy/kserve/servingruntime.yaml's
container runs it (its args and env; the model root and ports moved to this machine's), driven by the
`kserve` package's own clients over V2 REST, V1 REST and gRPC."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.builders import fp32_model, manifest_env, wait_for
from tests.conftest import PROJECT

DOUBLED = (2 * np.arange(8, dtype=np.float32).reshape(2, 4)).tolist()  # what the model (Scale) makes of kserve_calls' X


@pytest.fixture(scope="module")
def calls(start_server, tmp_path_factory):
    """Every KServe client call, made once against the server, by name."""
    # its model root: where KServe's storage initializer writes
    env = manifest_env(PROJECT / "deploy" / "kserve" / "servingruntime.yaml", "/mnt/models")
    root = tmp_path_factory.mktemp("mnt_models")
    fp32_model(root, "mlp")  # the repository storageUri names: one directory, named like the InferenceService
    server = start_server(root, **env)
    wait_for(server.ready, 60, "the model did not load")
    wait_for(server.grpc_ready, 60, "gRPC did not serve")
    result = subprocess.run([sys.executable, str(Path(__file__).with_name("kserve_calls.py")), server.url, server.grpc_url, "mlp"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_v2_rest_health_and_every_form_of_inference(calls):
    v2 = calls["v2"]
    assert (v2["live"], v2["ready"], v2["model_ready"], v2["unknown_ready"]) == (True, True, True, False)
    for form in ("json", "binary_inputs", "binary_output", "binary_data_output"):
        assert v2[form] == DOUBLED, form
    assert v2["unknown"]["error"] == "HTTPStatusError" and "404" in v2["unknown"]["message"]


def test_v1_rest_liveness_readiness_and_predict(calls):
    v1 = calls["v1"]
    assert (v1["live"], v1["model_ready"]) == (True, True)
    assert v1["predict"] == {"predictions": DOUBLED}
    assert v1["unknown"]["error"] == "HTTPStatusError" and "404" in v1["unknown"]["message"]


def test_grpc_with_the_clients_default_options(calls):
    answers = calls["grpc"]
    assert (answers["live"], answers["ready"], answers["model_ready"]) == (True, True, True)
    assert answers["raw"] == answers["typed"] == DOUBLED
    assert "Request for unknown model: 'no_such_model' is not found" in answers["unknown"]["message"]
