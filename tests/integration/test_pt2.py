"""PyTorch 2's own model files against the real server: an AOTInductor package (`torch_aoti`, compiled
once for the module with the project's torch and the machine's C++ compiler) and ExportedPrograms
(`torch_export`), bound by position and by their call's structure, batched, on every protocol, in the
SageMaker layout, and refused with their reasons when they cannot be served."""

import io
import json
import os
import shutil
import signal
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests import grpc_clients
from tests.builders import aoti_package, wait_for
from tests.integration.test_s3 import s3, upload_directory  # noqa: F401 (a fixture this module uses too)

BATCH = torch.export.Dim("batch", min=1, max=64)
LENGTH = torch.export.Dim("length", min=1, max=16)


class Classifier(torch.nn.Module):
    """4 features in, 3 class scores out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.layer = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.softmax(self.layer(x), dim=-1)


class Accumulator(torch.nn.Module):
    """A sequence's running total, kept in Triton's implicit state: a value, the sequence's START flag and
    the state in; the total and the next state out."""

    def forward(self, value, start, state):
        total = torch.where(start > 0, torch.zeros_like(state), state) + value
        return total, total.clone()


class Blend(torch.nn.Module):
    """A call with structure: a tensor, a dict of tensors and a keyword argument in; a dict holding a
    tensor and a tuple out."""

    def forward(self, x, weights: dict, *, bias):
        mixed = x * weights["scale"] + bias
        return {"mixed": mixed, "parts": (x.sum(dim=1), bias * 2)}


class Masked(torch.nn.Module):
    """Values and their mask, one size tying their second dimensions: the masked sum of each row."""

    def forward(self, values, mask):
        return (values * mask).sum(dim=1)


def exported(module, args, kwargs=None, shapes=None):
    return torch.export.export(module.eval(), args, kwargs or {}, dynamic_shapes=shapes)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The .pt2 files the tests serve, made once: the AOTInductor package compiles in seconds."""
    directory = tmp_path_factory.mktemp("pt2")
    x = torch.ones(2, 4)
    classifier = exported(Classifier(), (x,), shapes={"x": {0: BATCH}})
    made = {"package": directory / "package.pt2", "program": directory / "program.pt2",
            "fixed": directory / "fixed.pt2", "blend": directory / "blend.pt2", "accumulator": directory / "accumulator.pt2",
            "masked": directory / "masked.pt2", "pairs": directory / "pairs.pt2"}
    aoti_package(classifier, made["package"])
    accumulator = exported(Accumulator(), (torch.ones(2, 1), torch.ones(2, 1, dtype=torch.int32), torch.zeros(2, 1)),
                           shapes={"value": {0: BATCH}, "start": {0: BATCH}, "state": {0: BATCH}})
    aoti_package(accumulator, made["accumulator"])
    torch.export.save(classifier, made["program"])
    torch.export.save(exported(Classifier(), (x,)), made["fixed"])
    torch.export.save(exported(Classifier(), (x,), shapes={"x": {0: torch.export.Dim("pairs", min=2, max=64)}}), made["pairs"])
    torch.export.save(exported(Masked(), (x, torch.ones(2, 4)), shapes={"values": {0: BATCH, 1: LENGTH},
                                                                         "mask": {0: BATCH, 1: LENGTH}}), made["masked"])
    torch.export.save(exported(Blend(), (x, {"scale": torch.full((4,), 2.0)}), {"bias": torch.ones(2, 4)},
                               shapes={"x": {0: BATCH}, "weights": {"scale": None}, "bias": {0: BATCH}}), made["blend"])
    return made


def triton_model(root: Path, name: str, file: Path, config: dict | None) -> Path:
    (root / name / "1").mkdir(parents=True)
    shutil.copy(file, root / name / "1" / "model.pt2")
    if config is not None:
        (root / name / "config.json").write_text(json.dumps({"name": name, **config}))
    return root / name


def classifier_config(platform: str, **more) -> dict:
    return {"platform": platform, "max_batch_size": 8,
            "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [3]}], **more}


def expected(rows: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return Classifier()(torch.from_numpy(rows)).numpy()


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory, files):
    root = tmp_path_factory.mktemp("models")
    triton_model(root, "aoti", files["package"], classifier_config("torch_aoti"))
    # a delay long enough that, on a loaded machine, clients answered during the warm-up are still expected
    # back when they send again (at 200 ms, a suite run in about ten ran each request alone); a wave of eight
    # fills its preferred batches long before it ends
    triton_model(root, "aoti_batched", files["package"], classifier_config(
        "torch_aoti", dynamic_batching={"max_queue_delay_microseconds": 2_000_000, "preferred_batch_size": [4]}))
    triton_model(root, "program", files["program"], classifier_config("torch_export"))
    triton_model(root, "bare", files["program"], None)
    triton_model(root, "masked", files["masked"], None)
    triton_model(root, "reshaped", files["program"], classifier_config("torch_export", input=[
        {"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [2, 2], "reshape": {"shape": [4]}}]))
    triton_model(root, "blend", files["blend"], {
        "platform": "torch_export", "max_batch_size": 0,
        "input": [{"name": "ARGS[0]", "data_type": "TYPE_FP32", "dims": [-1, 4]},
                  {"name": "ARGS[1][scale]", "data_type": "TYPE_FP32", "dims": [4]},
                  {"name": "KWARGS[bias]", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
        "output": [{"name": "RESULT[mixed]", "data_type": "TYPE_FP32", "dims": [-1, 4]},
                   {"name": "RESULT[parts][1]", "data_type": "TYPE_FP32", "dims": [-1, 4]}]})
    (root / "sagemaker").mkdir()
    shutil.copy(files["package"], root / "sagemaker" / "model.pt2")
    (root / "sagemaker_program").mkdir()
    shutil.copy(files["program"], root / "sagemaker_program" / "model.pt2")
    server = start_server(root, SERVE_HTTP_WORKERS="0")
    wait_for(server.grpc_ready, 60, "the gRPC front-end did not come up")
    return server


def ensure(server, name: str) -> None:
    """`name` loaded, by this test or one before it."""
    assert server.load(name).status_code in (200, 409)


def v2(server, name: str, inputs: dict) -> dict:
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": list(v.shape), "data": v.ravel().tolist()}
                       for n, v in inputs.items()]}
    answer = server.request("POST", f"/v2/models/{name}/infer", json=body)
    assert answer.status_code == 200, answer.text
    return {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in answer.json()["outputs"]}


ROWS = np.array([[1, 2, 3, 4], [0.5, 0, -1, 2]], np.float32)


@pytest.mark.parametrize("name", ["aoti", "program", "bare"])
def test_a_package_and_a_program_answer_over_v2_as_the_module_does(server, name):
    ensure(server, name)
    output = "OUTPUT__0"
    np.testing.assert_allclose(v2(server, name, {"INPUT__0": ROWS})[output], expected(ROWS), rtol=1e-5)


def test_a_config_left_out_is_completed_from_the_programs_record(server):
    ensure(server, "bare")
    config = server.request("GET", "/v2/models/bare/config").json()
    assert config["platform"] == "torch_export"
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"] + config["output"]] == [
        ("INPUT__0", "TYPE_FP32", [-1, 4]), ("OUTPUT__0", "TYPE_FP32", [-1, 3])]


def test_a_request_the_programs_shapes_refuse_is_a_400_saying_what_it_takes_and_others_are_served(server):
    """What the program was exported to take (a range for each dynamic size, one size tying two inputs)
    is checked before it runs, over every protocol, where its own guards failed as a 500."""
    ensure(server, "masked")
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    refused = {
        "the tie": ({"INPUT__0": values, "INPUT__1": np.ones((2, 2), np.float32)},
                    "input 'INPUT__1' has 2 in dimension 1 and input 'INPUT__0' has 3 in dimension 1; the model takes "
                    "the same size in both"),
        "the range": ({"INPUT__0": np.ones((1, 17), np.float32), "INPUT__1": np.ones((1, 17), np.float32)},
                      "input 'INPUT__0' has 17 in dimension 1; the model takes 1 to 16 there ([1 to 64, 1 to 16])"),
    }
    with grpc_clients.InferenceServerClient(f"localhost:{server.grpc_port}") as client:
        for inputs, words in refused.values():
            body = {"inputs": [{"name": n, "datatype": "FP32", "shape": list(v.shape), "data": v.ravel().tolist()}
                               for n, v in inputs.items()]}
            answer = server.request("POST", "/v2/models/masked/infer", json=body)
            assert answer.status_code == 400 and answer.json() == {"error": words}
            tensors = [grpcclient.InferInput(n, list(v.shape), "FP32") for n, v in inputs.items()]
            for tensor, value in zip(tensors, inputs.values(), strict=True):
                tensor.set_data_from_numpy(value)
            with pytest.raises(InferenceServerException) as raised:
                client.infer("masked", tensors, client_timeout=30)
            assert raised.value.status() == "StatusCode.INVALID_ARGUMENT" and words in raised.value.message()
    mask = np.array([[1, 0, 1], [0, 1, 1]], np.float32)
    np.testing.assert_allclose(v2(server, "masked", {"INPUT__0": values, "INPUT__1": mask})["OUTPUT__0"], [2, 9])


def test_a_config_reshape_is_what_the_program_sees(server):
    ensure(server, "reshaped")
    np.testing.assert_allclose(v2(server, "reshaped", {"INPUT__0": ROWS.reshape(2, 2, 2)})["OUTPUT__0"], expected(ROWS),
                               rtol=1e-5)


def test_tensors_bind_to_the_calls_structure_by_path(server):
    ensure(server, "blend")
    x, scale, bias = ROWS, np.array([1, 2, 3, 4], np.float32), np.ones((2, 4), np.float32)
    answer = v2(server, "blend", {"ARGS[0]": x, "ARGS[1][scale]": scale, "KWARGS[bias]": bias})
    np.testing.assert_allclose(answer["RESULT[mixed]"], x * scale + bias)
    np.testing.assert_allclose(answer["RESULT[parts][1]"], bias * 2)
    assert set(answer) == {"RESULT[mixed]", "RESULT[parts][1]"}  # an output the config leaves out is not sent


def test_the_package_answers_grpc_invoke_and_tf_serving_alike(server):
    ensure(server, "aoti")
    want = expected(ROWS)
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT__0", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS)
        np.testing.assert_allclose(client.infer("aoti", [tensor]).as_numpy("OUTPUT__0"), want, rtol=1e-5)
    invoked = server.invoke("aoti", ROWS.tolist())
    assert invoked.status_code == 200, invoked.text
    np.testing.assert_allclose(np.array(invoked.json(), np.float32), want, rtol=1e-5)
    predicted = server.request("POST", "/v1/models/aoti:predict", json={"instances": ROWS.tolist()})
    np.testing.assert_allclose(np.array(predicted.json()["predictions"], np.float32), want, rtol=1e-5)


def test_concurrent_requests_to_a_package_form_batches(server):
    """Eight clients on connections the server has answered before: the batcher expects each back, so
    their requests, sent together, wait for one another (a lone request, or one on a connection the
    server has never answered, runs at once)."""
    ensure(server, "aoti_batched")
    rows = [np.full((1, 4), n, np.float32) for n in range(8)]

    def counts() -> tuple[int, int]:
        counted = server.request("GET", "/v2/models/aoti_batched/stats").json()["model_stats"][0]
        return counted["inference_count"], counted["execution_count"]

    before = []
    together = threading.Barrier(len(rows), action=lambda: before.append(counts()), timeout=60)

    def client(row: np.ndarray) -> np.ndarray:
        with requests.Session() as session:
            body = {"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [1, 4], "data": row.ravel().tolist()}]}
            url = f"{server.url}/v2/models/aoti_batched/infer"
            for _ in range(2):  # a connection that came back once is one the batcher expects back (base.py)
                assert session.post(url, json=body, timeout=60).status_code == 200
            together.wait()  # every warm-up answered, and counted
            answer = session.post(url, json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            return np.array(answer.json()["outputs"][0]["data"], np.float32).reshape(1, 3)

    with ThreadPoolExecutor(len(rows)) as pool:
        answers = list(pool.map(client, rows, timeout=120))
    for row, answer in zip(rows, answers, strict=True):
        np.testing.assert_allclose(answer, expected(row), rtol=1e-5)
    inferences, executions = (after - start for after, start in zip(counts(), before[0], strict=True))
    assert inferences == 8 and executions < 8


def test_a_sagemaker_directory_with_model_pt2_is_served_by_the_default_model_fn(server):
    ensure(server, "sagemaker")
    answer = server.invoke("sagemaker", ROWS.tolist())
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(np.array(answer.json(), np.float32), expected(ROWS), rtol=1e-5)


def test_the_default_model_fn_s_program_refuses_a_shape_it_does_not_take_as_a_400(server):
    ensure(server, "sagemaker_program")
    refusals = {"[[1, 2, 3]]": "input 'ARGS[0]' has 3 in dimension 1; the model takes 4 there ([1 to 64, 4])",
                "[1, 2, 3, 4]": "input 'ARGS[0]' has 1 dimensions; the model takes [1 to 64, 4]"}
    for body, words in refusals.items():
        answer = server.invoke("sagemaker_program", json.loads(body))
        assert answer.status_code == 400 and words in answer.json()["error"], answer.text
    answer = server.invoke("sagemaker_program", ROWS.tolist())
    np.testing.assert_allclose(np.array(answer.json(), np.float32), expected(ROWS), rtol=1e-5)


def test_a_package_is_charged_unloaded_and_loaded_again(server):
    ensure(server, "aoti")
    charged = server.metrics()[("serve_model_memory_bytes", (("device", "cpu"), ("model", "aoti")))]
    assert charged > 0
    assert server.request("DELETE", "/models/aoti").status_code == 200
    assert server.request("POST", "/v2/models/aoti/infer", json={"inputs": []}).status_code == 404
    assert server.load("aoti").status_code == 200
    np.testing.assert_allclose(v2(server, "aoti", {"INPUT__0": ROWS})["OUTPUT__0"], expected(ROWS), rtol=1e-5)


def test_a_loaded_package_leaves_nothing_in_the_temporary_directory_even_when_its_server_is_killed(
        start_server, tmp_path_factory, files):
    """torch's loader extracts a package under the temporary directory and removes it only once the
    loader is freed: a killed server would leave every loaded package's files behind. Packages keep
    their files under the name they were written as (`package/…`, `accumulator/…`), whatever the
    model's file is called."""
    root, scratch = tmp_path_factory.mktemp("models"), tmp_path_factory.mktemp("t")
    triton_model(root, "aoti", files["package"], classifier_config("torch_aoti"))
    triton_model(root, "running_total", files["accumulator"], RUNNING_TOTAL)
    server = start_server(root, SERVE_HTTP_WORKERS="0", SERVE_GRPC_PORT="off", TMPDIR=str(scratch))
    for _ in range(2):
        for name in ("aoti", "running_total"):
            assert server.load(name).status_code == 200
        np.testing.assert_allclose(v2(server, "aoti", {"INPUT__0": ROWS})["OUTPUT__0"], expected(ROWS), rtol=1e-5)
        assert list(scratch.glob("aotinductor_*")) == []
        for name in ("aoti", "running_total"):
            assert server.request("DELETE", f"/models/{name}").status_code == 200
    assert server.load("aoti").status_code == 200
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(30)
    assert list(scratch.glob("aotinductor_*")) == []


# -- what cannot be served -------------------------------------------------------------------------------


def rewritten(source: Path, target: Path, change) -> Path:
    """A copy of the archive `source` whose members `change(name, data)` rewrites (None drops one)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            data = change(info.filename, old.read(info.filename))
            if data is not None:
                new.writestr(info.filename, data)
    return target


def other_torch(name: str, data: bytes) -> bytes:
    if name.endswith(".json") and "/models/" in name:
        document = json.loads(data)
        document["torch_version"] = "2.6.0+cpu"
        return json.dumps(document).encode()
    return data


def built_on(**recorded):
    """A rewrite that makes a package claim it was compiled on another machine."""
    def change(name: str, data: bytes) -> bytes:
        if name.endswith("_metadata.json") and "/data/aotinductor/" in name:
            return json.dumps({**json.loads(data), **recorded}).encode()
        return data
    return change


@pytest.fixture(scope="module")
def refusals(start_server, tmp_path_factory, files):
    root = tmp_path_factory.mktemp("refused")
    scratch = tmp_path_factory.mktemp("scratch")
    data = files["program"].read_bytes()
    cases = {
        "corrupt": (scratch / "corrupt.pt2", "torch_export"),
        "truncated": (scratch / "truncated.pt2", "torch_export"),
        "old_torch": (rewritten(files["program"], scratch / "old.pt2", other_torch), "torch_export"),
        "not_a_package": (files["program"], "torch_aoti"),
        "escapes": (scratch / "escapes.pt2", "torch_export"),
        "fixed_batch": (files["fixed"], "torch_export"),
        "other_machine": (rewritten(files["package"], scratch / "arm.pt2", built_on(AOTI_MACHINE="aarch64")), "torch_aoti"),
        "other_cpu": (rewritten(files["package"], scratch / "avx10.pt2", built_on(AOTI_CPU_ISA="AVX10_2")),
                      "torch_aoti"),
    }
    (scratch / "corrupt.pt2").write_bytes(b"not a zip at all" * 64)
    (scratch / "truncated.pt2").write_bytes(data[: len(data) // 2])
    escaping = io.BytesIO()
    with zipfile.ZipFile(files["program"]) as old, zipfile.ZipFile(escaping, "w") as new:
        for info in old.infolist():
            new.writestr(info.filename, old.read(info.filename))
        new.writestr("program/../../outside.txt", b"x")
    (scratch / "escapes.pt2").write_bytes(escaping.getvalue())
    for name, (file, platform) in cases.items():
        triton_model(root, name, file, classifier_config(platform))
    triton_model(root, "wrong_type", files["program"], classifier_config("torch_export", input=[
        {"name": "INPUT__0", "data_type": "TYPE_INT32", "dims": [4]}]))
    triton_model(root, "wrong_package_type", files["package"], classifier_config("torch_aoti", input=[
        {"name": "INPUT__0", "data_type": "TYPE_INT64", "dims": [4]}]))
    triton_model(root, "wrong_names", files["program"], classifier_config("torch_export", input=[
        {"name": "features", "data_type": "TYPE_FP32", "dims": [4]}]))
    triton_model(root, "wrong_dims", files["program"], classifier_config("torch_export", input=[
        {"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [2, 4]}]))
    triton_model(root, "wrong_output", files["program"], classifier_config("torch_export", output=[
        {"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [7]}]))
    triton_model(root, "too_many_rows", files["program"], classifier_config("torch_export", max_batch_size=128))
    triton_model(root, "two_rows_at_least", files["pairs"], classifier_config("torch_export"))
    triton_model(root, "wrong_package_output", files["package"], classifier_config("torch_aoti", output=[
        {"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [7]}]))
    return start_server(root, SERVE_HTTP_WORKERS="0")


@pytest.mark.parametrize("name, words", [
    ("corrupt", "1/model.pt2 is not a .pt2 archive"),
    ("truncated", "1/model.pt2 is not a .pt2 archive"),
    ("old_torch", "was exported by torch 2.6.0+cpu; this server runs torch"),
    ("not_a_package", "is an ExportedProgram without AOTInductor data: serve it with platform 'torch_export'"),
    ("escapes", "escapes the archive's directory"),
    ("fixed_batch", "was exported for a fixed number of rows, so max_batch_size 8 cannot batch it: export it with a "
                    "dynamic first dimension"),
    ("other_machine", "1/model.pt2 was compiled on aarch64; this server runs on x86_64"),
    ("other_cpu", "1/model.pt2 was compiled for a CPU with avx10_2, which this server's CPU lacks"),
    ("wrong_type", "input 'INPUT__0' is INT32 in the config; the program's ARGS[0] is FP32"),
    ("wrong_package_type", "does not run on the config's tensors"),
    ("wrong_names", "do not name the program's: INPUT__0 (ARGS[0]: FP32 [-1, 4])"),
    ("wrong_dims", "input 'INPUT__0' is [-1, 2, 4] in the config (as the model sees it, its batch dimension first where "
                   "it batches); the program's ARGS[0] is [1 to 64, 4]"),
    ("wrong_output", "output 'OUTPUT__0' is [-1, 7] in the config (as the model sees it, its batch dimension first "
                     "where it batches); the program's RESULT is [1 to 64, 3]"),
    ("too_many_rows", "input 'INPUT__0' (ARGS[0]) was exported for at most 64 rows: set max_batch_size to 64 or less"),
    ("wrong_package_output", "output 'OUTPUT__0' is [-1, 7] in the config; on the config's tensors, zeros, the package "
                             "returned [1, 3] there"),
    ("two_rows_at_least", "input 'INPUT__0' (ARGS[0]) was exported for at least 2 rows, so a request of one row could "
                          "not run: export it with Dim('batch', min=1)"),
])
def test_what_cannot_be_served_is_a_400_with_its_reason_and_leaves_nothing(refusals, name, words):
    answer = refusals.load(name)
    assert answer.status_code == 400 and words in answer.json()["error"], answer.text
    assert name not in refusals.loaded()
    assert refusals.request("GET", "/ping").status_code == 200


def test_a_pt2_from_a_client_is_refused_unless_model_files_are_allowed(server, files):
    import base64

    body = {"parameters": {"config": json.dumps(classifier_config("torch_aoti")),
                           "file:1/model.pt2": base64.b64encode(files["package"].read_bytes()).decode()}}
    answer = server.request("POST", "/v2/repository/models/uploaded/load", json=body)
    assert answer.status_code == 403 and "SERVE_ALLOW_MODEL_FILES" in answer.json()["error"]


# -- on the GPU --------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_a_package_compiled_for_cuda_runs_on_the_gpu_its_group_names_and_a_cpu_one_is_refused_there(
        start_server, tmp_path, files):
    package = tmp_path / "cuda.pt2"
    module = Classifier().cuda()
    program = exported(module, (torch.ones(2, 4, device="cuda"),), shapes={"x": {0: BATCH}})
    aoti_package(program, package)
    on_gpu = {"instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}]}
    triton_model(tmp_path / "models", "cuda", package, classifier_config("torch_aoti", **on_gpu))
    triton_model(tmp_path / "models", "cpu_on_gpu", files["package"], classifier_config("torch_aoti", **on_gpu))
    triton_model(tmp_path / "models", "cuda_on_cpu", package, classifier_config(
        "torch_aoti", instance_group=[{"kind": "KIND_CPU", "count": 1}]))
    server = start_server(tmp_path / "models", SERVE_HTTP_WORKERS="0")
    assert server.load("cuda").status_code == 200
    np.testing.assert_allclose(v2(server, "cuda", {"INPUT__0": ROWS})["OUTPUT__0"], expected(ROWS), rtol=1e-4)
    charged = server.metrics()[("serve_model_memory_bytes", (("device", "cuda:0"), ("model", "cuda")))]
    assert charged > 0
    refused = server.load("cpu_on_gpu")
    assert refused.status_code == 400 and "was compiled for cpu; its instance group places it on cuda:0" in refused.text
    refused = server.load("cuda_on_cpu")
    assert refused.status_code == 400 and "was compiled for cuda; its instance group places it on cpu" in refused.text


def test_a_load_whose_config_override_leaves_the_tensors_out_is_completed_from_the_program(server):
    answer = server.request("POST", "/v2/repository/models/program/load",
                            json={"parameters": {"config": json.dumps({"max_batch_size": 8})}})
    assert answer.status_code == 200, answer.text
    config = server.request("GET", "/v2/models/program/config").json()
    assert (config["platform"], config["max_batch_size"]) == ("torch_export", 8)
    assert [(t["name"], t["dims"]) for t in config["input"] + config["output"]] == [("INPUT__0", [4]), ("OUTPUT__0", [3])]
    np.testing.assert_allclose(v2(server, "program", {"INPUT__0": ROWS})["OUTPUT__0"], expected(ROWS), rtol=1e-5)


# -- what a TorchScript model has, a package has too --------------------------------------------------


SEQUENCE = {
    "max_sequence_idle_microseconds": 60_000_000,
    "control_input": [{"name": "INPUT__1", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}],
    "state": [{"input_name": "INPUT__2", "output_name": "OUTPUT__1", "data_type": "TYPE_FP32", "dims": [1],
               "initial_state": [{"data_type": "TYPE_FP32", "dims": [1], "zero_data": True, "name": "zeros"}]}]}
RUNNING_TOTAL = {"platform": "torch_aoti", "max_batch_size": 8, "sequence_batching": SEQUENCE,
                 "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [1]}],
                 "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [1]}]}


@pytest.fixture(scope="module")
def policies(start_server, tmp_path_factory, files):
    """A package under two served versions (of three on disk), priorities and a warmup; the
    accumulator under the sequence batcher; a package with a warmup it cannot run."""
    root = tmp_path_factory.mktemp("policies")
    warmup = [{"name": "two rows of zeros", "batch_size": 2,
               "inputs": {"INPUT__0": {"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}}}]
    model = triton_model(root, "versions", files["package"], classifier_config(
        "torch_aoti", version_policy={"specific": {"versions": [1, 2]}}, model_warmup=warmup,
        dynamic_batching={"priority_levels": 2, "default_priority_level": 2}))
    for version in ("2", "3"):
        (model / version).mkdir()
        shutil.copy(files["package"], model / version / "model.pt2")
    triton_model(root, "bad_warmup", files["package"], classifier_config("torch_aoti", model_warmup=[
        {"name": "five features", "batch_size": 1, "inputs": {"INPUT__0": {"data_type": "TYPE_FP32", "dims": [5],
                                                                           "zero_data": True}}}]))
    triton_model(root, "running_total", files["accumulator"], RUNNING_TOTAL)
    return start_server(root, SERVE_HTTP_WORKERS="0", SERVE_ALLOW_CLIENT_SHM="true")


def test_version_policies_priorities_and_warmup_apply_to_a_package(policies):
    assert policies.load("versions").status_code == 200
    served = policies.request("GET", "/v2/models/versions/stats").json()["model_stats"]
    assert sorted(entry["version"] for entry in served) == ["1", "2"]
    body = {"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [2, 4], "data": ROWS.ravel().tolist()}]}
    for version, priority in (("1", 1), ("2", 2)):
        answer = policies.request("POST", f"/v2/models/versions/versions/{version}/infer",
                                  json={**body, "parameters": {"priority": priority}})
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(np.array(answer.json()["outputs"][0]["data"]).reshape(2, 3), expected(ROWS), rtol=1e-5)
    assert policies.request("POST", "/v2/models/versions/versions/3/infer", json=body).status_code == 404
    past = policies.request("POST", "/v2/models/versions/infer", json={**body, "parameters": {"priority": 3}})
    assert past.status_code == 200, past.text  # past the levels: the default level, as on Triton


def test_a_warmup_the_package_cannot_run_fails_its_load(policies):
    answer = policies.load("bad_warmup")
    assert answer.status_code == 400 and "five features" in answer.json()["error"], answer.text
    assert "bad_warmup" not in policies.loaded()


def test_sequences_keep_their_own_state_in_a_package_side_by_side(policies):
    """Two sequences at once: each total is its own, however the batcher groups their steps."""
    loaded = policies.load("running_total")
    assert loaded.status_code == 200, loaded.text

    def run(sequence_id: int) -> list[float]:
        totals = []
        for step, value in enumerate([1.0, 2.0, 3.0, 4.0]):
            parameters = {"sequence_id": sequence_id, "sequence_start": step == 0, "sequence_end": step == 3}
            answer = policies.request("POST", "/v2/models/running_total/infer", json={"parameters": parameters, "inputs": [
                {"name": "INPUT__0", "datatype": "FP32", "shape": [1, 1], "data": [value * sequence_id]}]})
            assert answer.status_code == 200, answer.text
            totals.append(answer.json()["outputs"][0]["data"][0])
        return totals

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(run, (1, 10), timeout=60)
    assert (first, second) == ([1.0, 3.0, 6.0, 10.0], [10.0, 30.0, 60.0, 100.0])


def test_shared_memory_carries_a_packages_tensors(policies):
    import tritonclient.http as http
    import tritonclient.utils.shared_memory as shm

    assert policies.load("versions").status_code in (200, 409)
    size = ROWS.nbytes
    handle = shm.create_shared_memory_region("rows", f"/pt2_rows_{policies.port}", size)
    try:
        shm.set_shared_memory_region(handle, [ROWS])
        with http.InferenceServerClient(policies.url.removeprefix("http://"), network_timeout=60) as client:
            client.register_system_shared_memory("rows", f"/pt2_rows_{policies.port}", size)
            tensor = http.InferInput("INPUT__0", list(ROWS.shape), "FP32")
            tensor.set_shared_memory("rows", size)
            np.testing.assert_allclose(client.infer("versions", [tensor]).as_numpy("OUTPUT__0"), expected(ROWS), rtol=1e-5)
            client.unregister_system_shared_memory("rows")
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_package_loads_from_s3(start_server, s3, files, tmp_path):  # noqa: F811 (the fixture imported above)
    model = triton_model(tmp_path / "upload", "from_s3", files["package"], classifier_config("torch_aoti"))
    upload_directory(s3.client, model, "pt2/from_s3")
    server = start_server(tmp_path / "local", **s3.env())
    answer = server.load("from_s3", "s3://models/pt2/from_s3")
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(v2(server, "from_s3", {"INPUT__0": ROWS})["OUTPUT__0"], expected(ROWS), rtol=1e-5)
