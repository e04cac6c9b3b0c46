"""The OpenAPI document: it describes every route the server has, and what it describes, sent by
schemathesis to a live server with real models, never gets a 500."""

import copy
import tempfile
from importlib.metadata import version as package_version

import hypothesis
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error

from container.api import openapi
from container.app import create_app
from container.settings import Settings
from tests.builders import Scale, Upper, fp32_model, handler_model, tensor, triton_model, wait_for

MODELS = ["mlp", "upper", "handler"]


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "mlp")
    triton_model(root, "upper", Upper(), [tensor("TEXT", "TYPE_STRING", [-1])], [tensor("OUT", "TYPE_STRING", [-1])])
    handler_model(root, "handler", None, Scale())
    server = start_server(root, SERVE_LOAD_MODELS=",".join(MODELS))
    wait_for(lambda: server.loaded() == sorted(MODELS), 60, "the models did not load")
    server.pid = server.worker_pid()
    return server


def _documented(document: dict) -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, operations in document["paths"].items() for method in operations]


def test_every_route_is_documented_and_every_documented_operation_is_routed(server, tmp_path):
    document = server.request("GET", "/openapi.json").json()
    assert document["openapi"].startswith("3.")
    app = create_app(Settings.from_env({"SERVE_MODEL_ROOT": str(tmp_path)}))
    routed = {(route.method, route.template) for route in app.extensions["dispatcher"].routes.routes}
    assert sorted(set(_documented(document)) - routed) == []
    assert sorted(routed - set(_documented(document))) == []


def test_the_document_is_made_from_the_route_table(server, tmp_path):
    app = create_app(Settings.from_env({"SERVE_MODEL_ROOT": str(tmp_path)}))
    routes = app.extensions["dispatcher"].routes.routes
    assert server.request("GET", "/openapi.json").json() == _document()
    assert all(route.doc.get("summary") and route.doc.get("tags") for route in routes), "a route without its operation"


def _for_schemathesis(document: dict) -> dict:
    """A copy of the document with model names that exist offered beside arbitrary ones, and without
    NPY request bodies, which schemathesis cannot write (the NPY codec has its property tests)."""
    document = copy.deepcopy(document)
    for operations in document["paths"].values():
        for operation in operations.values():
            operation.get("requestBody", {}).get("content", {}).pop("application/x-npy", None)
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "name" and parameter["in"] == "path" and "region" not in parameter.get("description", ""):
                    parameter["schema"] = {"anyOf": [{"enum": MODELS}, {"type": "string"}]}
    return document


def _document() -> dict:
    """The document of an app's route table, as the server serves it (the test above holds the two equal)."""
    with tempfile.TemporaryDirectory() as root:
        app = create_app(Settings.from_env({"SERVE_MODEL_ROOT": root}))
    return openapi.document(package_version("container"), app.extensions["dispatcher"].routes.routes)


schema = schemathesis.openapi.from_dict(_for_schemathesis(_document()))


def not_a_server_error_but_a_documented_501(ctx, response, case):
    """A 501 that the operation documents is the server saying what it does not do (a log or trace
    setting that would change), not a server error; any other 5xx is one."""
    if response.status_code == 501 and "501" in case.operation.definition.raw["responses"]:
        return None
    return not_a_server_error(ctx, response, case)


@schema.parametrize()
@hypothesis.settings(max_examples=25, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
def test_no_request_the_document_describes_gets_a_500(case, server):
    case.call_and_validate(base_url=server.url, checks=[not_a_server_error_but_a_documented_501], timeout=60)


def test_the_server_is_healthy_after_the_schema_run(server):
    assert server.worker_pid() == server.pid
    assert server.request("GET", "/ping").status_code == 200
    assert server.load("after", "mlp").status_code == 200  # schemathesis may have unloaded any model
    assert server.request("POST", "/v2/models/after/infer", json={"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).status_code == 200
