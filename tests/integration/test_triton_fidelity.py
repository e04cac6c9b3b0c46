"""A Triton model repository as Triton serves it: libtorch models written the way Triton's own QA
generators write them (`qa/common/gen_qa_*.py`: `<name>__<index>` tensors, `reshape`, implicit state
with `INPUT_STATE__1`/`START__2`/`READY__3`), driven with tritonclient."""

import gzip
import math
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Tuple

import numpy as np
import pytest
import requests
import torch
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.builders import Scale, Upper, tensor, triton_model, wait_for

FOUR = np.array([[1, 2, 3, 4]], np.float32)


class AddSubNet(torch.nn.Module):
    """gen_qa_models: inputs bound by forward() argument name, outputs by their `__<index>`."""

    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class Difference(torch.nn.Module):
    """Arguments named unlike the config: INPUT__0 must reach `a` whatever order the config lists."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a - b


class ReshapeNet(torch.nn.Module):
    """Sees [batch, 2, 2] (config dims [4], reshape [2, 2]); returns [batch] (dims [1], reshape [])."""

    def forward(self, INPUT0: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if INPUT0.dim() != 3:
            raise ValueError("expected the reshaped input [batch, 2, 2]")
        return INPUT0.sum(dim=(1, 2)), INPUT0.sum(dim=2)


class ScalarNet(torch.nn.Module):
    """Without batching: a [2, 2] input seen as [4]; a scalar output sent as dims [1]."""

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        if INPUT0.dim() != 1:
            raise ValueError("expected the reshaped input [4]")
        return INPUT0.sum()


class DictNet(torch.nn.Module):
    """One Dict[str, Tensor] argument: Triton passes every input by name."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["x"] * 10 + inputs["y"]


class Bias(torch.nn.Module):
    """An optional input, as Triton's configs mark one (`optional: true`): None when the request leaves it out."""

    def forward(self, INPUT0: torch.Tensor, BIAS: Optional[torch.Tensor] = None) -> torch.Tensor:
        return INPUT0 if BIAS is None else INPUT0 + BIAS


class Flags(torch.nn.Module):
    def forward(self, FLAGS: torch.Tensor) -> torch.Tensor:
        return torch.logical_not(FLAGS)


class SequenceNet(torch.nn.Module):
    """gen_qa_implicit_models (no initial state): the state adds up INPUT__0 across a sequence."""

    def forward(self, input0, input0_state, start0, ready0):
        use_state = torch.logical_and(ready0, torch.logical_not(start0))
        result = torch.mul(use_state, input0_state)
        result += input0
        return result, result


class InitialStateNet(torch.nn.Module):
    """gen_qa_implicit_models with an initial state: state + input, the state starting from its file."""

    def forward(self, input0, input0_state, start0, ready0):
        result = input0_state + input0
        return result, result


class StringSequenceNet(torch.nn.Module):
    """gen_qa_implicit_models for TYPE_STRING: numbers as text, the state empty at the start."""

    def forward(self, input0: List[str], input0_state: List[str], start0, ready0) -> Tuple[List[str], List[str]]:
        use_state = torch.logical_and(ready0, torch.logical_not(start0))
        state = torch.tensor([int("0" + i) for i in input0_state])
        value = torch.tensor([int("0" + i) for i in input0])
        total = torch.mul(use_state.reshape(-1), state) + value
        result = [str(i.item()) for i in total]
        return result, result


def control(name: str, kind: str) -> dict:
    return {"name": name, "control": [{"kind": f"CONTROL_SEQUENCE_{kind}", "int32_false_true": [0, 1]}]}


def implicit_state(data_type: str, **initial) -> dict:
    state = {"input_name": "INPUT_STATE__1", "output_name": "OUTPUT_STATE__1", "data_type": data_type, "dims": [1]}
    if initial:
        state["initial_state"] = [{"data_type": data_type, "dims": [1], "name": "initial", **initial}]
    # READY before START: the index in the name binds them, not the order listed
    return {"sequence_batching": {"max_sequence_idle_microseconds": 5_000_000,
                                  "control_input": [control("READY__3", "READY"), control("START__2", "START")],
                                  "state": [state]}}


def sequence_model(root, name, module, data_type, **initial):
    return triton_model(root, name, module, [tensor("INPUT__0", data_type, [1])], [tensor("OUTPUT__0", data_type, [1])],
                        max_batch_size=8, config_format="pbtxt", **implicit_state(data_type, **initial))


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    int32 = [tensor("INPUT0", "TYPE_INT32", [4]), tensor("INPUT1", "TYPE_INT32", [4])]
    triton_model(root, "addsub", AddSubNet(), int32,
                 [tensor("OUTPUT__1", "TYPE_INT32", [4]), tensor("OUTPUT__0", "TYPE_INT32", [4])], max_batch_size=8,
                 config_format="pbtxt")
    triton_model(root, "difference", Difference(), [tensor("INPUT__1", "TYPE_INT32", [4]), tensor("INPUT__0", "TYPE_INT32", [4])],
                 [tensor("OUTPUT__0", "TYPE_INT32", [4])], max_batch_size=8)
    triton_model(root, "reshape", ReshapeNet(), [{**tensor("INPUT0", "TYPE_FP32", [4]), "reshape": {"shape": [2, 2]}}],
                 [{**tensor("OUTPUT__0", "TYPE_FP32", [1]), "reshape": {"shape": []}},
                  {**tensor("OUTPUT__1", "TYPE_FP32", [2, 1]), "reshape": {"shape": [2]}}], max_batch_size=8)
    triton_model(root, "reshape_nobatch", ScalarNet(), [{**tensor("INPUT0", "TYPE_FP32", [2, 2]), "reshape": {"shape": [4]}}],
                 [{**tensor("OUTPUT0", "TYPE_FP32", [1]), "reshape": {"shape": []}}])
    triton_model(root, "dict", DictNet(), [tensor("y", "TYPE_FP32", [2]), tensor("x", "TYPE_FP32", [2])],
                 [tensor("z", "TYPE_FP32", [2])], max_batch_size=4)
    sequence_model(root, "sequence", SequenceNet(), "TYPE_INT32")
    initial = sequence_model(root, "sequence_initial", InitialStateNet(), "TYPE_INT32", data_file="start_at_100")
    (initial / "initial_state").mkdir()
    (initial / "initial_state" / "start_at_100").write_bytes(np.array([100], "<i4").tobytes())
    sequence_model(root, "sequence_string", StringSequenceNet(), "TYPE_STRING")
    triton_model(root, "on_gpu", AddSubNet(), int32, [tensor("OUTPUT__0", "TYPE_INT32", [4]), tensor("OUTPUT__1", "TYPE_INT32", [4])],
                 max_batch_size=8, instance_group=[{"kind": "KIND_GPU", "count": 2, "gpus": [0]}])
    triton_model(root, "bias", Bias(), [tensor("INPUT0", "TYPE_FP32", [4]), {**tensor("BIAS", "TYPE_FP32", [4]), "optional": True}],
                 [tensor("OUTPUT0", "TYPE_FP32", [4])], max_batch_size=8, dynamic_batching={"max_queue_delay_microseconds": 1000})
    triton_model(root, "flags", Flags(), [tensor("FLAGS", "TYPE_BOOL", [-1])], [tensor("NOT", "TYPE_BOOL", [-1])])
    triton_model(root, "upper", Upper(), [tensor("TEXT", "TYPE_STRING", [-1])], [tensor("OUT", "TYPE_STRING", [-1])],
                 max_batch_size=8)
    triton_model(root, "grid", Scale(), [tensor("INPUT0", "TYPE_FP16", [-1, -1])], [tensor("OUTPUT0", "TYPE_FP16", [-1, -1])])
    server = start_server(root, SERVE_LOAD_MODELS="*")
    client = http.InferenceServerClient(server.url.removeprefix("http://"))
    wait_for(client.is_server_ready, message="the models named at start did not load")
    client.close()
    server.first_worker = server.worker_pid()
    return server


@pytest.fixture
def client(server):
    client = http.InferenceServerClient(server.url.removeprefix("http://"))
    yield client
    client.close()


@pytest.mark.parametrize("shape", [[1, 16], [2, 3], [3, 1]])
def test_a_batched_string_output_keeps_the_batch_dimension(client, shape):
    words = np.array([f"w{i}".encode() for i in range(math.prod(shape))], dtype=object).reshape(shape)
    out = infer(client, "upper", {"TEXT": words})["OUT"]
    assert out.shape == tuple(shape) and out.tolist() == [[w.upper() for w in row] for row in words.tolist()]


def infer(client, model, named: dict, **kwargs) -> dict:
    inputs = []
    for name, array in named.items():
        datatype = "BYTES" if array.dtype == object else {"i": "INT32", "f": "FP32"}[array.dtype.kind]
        inputs.append(http.InferInput(name, list(array.shape), datatype))
        inputs[-1].set_data_from_numpy(array)
    result = client.infer(model, inputs, **kwargs)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def test_outputs_bind_by_their_index_whatever_order_the_config_lists(client):
    a, b = np.array([[1, 2, 3, 4]], np.int32), np.array([[10, 20, 30, 40]], np.int32)
    outputs = infer(client, "addsub", {"INPUT0": a, "INPUT1": b})
    assert outputs["OUTPUT__0"].tolist() == (a + b).tolist()
    assert outputs["OUTPUT__1"].tolist() == (a - b).tolist()


def test_inputs_bind_by_their_index_when_forward_names_them_otherwise(client):
    first, second = np.array([[5, 5, 5, 5]], np.int32), np.array([[1, 2, 3, 4]], np.int32)
    outputs = infer(client, "difference", {"INPUT__1": second, "INPUT__0": first})
    assert outputs["OUTPUT__0"].tolist() == [[4, 3, 2, 1]]


def test_a_single_dict_argument_gets_every_input_by_name(client):
    outputs = infer(client, "dict", {"x": np.array([[1, 2]], np.float32), "y": np.array([[3, 4]], np.float32)})
    assert outputs["z"].tolist() == [[13, 24]]


def test_reshape_gives_the_model_its_shape_and_the_client_the_configured_one(client, server):
    batch = np.arange(8, dtype=np.float32).reshape(2, 4)
    outputs = infer(client, "reshape", {"INPUT0": batch})
    assert outputs["OUTPUT__0"].shape == (2, 1) and outputs["OUTPUT__0"].tolist() == [[6], [22]]
    assert outputs["OUTPUT__1"].shape == (2, 2, 1) and outputs["OUTPUT__1"].tolist() == [[[1], [5]], [[9], [13]]]
    outputs = infer(client, "reshape_nobatch", {"INPUT0": np.ones((2, 2), np.float32)})
    assert outputs["OUTPUT0"].shape == (1,) and outputs["OUTPUT0"].tolist() == [4]
    metadata = client.get_model_metadata("reshape")
    assert [o["shape"] for o in metadata["outputs"]] == [[-1, 1], [-1, 2, 1]]


@pytest.mark.parametrize("model, values, expected, start", [
    ("sequence", [1, 2, 3, 4], [1, 3, 6, 10], 0),
    ("sequence_initial", [1, 2, 3], [101, 103, 106], 100),
])
def test_implicit_state_accumulates_across_a_sequence(client, model, values, expected, start):
    for sequence_id in (11, 12):  # a second sequence starts afresh
        got = []
        for i, value in enumerate(values):
            outputs = infer(client, model, {"INPUT__0": np.array([[value]], np.int32)}, sequence_id=sequence_id,
                            sequence_start=i == 0, sequence_end=i == len(values) - 1)
            assert set(outputs) == {"OUTPUT__0"}  # the state output stays inside
            got.append(int(outputs["OUTPUT__0"][0, 0]))
        assert got == expected


def test_string_state_starts_empty(client):
    got = []
    for i, value in enumerate(["4", "5", "6"]):
        outputs = infer(client, "sequence_string", {"INPUT__0": np.array([[value]], dtype=object)}, sequence_id=7,
                        sequence_start=i == 0, sequence_end=i == 2)
        got.append(outputs["OUTPUT__0"][0, 0])
    assert got == [b"4", b"9", b"15"]


def test_metadata_for_a_version_lists_that_version(client):
    assert client.get_model_metadata("addsub", "1")["versions"] == ["1"]
    with pytest.raises(InferenceServerException, match="version 2 is not found"):
        client.get_model_metadata("addsub", "2")


def test_config_prints_fields_at_their_default_value(client):
    config = client.get_model_config("sequence")
    kinds = {c["name"]: c["control"][0]["kind"] for c in config["sequence_batching"]["control_input"]}
    assert kinds == {"START__2": "CONTROL_SEQUENCE_START", "READY__3": "CONTROL_SEQUENCE_READY"}
    assert config["input"][0]["is_shape_tensor"] is False and config["input"][0]["optional"] is False
    assert config["output"][0]["label_filename"] == "" and config["model_warmup"] == []


def test_server_metadata_lists_every_extension_served(client):
    extensions = client.get_server_metadata()["extensions"]
    assert {"sequence", "schedule_policy", "model_configuration", "binary_tensor_data"} <= set(extensions)


def test_badly_bound_models_are_refused_with_the_convention_to_follow(server):
    class Three(torch.nn.Module):
        def forward(self, input0, input0_state, start0):
            return input0 + input0_state + start0, input0

    root = server.model_root
    config = implicit_state("TYPE_INT32")
    config["sequence_batching"]["control_input"] = [control("START", "START")]
    triton_model(root, "unbound", Three(), [tensor("INPUT__0", "TYPE_INT32", [1])],
                 [tensor("OUTPUT__0", "TYPE_INT32", [1])], max_batch_size=8, **config)
    response = requests.post(f"{server.url}/v2/repository/models/unbound/load", timeout=60)
    assert response.status_code == 400 and "<name>__<index>" in response.json()["error"]


def test_an_optional_input_may_be_left_out(client):
    bias = np.full((1, 4), 10, np.float32)
    assert infer(client, "bias", {"INPUT0": FOUR, "BIAS": bias})["OUTPUT0"].tolist() == [[11, 12, 13, 14]]
    assert infer(client, "bias", {"INPUT0": FOUR})["OUTPUT0"].tolist() == [[1, 2, 3, 4]]
    with pytest.raises(InferenceServerException, match=r"missing input\(s\) \['INPUT0'\]; the model takes 'INPUT0' "
                                                      r"FP32\[-1, 4\], 'BIAS' FP32\[-1, 4\] \(optional\)"):
        infer(client, "bias", {"BIAS": bias})
    assert client.get_model_config("bias")["input"][1]["optional"] is True


def test_requests_with_and_without_an_optional_input_batch_apart(server):
    """Eight clients at once, half of them sending BIAS: each gets its own answer, whatever batch it joined."""
    def one(index: int) -> list:
        with http.InferenceServerClient(server.url.removeprefix("http://")) as client:
            inputs = {"INPUT0": FOUR * index, **({"BIAS": np.ones((1, 4), np.float32)} if index % 2 else {})}
            return infer(client, "bias", inputs)["OUTPUT0"].tolist()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    assert answers == [(FOUR * i + (i % 2)).tolist() for i in range(8)]


def test_an_optional_input_forward_cannot_take_as_none_is_refused_at_load(server):
    class Plain(torch.nn.Module):
        def forward(self, INPUT0: torch.Tensor, BIAS: torch.Tensor) -> torch.Tensor:
            return INPUT0 + BIAS

    triton_model(server.model_root, "plain", Plain(), [tensor("INPUT0", "TYPE_FP32", [4]),
                                                       {**tensor("BIAS", "TYPE_FP32", [4]), "optional": True}],
                 [tensor("OUTPUT0", "TYPE_FP32", [4])], max_batch_size=8)
    response = requests.post(f"{server.url}/v2/repository/models/plain/load", timeout=60)
    assert (response.status_code, response.json()) == (400, {"error": "failed to load 'plain', input 'BIAS' is optional, "
                                                         "so forward()'s argument 'BIAS' must be Optional[Tensor] (it is Tensor)"})


class Widens(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return INPUT0.double() * 100.5


def test_an_output_of_another_type_than_declared_fails_in_tritons_words_never_cast(server):
    """Cast to the config's INT8, 302 would have wrapped to 46."""
    triton_model(server.model_root, "widens", Widens(), [tensor("INPUT0", "TYPE_FP32", [4])],
                 [tensor("OUTPUT0", "TYPE_INT8", [4])], max_batch_size=0)
    assert requests.post(f"{server.url}/v2/repository/models/widens/load", timeout=60).status_code == 200
    with http.InferenceServerClient(server.url.removeprefix("http://")) as client:
        values = http.InferInput("INPUT0", [4], "FP32")
        values.set_data_from_numpy(np.array([1, 2, 3, 4], np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("widens", [values])
    assert refused.value.status() == "500"
    assert "configuration expects datatype TYPE_INT8 for output 'OUTPUT0', model provides TYPE_FP64" in refused.value.message()
    assert requests.get(f"{server.url}/v2/models/widens/ready", timeout=30).status_code == 200  # the model serves on


class RefusesZeros(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x == 0).all()):
            raise RuntimeError("an all-zero input")
        return x * 2


def warmup(name: str, **data) -> dict:
    return {"name": name, "batch_size": 2, "count": 2, "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [4], **data}}}


def test_model_warmup_samples_run_before_the_model_serves(server):
    directory = triton_model(server.model_root, "warmed", RefusesZeros(), [tensor("x", "TYPE_FP32", [4])],
                             [tensor("y", "TYPE_FP32", [4])], max_batch_size=8,
                             model_warmup=[warmup("random", random_data=True), warmup("file", input_data_file="ones")])
    (directory / "warmup").mkdir()
    (directory / "warmup" / "ones").write_bytes(np.ones(4, "<f4").tobytes())
    assert requests.post(f"{server.url}/v2/repository/models/warmed/load", timeout=60).status_code == 200
    assert server.request("POST", "/v2/models/warmed/generate", json={"x": [1, 2, 3, 4]}).json()["y"] == [2, 4, 6, 8]


@pytest.mark.parametrize("sample, message", [
    (warmup("zeros", zero_data=True), "model_warmup 'zeros' failed: model 'cold' failed: builtins.RuntimeError: an "
                                      "all-zero input"),
    ({**warmup("big", zero_data=True), "batch_size": 9}, "model_warmup 'big': batch_size 9 is past max_batch_size 8"),
    ({**warmup("short"), "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [8], "input_data_file": "ones"}}},
     "model_warmup 'short' input 'x': the data file holds 16 bytes; FP32[8] takes 32"),
    (warmup("absent", input_data_file="none"), "model_warmup 'absent' input 'x': input_data_file 'none' is not a file "
                                              "in the model's warmup/"),
    ({**warmup("named", zero_data=True), "inputs": {"z": {"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}}},
     "model_warmup 'named' failed: missing input(s) ['x']"),
])
def test_a_warmup_sample_the_model_cannot_run_fails_its_load(server, sample, message):
    directory = triton_model(server.model_root, "cold", RefusesZeros(), [tensor("x", "TYPE_FP32", [4])],
                             [tensor("y", "TYPE_FP32", [4])], max_batch_size=8, model_warmup=[sample])
    (directory / "warmup").mkdir()
    (directory / "warmup" / "ones").write_bytes(np.ones(4, "<f4").tobytes())
    try:
        response = requests.post(f"{server.url}/v2/repository/models/cold/load", timeout=60)
        assert response.status_code == 400 and message in response.json()["error"], response.text
    finally:
        shutil.rmtree(directory)


def test_raw_binary_request_is_the_one_inputs_bytes(server):
    response = server.request("POST", "/v2/models/reshape/infer", data=FOUR.tobytes(),
                             headers={"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"})
    assert response.status_code == 200, response.text
    result = http.InferenceServerClient.parse_response_body(
        response.content, header_length=int(response.headers["Inference-Header-Content-Length"]))
    assert result.as_numpy("OUTPUT__0").tolist() == [[10]]  # a batch of one, every output as binary data
    assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])


@pytest.mark.parametrize("model, body, message", [
    ("addsub", b"\0" * 32, "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'addsub' "
                           "model configuration"),
    ("reshape", b"\0" * 15, "input byte size mismatch for input 'INPUT0' for model 'reshape'. Expected 16, got 15"),
    # Triton's L0_http test_multi_variable_dimensions and test_byte_too_many_elements
    ("grid", np.ones([2, 2], np.float16).tobytes(),
     "The shape of the raw input 'INPUT0' can not be deduced because there are more than one variable-sized dimension"),
    ("upper", b"427", "For BYTE datatype raw input 'TEXT', the model must have input shape [1]"),
    ("flags", b"\1\0\1", None),
])
def test_raw_binary_requests_the_model_cannot_take_say_why(server, model, body, message):
    response = server.request("POST", f"/v2/models/{model}/infer", data=body,
                             headers={"Inference-Header-Content-Length": "0"})
    if message is None:  # a variable dimension is taken from the body's size
        result = http.InferenceServerClient.parse_response_body(
            response.content, header_length=int(response.headers["Inference-Header-Content-Length"]))
        assert result.as_numpy("NOT").tolist() == [False, True, False]
        return
    assert response.status_code == 400 and message in response.json()["error"]


@pytest.mark.parametrize("request_coding, response_coding", [("gzip", None), ("deflate", "gzip"), (None, "deflate")])
def test_compressed_requests_and_answers(client, request_coding, response_coding):
    inputs = [http.InferInput("INPUT0", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(FOUR)
    result = client.infer("reshape", inputs, request_compression_algorithm=request_coding,
                          response_compression_algorithm=response_coding)
    assert result.as_numpy("OUTPUT__0").tolist() == [[10]]


def test_answers_are_compressed_only_when_asked(server):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    for accept, coding in [("gzip;q=0.5, deflate", "deflate"), ("br, *;q=0.1", "gzip"), ("gzip;q=0", None), ("br", None)]:
        response = server.request("POST", "/v2/models/reshape/infer", json=body, headers={"Accept-Encoding": accept})
        assert response.headers.get("Content-Encoding") == coding, accept
        assert response.json()["outputs"][0]["data"] == [10]  # requests inflates it


@pytest.mark.parametrize("coding, body, status, message", [
    ("gzip", b"not gzip at all", 400, "not valid gzip data"),
    ("gzip", gzip.compress(b'{"inputs": []}', mtime=0)[:-12], 400, "ends before its compressed stream"),
    ("br", b"{}", 415, "Content-Encoding 'br' is not supported"),
    ("gzip", gzip.compress(b" " * (8 << 20), mtime=0), 413, "inflates past"),
])
def test_bad_compressed_bodies_are_refused(server, coding, body, status, message):
    response = server.request("POST", "/v2/models/reshape/infer", data=body, headers={"Content-Encoding": coding})
    assert response.status_code == status and message in response.json()["error"]


@pytest.mark.parametrize("document, message", [
    ({"parameters": {"triton_enable_empty_final_response": True}},
     "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."),
    ({"outputs": [{"name": "OUTPUT__0"}, {"name": "OUTPUT__0"}]}, "output 'OUTPUT__0' already exists in request"),
])
def test_requests_triton_refuses_are_refused_in_its_words(server, document, message):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}], **document}
    response = server.request("POST", "/v2/models/reshape/infer", json=body)
    assert response.status_code == 400 and response.json()["error"] == message


@pytest.mark.parametrize("model, datatype, shape, values", [
    ("upper", "BYTES", [1, 1], ["hello"]), ("reshape", "FP32", [1, 4], [1.0, 2.0, 3.0, 4.0])])
@pytest.mark.parametrize("depth, accepted", [(50, True), (98, True), (99, False), (120, False)])
def test_v2_data_nests_as_deep_as_tritons_limit_whatever_its_shape(server, model, datatype, shape, values, depth, accepted):
    """Triton reads "data" in order however it nests, up to 100 arrays deep (the values' own array included)."""
    data = values
    for _ in range(depth):
        data = [data]
    body = {"inputs": [{"name": "TEXT" if model == "upper" else "INPUT0", "datatype": datatype, "shape": shape, "data": data}]}
    response = requests.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=60)
    if accepted:
        assert response.status_code == 200, response.text
    else:
        assert response.status_code == 400
        assert "JSON nesting depth exceeds maximum allowed limit (100)" in response.json()["error"]


@pytest.mark.parametrize("binary", [False, True])
def test_zero_element_bool_input(client, binary):
    inputs = [http.InferInput("FLAGS", [0], "BOOL")]
    inputs[0].set_data_from_numpy(np.zeros(0, bool), binary_data=binary)
    assert client.infer("flags", inputs).as_numpy("NOT").shape == (0,)


@pytest.mark.parametrize("path, message", [
    ("/v2/models/nobody/infer", "Request for unknown model: 'nobody' is not found"),
    ("/v2/models/addsub/versions/9/infer", "Request for unknown model: 'addsub' version 9 is not found"),
])
def test_unknown_models_in_tritons_words(server, path, message):
    response = server.request("POST", path, json={"inputs": []})
    assert response.status_code == 404 and response.json()["error"] == message


def test_generate_answers_a_flat_object_as_triton_does(server):
    """The generate extension, as TensorRT-LLM's quick start calls it: keys that name inputs are inputs."""
    answer = server.request("POST", "/v2/models/upper/generate",
                           json={"id": "42", "TEXT": "client input", "parameters": {"temperature": 0}})
    assert (answer.status_code, answer.json()) == \
        (200, {"id": "42", "model_name": "upper", "model_version": "1", "OUT": "CLIENT INPUT"})
    answer = server.request("POST", "/v2/models/addsub/versions/1/generate",
                           json={"INPUT0": [5, 6, 7, 8], "INPUT1": [1, 1, 1, 1]})
    assert answer.json() == {"model_name": "addsub", "model_version": "1", "OUTPUT__0": [6, 7, 8, 9],
                             "OUTPUT__1": [4, 5, 6, 7]}
    assert server.request("POST", "/v2/models/upper/generate", json={"TEXT": ["a", "b"]}).json()["OUT"] == ["A", "B"]
    squeezed = server.request("POST", "/v2/models/upper/generate", data=gzip.compress(b'{"TEXT": "zipped"}'),
                             headers={"Content-Encoding": "gzip"})
    assert squeezed.json()["OUT"] == "ZIPPED"  # inflated, as V2 infer's body is


@pytest.mark.parametrize("path, body, status, message", [
    ("/v2/models/addsub/generate", {"INPUT0": [1, 2, 3], "INPUT1": [1, 2, 3, 4]}, 400,
     "input 'INPUT0': 3 value(s) do not fill its shape [-1, 4]"),
    ("/v2/models/addsub/generate", {"INPUT0": [[1, 2, 3, 4]], "INPUT1": [1, 2, 3, 4]}, 400,
     "input 'INPUT0' takes a value or a flat list of values"),
    ("/v2/models/upper/generate", {"TEXT": "a", "options": {"beam": 2}}, 400,
     "'options' is not an input of model 'upper', so it is a parameter, which takes a string, number or boolean"),
    ("/v2/models/upper/generate", {"TEXT": "a", "id": 7}, 400, "'id' must be a string"),
    ("/v2/models/upper/generate", {"TEXT": "a", "parameters": ["x"]}, 400, "'parameters' must be an object"),
    ("/v2/models/upper/generate", ["a"], 400, "the request body must be a JSON object"),
    ("/v2/models/upper/generate_stream", {"TEXT": "a"}, 415, "Content-Encoding 'br' is not supported; use gzip or deflate"),
    ("/v2/models/upper/generate", {"text_input": "a"}, 400, "the request names none of model 'upper''s inputs: TEXT"),
    ("/v2/models/addsub/generate", {"INPUT0": [1, 2, 3, 4]}, 400,
     "missing input(s) ['INPUT1']; the model takes 'INPUT0' INT32[-1, 4], 'INPUT1' INT32[-1, 4]"),
    ("/v2/models/nobody/generate", {"TEXT": "a"}, 404, "Request for unknown model: 'nobody' is not found"),
    ("/v2/models/upper/versions/3/generate", {"TEXT": "a"}, 404, "Request for unknown model: 'upper' version 3 is not found"),
])
def test_generate_requests_that_cannot_be_served_say_why(server, path, body, status, message):
    answer = server.request("POST", path, json=body, headers={"Content-Encoding": "br"} if status == 415 else {})
    assert (answer.status_code, answer.json()) == (status, {"error": message})


WARNING_LOG = {"log_file": "", "log_info": False, "log_warning": True, "log_error": True, "log_verbose_level": 0,
               "log_format": "json"}  # SERVE_LOG_LEVEL=warning
NO_TRACING = {"trace_level": ["OFF"], "trace_rate": "0", "trace_count": "0", "log_frequency": "0", "trace_file": "",
              "trace_mode": "triton"}


def test_log_and_trace_settings_say_what_the_server_has(client):
    assert client.get_log_settings() == WARNING_LOG
    assert client.update_log_settings({"log_warning": True, "log_info": None}) == WARNING_LOG  # restated, or cleared
    assert client.get_trace_settings() == NO_TRACING
    assert client.get_trace_settings(model_name="addsub") == NO_TRACING
    assert client.update_trace_settings("addsub", {"trace_level": None, "trace_rate": "0"}) == NO_TRACING
    assert "logging" in client.get_server_metadata()["extensions"]
    with pytest.raises(InferenceServerException, match="log setting 'log_info' cannot be changed"):
        client.update_log_settings({"log_info": True})


@pytest.mark.parametrize("path, settings, status, message", [
    ("/v2/logging", {"log_verbose_level": 1}, 501,
     "log setting 'log_verbose_level' cannot be changed: the log is fixed at start (SERVE_LOG_LEVEL)"),
    ("/v2/logging", {"log_info": "yes"}, 400, "log setting 'log_info' takes a boolean, or null"),
    ("/v2/trace/setting", {"trace_level": "OFF"}, 400, "trace setting 'trace_level' takes a list of strings, or null"),
    ("/v2/logging", {"log_infos": True}, 400,
     "unknown log setting 'log_infos'; the settings are log_file, log_info, log_warning, log_error, log_verbose_level, "
     "log_format"),
    ("/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}, 501, "trace setting 'trace_level' cannot be changed: this "
     "server traces no requests; its request log and /metrics say what each request did"),
    ("/v2/models/addsub/trace/setting", {"trace_file": "/tmp/trace.json"}, 501,
     "trace setting 'trace_file' cannot be changed: this server traces no requests; its request log and /metrics say "
     "what each request did"),
    ("/v2/models/nobody/trace/setting", {}, 404, "Request for unknown model: 'nobody' is not found"),
    ("/v2/trace/setting", [], 400, "the request body must be a JSON object"),
])
def test_a_log_or_trace_setting_that_would_change_is_refused(server, path, settings, status, message):
    response = server.request("POST", path, json=settings)
    assert (response.status_code, response.json()) == (status, {"error": message})


def test_a_gpu_instance_group_loads_and_says_where_it_runs(client, server):
    outputs = infer(client, "on_gpu", {"INPUT0": np.ones((1, 4), np.int32), "INPUT1": np.ones((1, 4), np.int32)})
    assert outputs["OUTPUT__0"].tolist() == [[2, 2, 2, 2]]
    entry = next(e for e in client.get_model_repository_index() if e["name"] == "on_gpu")
    assert entry["state"] == "READY"
    if torch.cuda.is_available():
        assert "reason" not in entry  # none, as Triton writes an empty one
    else:
        assert entry["reason"] == "instance_group asks for GPU(s) ['cuda:0']; this server has no GPU, so the model runs on CPU"


def test_the_same_worker_still_serves_after_every_refusal(client, server):
    """Runs last in this module: every 4xx above came from the worker that answers here."""
    assert server.worker_pid() == server.first_worker
    assert infer(client, "reshape", {"INPUT0": FOUR})["OUTPUT__0"].tolist() == [[10]]
    assert client.is_server_live() and client.is_server_ready()


class InferenceTensors(torch.nn.Module):
    """1 where what it computes is an inference tensor (run under torch.inference_mode), else 0."""

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return torch.full_like(INPUT0, float((INPUT0 * 2).is_inference()))


@pytest.mark.parametrize(("parameters", "expected"), [
    ({}, 1), ({"INFERENCE_MODE": "false"}, 0), ({"INFERENCE_MODE": "TRUE", "DISABLE_OPTIMIZED_EXECUTION": "true"}, 1),
])
def test_the_pytorch_backends_parameters_switch_inference_mode_as_triton_s_do(server, parameters, expected):
    name = f"switched_{len(parameters)}_{expected}"
    triton_model(server.model_root, name, InferenceTensors(), [tensor("INPUT0", "TYPE_FP32", [2])],
                 [tensor("OUTPUT0", "TYPE_FP32", [2])], max_batch_size=4,
                 parameters={key: {"string_value": value} for key, value in parameters.items()})
    assert requests.post(f"{server.url}/v2/repository/models/{name}/load", timeout=60).status_code == 200
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    answer = requests.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=60)
    assert answer.json()["outputs"][0]["data"] == [expected, expected]


def test_a_parameter_that_is_no_boolean_is_refused_at_load(server):
    triton_model(server.model_root, "switched_badly", InferenceTensors(), [tensor("INPUT0", "TYPE_FP32", [2])],
                 [tensor("OUTPUT0", "TYPE_FP32", [2])], parameters={"INFERENCE_MODE": {"string_value": "sometimes"}})
    answer = requests.post(f"{server.url}/v2/repository/models/switched_badly/load", timeout=60)
    assert answer.status_code == 400 and "parameter INFERENCE_MODE is 'sometimes'; it takes true or false" in answer.text
    assert requests.get(f"{server.url}/ping", timeout=60).status_code == 200
