"""Invoke bodies for tensor models: JSON forms, CSV, NPY, Accept negotiation, and the errors for each."""

import io

import numpy as np
import pytest

from tests.builders import (
    AddSub,
    Positional,
    Reordered,
    Scale,
    Upper,
    archive,
    fp32_model,
    tensor,
    triton_model,
)

NPY = "application/x-npy"


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "double", config_format="pbtxt")
    fp32_model(root, "vector", max_batch_size=0)  # x: FP32 [4], no batch dimension
    triton_model(root, "addsub", AddSub(), [tensor("INPUT0", "TYPE_INT64", [2]), tensor("INPUT1", "TYPE_INT64", [2])],
                 [tensor("OUTPUT0", "TYPE_INT64", [2]), tensor("OUTPUT1", "TYPE_INT64", [2])], max_batch_size=4)
    triton_model(root, "upper", Upper(), [tensor("TEXT", "TYPE_STRING", [-1])], [tensor("UPPER", "TYPE_STRING", [-1])])
    archive(fp32_model(tmp_path_factory.mktemp("src"), "ondemand"), root / "ondemand.tar.gz", top_folder=True)
    fp32_model(root, "versioned", versions=(1, 2, 3), version_policy={"latest": {"num_versions": 2}})
    pair = [tensor("INPUT0", "TYPE_INT64", [2]), tensor("INPUT1", "TYPE_INT64", [2])]
    triton_model(root, "reordered", Reordered(), pair, [tensor("OUTPUT0", "TYPE_INT64", [2]), tensor("OUTPUT1", "TYPE_INT64", [2])], 4)
    triton_model(root, "positional", Positional(), pair, [tensor("OUT", "TYPE_INT64", [2])], 4)
    triton_model(root, "arity", Scale(), pair, [tensor("OUT", "TYPE_INT64", [2])], 4)
    server = start_server(root, SAGEMAKER_MAX_PAYLOAD_IN_MB="1")
    for name in ("double", "vector", "addsub", "upper", "versioned", "reordered", "positional"):
        assert server.load(name).status_code == 200
    return server


def post(server, name, body, content_type="application/json", accept=None):
    headers = {"Content-Type": content_type} | ({"Accept": accept} if accept else {})
    return server.request("POST", f"/models/{name}/invoke", data=body, headers=headers)


def npy(array) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


@pytest.mark.parametrize("body, expected", [
    (b'{"instances": [[1, 2, 3, 4]]}', {"predictions": [[2, 4, 6, 8]]}),
    (b'{"inputs": [[1, 2, 3, 4], [0, 0, 0, 1]]}', {"outputs": [[2, 4, 6, 8], [0, 0, 0, 2]]}),
    (b'{"inputs": {"x": [[1, 2, 3, 4]]}}', {"outputs": [[2, 4, 6, 8]]}),
    (b'{"instances": [{"x": [1, 2, 3, 4]}]}', {"predictions": [[2, 4, 6, 8]]}),
    (b"[[1, 2, 3, 4]]", [[2, 4, 6, 8]]),
])
def test_json_forms(server, body, expected):
    answer = post(server, "double", body)
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "application/json"
    assert answer.json() == expected


def test_multiple_inputs_and_outputs_by_name(server):
    answer = post(server, "addsub", b'{"inputs": {"INPUT0": [[5, 6]], "INPUT1": [[1, 2]]}}')
    assert answer.json() == {"outputs": {"OUTPUT0": [[6, 8]], "OUTPUT1": [[4, 4]]}}


def test_inputs_bind_by_name_and_dict_outputs_by_name(server):
    answer = post(server, "reordered", b'{"inputs": {"INPUT0": [[5, 6]], "INPUT1": [[1, 2]]}}')
    assert answer.json() == {"outputs": {"OUTPUT0": [[6, 8]], "OUTPUT1": [[4, 4]]}}


def test_inputs_bind_positionally_in_config_order(server):
    assert post(server, "positional", b'{"inputs": {"INPUT1": [[1, 2]], "INPUT0": [[3, 4]]}}').json() == {"outputs": [[31, 42]]}


def test_forward_arity_must_match_the_config(server):
    answer = server.load("arity")
    assert answer.status_code == 400 and "forward() takes 1" in answer.json()["error"]


def test_strings_travel_as_list_of_str(server):
    assert post(server, "upper", b'{"inputs": ["abc", "d\xc3\xa9f"]}').json() == {"outputs": ["ABC", "D\u00e9F"]}  # TorchScript upper() is ASCII-only


def test_csv_and_npy_in_and_out(server):
    answer = post(server, "double", b"1,2,3,4\n5,6,7,8\n", "text/csv", accept="text/csv")
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "text/csv"
    assert np.loadtxt(io.StringIO(answer.text), delimiter=",").tolist() == [[2, 4, 6, 8], [10, 12, 14, 16]]
    answer = post(server, "double", npy(np.ones((2, 4), np.float32)), NPY, accept=NPY)
    assert answer.headers["Content-Type"] == NPY
    assert np.load(io.BytesIO(answer.content)).tolist() == [[2.0] * 4] * 2


@pytest.mark.parametrize("body", [b"1,2,3,4\n", b"1\n2\n3\n4\n"], ids=["row", "column"])
def test_csv_of_one_row_or_column_is_the_vector_a_model_without_batching_takes(server, body):
    """As a JSON array of four is; it was refused as the shape [1, 4] (or [4, 1])."""
    answer = post(server, "vector", body, "text/csv", accept="application/json")
    assert answer.status_code == 200, answer.text
    assert answer.json() == [2, 4, 6, 8] == post(server, "vector", b"[1, 2, 3, 4]").json()


@pytest.mark.parametrize("accept, media_type", [
    (None, "application/json"), ("*/*", "application/json"), ("application/json; charset=utf-8", "application/json"),
    ("image/png, application/x-npy, application/json", NPY), ("text/html, text/csv;q=0.9", "text/csv"),
])
def test_accept_negotiation(server, accept, media_type):
    answer = post(server, "double", b"[[1, 2, 3, 4]]", accept=accept)
    assert answer.status_code == 200 and answer.headers["Content-Type"] == media_type


def test_latest_served_version_answers(server):
    assert post(server, "versioned", b"[[1, 1, 1, 1]]").json() == [[2, 2, 2, 2]]


def test_content_type_parameters_are_ignored(server):
    assert post(server, "double", b"[[1, 2, 3, 4]]", "application/json; charset=utf-8").status_code == 200


@pytest.mark.parametrize("name, body, content_type, accept, status, message", [
    ("double", b"[[1, 2, 3]]", "application/json", None, 400, "input 'x' must have shape [-1, 4], got [1, 3]"),
    ("double", b'[["a", "b", "c", "d"]]', "application/json", None, 400, "input 'x' is FP32: send numbers"),
    ("double", b"[[1, 2], [3]]", "application/json", None, 400, "input 'x'"),
    ("double", b"[[1, 2, 3, 4]", "application/json", None, 400, "malformed JSON"),
    ("double", b'{"rows": [[1, 2, 3, 4]]}', "application/json", None, 400, '"instances" or "inputs"'),
    ("double", b'{"inputs": {"z": [[1, 2, 3, 4]]}}', "application/json", None, 400, "unknown input 'z'"),
    ("double", b"[" + b"[1, 2, 3, 4]," * 8 + b"[1, 2, 3, 4]]", "application/json", None, 400, "batch size 9 is outside 1..8"),
    ("double", b"1,2,x,4", "text/csv", None, 400, "malformed CSV"),
    ("double", b"\x93NUMPY garbage", NPY, None, 400, "malformed NPY"),
    ("double", b"<x/>", "application/xml", None, 415, "application/xml"),
    ("double", b"[[1, 2, 3, 4]]", "application/json", "image/png", 406, "image/png"),
    ("addsub", b'{"inputs": {"INPUT0": [[1, 2]]}}', "application/json", None, 400, "missing input(s) ['INPUT1']"),
    ("addsub", b'{"inputs": {"INPUT0": [[1.5, 2]], "INPUT1": [[1, 2]]}}', "application/json", None, 400, "INT64: got floating-point"),
    ("addsub", b"[[1, 2]]", "application/json", None, 400, "the model takes 2 inputs"),
    ("addsub", b'{"inputs": {"INPUT0": [[1, 2]], "INPUT1": [[1, 2]]}}', "application/json", NPY, 406, "2 outputs"),
    ("upper", b'{"inputs": [1, 2]}', "application/json", None, 400, "input 'TEXT' is BYTES"),
])
def test_bad_requests_say_what_to_fix_and_the_server_carries_on(server, name, body, content_type, accept, status, message):
    answer = post(server, name, body, content_type, accept)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]
    assert post(server, "double", b"[[1, 2, 3, 4]]").json() == [[2, 4, 6, 8]]


def test_oversized_body_is_413(server):
    answer = post(server, "double", b"[" + b"0," * 600_000 + b"0]")
    assert answer.status_code == 413 and "error" in answer.json()
    assert post(server, "double", b"[[1, 2, 3, 4]]").status_code == 200


def test_invocations_loads_the_target_model_on_first_use(server):
    headers = {"X-Amzn-SageMaker-Target-Model": "ondemand.tar.gz", "X-Amzn-SageMaker-Custom-Attributes": "trace=1",
               "Content-Type": "application/json"}
    answer = server.request("POST", "/invocations", data=b"[[1, 2, 3, 4]]", headers=headers)
    assert answer.status_code == 200 and answer.json() == [[2, 4, 6, 8]]
    assert "ondemand.tar.gz" in server.loaded()


def test_invocations_errors(server):
    answer = server.request("POST", "/invocations", json=[[1, 2, 3, 4]])
    assert answer.status_code == 400 and "X-Amzn-SageMaker-Target-Model" in answer.json()["error"]
    for target, status in (("nothing-here.tar.gz", 404), ("../../etc", 400)):
        answer = server.request("POST", "/invocations", json=[1], headers={"X-Amzn-SageMaker-Target-Model": target})
        assert answer.status_code == status and "error" in answer.json()
