"""Models written for SageMaker's PyTorch container answer here as they do there: the toolkit's defaults,
its loading rules, its hooks and context, its packages, and one worker process per model."""

import io
import json
import os
import signal
import textwrap
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.builders import Scale, defined, exited, handler_model, wait_for

MNIST_LIKE = """
import os
import torch
from net import Net  # code/net.py, as the toolkit's MNIST example keeps it

def model_fn(model_dir):
    model = Net()
    with open(os.path.join(model_dir, "model.pth"), "rb") as f:
        model.load_state_dict(torch.load(f))
    return model  # in training mode: the default predict_fn must switch it to eval
"""

NET = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.drop = torch.nn.Dropout(0.5)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        return torch.log_softmax(self.fc2(self.drop(torch.relu(self.norm(self.fc1(x))))), dim=1)
"""

IN_PLACE_OUTPUT = """
import json

def output_fn(prediction, accept):
    prediction += 1  # in place: fails on an inference-mode tensor
    return json.dumps(prediction.tolist())
"""

RETURNS = """
import numpy as np
import torch

def predict_fn(data, model):
    kind = int(data.flatten()[0])
    return [[1.5, 2.5]] if kind == 0 else np.array([[1, 2], [3, 4]], dtype=np.int16)
"""

OUTPUT_DICT = """
def output_fn(prediction, accept):
    return {"sum": float(prediction.sum()), "accept": accept}
"""

RAW = """
import numpy as np

def transform_fn(model, body, content_type, accept):
    if not isinstance(body, str):
        np.frombuffer(body, np.uint8)[:1] ^= 0xFF  # where it lies, as a bytearray allows
    return f"{type(body).__name__}:{len(body)}:{body[:1]!r}:{content_type}:{accept}"
"""

CONTEXT = """
import torch

def model_fn(model_dir, context):
    assert context.system_properties["model_dir"] == model_dir
    return torch.jit.load(model_dir + "/model.pt")

def input_fn(body, content_type, context):
    return torch.tensor([float(context.get_request_header(0, "X-Scale"))])

def predict_fn(data, model, context):
    return model(data)

def output_fn(prediction, accept, context):
    context.set_response_header(0, "X-Model", context.model_name)
    context.set_response_header(0, "X-Properties", ",".join(sorted(context.system_properties)))
    return str(prediction.item())
"""

HOOKS = """
import os
import torch

EVENTS = []

def pre_model_fn(model_dir):
    EVENTS.append("pre")

def model_fn(model_dir):
    EVENTS.append("model")
    return torch.jit.load(os.path.join(model_dir, "model.pt"))

def model_warmup_fn(model_dir, model):
    EVENTS.append("warmup:" + str(model(torch.ones(1)).item()))

def transform_fn(model, body, content_type, accept):
    return ",".join(EVENTS)
"""

LAZY_AND_RELATIVE = """
import os

def model_fn(model_dir):
    with open("labels.txt") as f:  # relative to the model directory, the worker's cwd
        return {"labels": f.read().split(), "cwd": os.getcwd()}

def predict_fn(data, model):
    import late_helper  # code/ stays importable after the load
    return {"labels": model["labels"], "cwd": model["cwd"], "late": late_helper.VALUE}

def input_fn(body, content_type):
    return body
"""

PICKLED = """
import os
import torch

def model_fn(model_dir):
    return torch.load(os.path.join(model_dir, "whole.pth"), weights_only=False)  # its class is in code/layers.py
"""

TOOLKIT = """
import json
import PIL
import six
from sagemaker_inference import content_types, decoder, encoder, errors

def input_fn(body, content_type):
    if content_type != content_types.JSON:
        raise errors.GenericInferenceToolkitError(400, "send application/json, not " + str(content_type))
    return decoder.decode(body, content_type)

def predict_fn(data, model):
    return data * 2

def output_fn(prediction, accept):
    return encoder.encode(prediction, accept), accept
"""

CRASHES = """
import ctypes
import os

def transform_fn(model, body, content_type, accept):
    if body == b"segfault":
        ctypes.string_at(0)
    if body == b"exit":
        os._exit(3)
    return str(os.getpid())
"""

PID = """
import os
import numpy as np

def model_fn(model_dir):
    return np.ones(64 << 20, dtype=np.uint8)  # 64 MiB the worker really touches

def transform_fn(model, body, content_type, accept):
    return str(os.getpid())
"""

REQUIRES = """
import tinypkg

def transform_fn(model, body, content_type, accept):
    return tinypkg.GREETING
"""

PROGRAM = """
def transform_fn(model, body, content_type, accept):
    return "predict.py:" + accept
"""


class Infinite(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / 0


def tiny_wheel(directory: Path) -> Path:
    """A one-module wheel built by hand, so requirements.txt installs without an index."""
    path = directory / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("tinypkg.py", "GREETING = 'hello from requirements.txt'\n")
        wheel.writestr("tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
        wheel.writestr("tinypkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr("tinypkg-1.0.dist-info/RECORD", "")
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def mnist(root):
    torch.manual_seed(0)
    net = defined(NET, "Net")()
    directory = handler_model(root, "mnist", MNIST_LIKE)
    (directory / "code" / "net.py").write_text(textwrap.dedent(NET))
    torch.save(net.state_dict(), directory / "model.pth")
    return net.eval()


@pytest.fixture(scope="module")
def server(start_server, root, mnist, tmp_path_factory):
    handler_model(root, "inplace", IN_PLACE_OUTPUT, Scale())
    handler_model(root, "defaults", None, Scale())
    handler_model(root, "infinite", None, Infinite())
    handler_model(root, "returns", RETURNS, Scale())
    handler_model(root, "dict", OUTPUT_DICT, Scale())
    handler_model(root, "raw", RAW, Scale())
    handler_model(root, "context", CONTEXT, Scale())
    handler_model(root, "hooks", HOOKS, Scale(3.0))
    handler_model(root, "toolkit", TOOLKIT, Scale())
    handler_model(root, "crashes", CRASHES, Scale())
    handler_model(root, "pid", PID)
    lazy = handler_model(root, "lazy", LAZY_AND_RELATIVE)
    (lazy / "labels.txt").write_text("cat dog")
    (lazy / "code" / "late_helper.py").write_text("VALUE = 42\n")
    any_name = root / "anyname"
    any_name.mkdir()
    torch.jit.script(Scale(5.0)).save(str(any_name / "resnet_final.pth"))
    own_config = handler_model(root, "ownconfig", None, Scale())
    (own_config / "config.json").write_text('{"hidden_size": 768, "labels": ["a", "b"]}')
    handler_model(root, "pickled", PICKLED)
    requires = handler_model(root, "requires", REQUIRES, Scale())
    wheel = tiny_wheel(tmp_path_factory.mktemp("wheels"))
    (requires / "code" / "requirements.txt").write_text(f"{wheel}\n")
    broken = handler_model(root, "brokenreqs", REQUIRES, Scale())
    (broken / "code" / "requirements.txt").write_text(f"{wheel.parent / 'missing-1.0-py3-none-any.whl'}\n")
    stalls = handler_model(root, "stalls", REQUIRES, Scale())  # pip waits on a pipe nobody writes to
    os.mkfifo(fifo := tmp_path_factory.mktemp("fifo") / "more.txt")
    (stalls / "code" / "requirements.txt").write_text(f"-r {fifo}\n")
    server = start_server(root, SERVE_REQUIREMENTS_CACHE=str(cache := tmp_path_factory.mktemp("reqcache")))
    server.wheel, server.requirements_cache = wheel, cache
    loaded(server, "mnist", "inplace", "defaults", "infinite", "returns", "dict", "raw", "context", "hooks", "toolkit",
           "crashes", "pid", "lazy", "anyname", "ownconfig", "requires")
    return server


def post(server, name, body, content_type="application/json", accept=None, **headers):
    headers = headers | ({"Content-Type": content_type} if content_type else {}) | ({"Accept": accept} if accept else {})
    return server.request("POST", f"/models/{name}/invoke", data=body, headers=headers)


def loaded(server, *names):
    for name in names:
        answer = server.load(name)
        assert answer.status_code == 200, answer.text


def test_default_predict_runs_eval_mode_without_grad(server, mnist):
    x = [[0.1, 0.2, 0.3, 0.4]]  # a batch of one: BatchNorm in training mode would refuse it
    first, second = post(server, "mnist", json.dumps(x)), post(server, "mnist", json.dumps(x))
    assert first.status_code == 200, first.text
    assert first.json() == second.json()  # dropout is off
    np.testing.assert_allclose(first.json(), mnist(torch.tensor(x)).detach().numpy(), rtol=1e-6)


def test_output_fn_may_change_the_prediction_in_place(server):
    answer = post(server, "inplace", b"[1.0, 2.0]")
    assert answer.status_code == 200 and answer.json() == [3.0, 5.0]


def test_csv_one_row_is_a_vector_and_a_vector_is_one_value_per_line(server):
    answer = post(server, "defaults", b"1,2,3", "text/csv", accept="text/csv")
    assert answer.status_code == 200 and answer.text == "2.0\n4.0\n6.0\n"


@pytest.mark.parametrize("body, says", [
    (b"a,b,c\n1,2,3", "CSV row 1, column 1: 'a' is not a number"),  # a header row
    (b"1,2,3\n4,five,6", "CSV row 2, column 2: 'five' is not a number"),
    (b"1,,3", "CSV row 1, column 2: '' is not a number"),
])
def test_csv_that_is_not_numbers_is_a_400_naming_the_cell(server, body, says):
    answer = post(server, "defaults", body, "text/csv")  # the toolkit's default input_fn predicted on NaN
    assert answer.status_code == 400 and says in answer.json()["error"], answer.text
    assert post(server, "defaults", b"1,nan,3", "text/csv", accept="text/csv").text == "2.0\nnan\n6.0\n"  # NaN written out is a number


def test_non_finite_values_are_written_as_python_writes_them(server):
    answer = post(server, "infinite", b"[1.0, -1.0, 0.0]")
    assert answer.text == "[Infinity, -Infinity, NaN]"


@pytest.mark.parametrize("kind, accept, expected", [
    (0, "text/csv", "1.5,2.5\n"),
    (1, "text/csv", "1,2\n3,4\n"),
    (0, "application/json", "[[1.5, 2.5]]"),
])
def test_predict_fn_may_return_lists_and_arrays(server, kind, accept, expected):
    answer = post(server, "returns", f"[{kind}]", accept=accept)
    assert answer.status_code == 200 and answer.text == expected and answer.headers["Content-Type"] == accept


def test_npy_answers_keep_the_prediction_dtype(server):
    answer = post(server, "returns", b"[1]", accept="application/x-npy")
    array = np.load(io.BytesIO(answer.content))
    assert array.dtype == np.int16 and array.tolist() == [[1, 2], [3, 4]]


def test_output_fn_returning_a_dict_is_json(server):
    answer = post(server, "dict", b"[1.0, 2.0]", accept="application/json")
    assert answer.status_code == 200 and answer.json() == {"sum": 6.0, "accept": "application/json"}


# What SageMaker's PyTorch container hands a script, measured there (TorchServe 0.12.0 with
# sagemaker-pytorch-inference 2.0.25's handler service): the toolkit decodes JSON and CSV to text, and
# TorchServe's worker reads any other body, or one without a Content-Type, as a bytearray.
@pytest.mark.parametrize("content_type, given", [
    (None, "bytearray:6:bytearray(b'\\xa4'):None"),
    ("application/octet-stream", "bytearray:6:bytearray(b'\\xa4'):application/octet-stream"),
    ("image/png", "bytearray:6:bytearray(b'\\xa4'):image/png"),
    ("text/plain", "bytearray:6:bytearray(b'\\xa4'):text/plain"),
    ("application/json", "str:6:'[':application/json"),
    ("text/csv", "str:6:'[':text/csv"),
])
def test_user_code_gets_the_body_as_sagemakers_container_hands_it(server, content_type, given):
    answer = post(server, "raw", b"[1, 2]", content_type=content_type)
    assert answer.status_code == 200 and answer.text == f"{given}:application/json", answer.text


@pytest.mark.parametrize("accept, expected", [
    ("text/csv;q=0.5, application/json", "application/json"),
    ("*/*, text/csv", "text/csv"),
    ("application/json;q=0, text/csv;q=0.1", "text/csv"),
    ("*/*", "application/json"),
])
def test_accept_quality_values_choose_the_type(server, accept, expected):
    assert post(server, "raw", b"x", "application/octet-stream", accept=accept).text.endswith(":" + expected)
    answer = post(server, "defaults", b"[1]", accept=accept)
    assert answer.status_code == 200 and answer.headers["Content-Type"] == expected


def test_a_lone_weights_file_of_any_name_loads(server):
    assert post(server, "anyname", b"[1.0]").json() == [5.0]


def test_a_config_json_of_the_models_own_does_not_make_it_triton(server):
    assert post(server, "ownconfig", b"[1.0]").json() == [2.0]


def test_handlers_that_take_the_context(server):
    answer = post(server, "context", b"", content_type=None, **{"X-Scale": "4"})
    assert answer.status_code == 200 and answer.text == "8.0" and answer.headers["X-Model"] == "context"
    # the keys TorchServe 0.12.0 gives SageMaker's handler service
    assert answer.headers["X-Properties"] == "batch_size,gpu_id,limit_max_image_pixels,model_dir,server_name,server_version"


def test_pre_model_and_warmup_hooks_run_around_model_fn(server):
    assert post(server, "hooks", b"x").text == "pre,model,warmup:3.0"


def test_cwd_is_the_model_directory_and_code_stays_importable(server, root):
    answer = post(server, "lazy", b"x", "application/octet-stream")
    assert answer.json() == {"labels": ["cat", "dog"], "cwd": str((root / "lazy").resolve()), "late": 42}


def test_a_pickled_module_whose_class_lives_in_code(server, root, monkeypatch):
    code = root / "pickled" / "code"
    (code / "layers.py").write_text("import torch\nclass Triple(torch.nn.Module):\n    def forward(self, x):\n        return x * 3\n")
    monkeypatch.syspath_prepend(str(code))
    import layers

    torch.save(layers.Triple(), root / "pickled" / "whole.pth")
    loaded(server, "pickled")
    assert post(server, "pickled", b"[1.0]").json() == [3.0]


def test_scripts_use_the_packages_of_sagemakers_image(server):
    answer = post(server, "toolkit", b"[1, 2]", accept="text/csv")
    assert answer.status_code == 200 and answer.text.split() == ["2", "4"]
    refused = post(server, "toolkit", b"1,2", "text/csv")
    assert refused.status_code == 400 and refused.json() == {"error": "send application/json, not text/csv"}


@pytest.mark.parametrize("body, death", [(b"segfault", "killed by SIGSEGV"), (b"exit", "exited with code 3")])
def test_a_crashing_handler_fails_alone_and_comes_back(server, body, death):
    pid = post(server, "crashes", b"pid", "text/plain").text
    answer = post(server, "crashes", body, "text/plain")
    assert answer.status_code == 500 and death in answer.json()["error"]
    assert server.request("GET", "/ping").status_code == 200
    assert post(server, "defaults", b"[1]").json() == [2.0]
    restarted = post(server, "crashes", b"pid", "text/plain")
    assert restarted.status_code == 200 and restarted.text != pid


def test_worker_memory_is_accounted_and_unload_ends_the_worker(server):
    pid = int(post(server, "pid", b"x", "text/plain").text)
    metrics = server.request("GET", "/metrics").text
    line = next(m for m in metrics.splitlines() if m.startswith('serve_model_memory_bytes{device="cpu",model="pid"}'))
    assert float(line.split()[-1]) >= 64 << 20
    assert server.request("DELETE", "/models/pid").status_code == 200
    wait_for(lambda: exited(pid), 10, "the worker outlived its model")


def test_requirements_install_into_the_models_own_directory_and_are_cached(server):
    assert post(server, "requires", b"x", "text/plain").text == "hello from requirements.txt"
    assert server.request("DELETE", "/models/requires").status_code == 200
    os.rename(server.wheel, server.wheel.with_suffix(".gone"))  # a reload must not need pip again
    try:
        loaded(server, "requires")
    finally:
        os.rename(server.wheel.with_suffix(".gone"), server.wheel)
    assert post(server, "requires", b"x", "text/plain").text == "hello from requirements.txt"
    with pytest.raises(ImportError):
        import tinypkg  # noqa: F401  (never installed where the tests or the server run)


def test_requirements_that_fail_are_a_400_naming_the_failing_line(server):
    answer = server.load("brokenreqs")
    assert answer.status_code == 400
    assert "requirements.txt did not install" in answer.json()["error"] and "line 1: '" in answer.json()["error"]
    assert "missing-1.0" in answer.json()["error"]  # the line as the file has it; pip's own words stay in the log


def test_an_install_its_worker_did_not_live_to_finish_leaves_nothing_running_or_on_disk(server):
    """pip runs in the model's worker as it loads: a worker killed meanwhile (its load timed out, the OOM
    killer) takes pip with it, and the next install removes the directory pip was filling, its own
    temporary files included."""
    requirements = str(server.model_root / "stalls" / "code" / "requirements.txt")
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(server.load, "stalls")
        pip = wait_for(lambda: _running_with(requirements), message="pip did not start")
        [staging] = [p for p in server.requirements_cache.iterdir() if p.name.startswith(".")]
        wait_for(lambda: list((staging / "tmp").iterdir()), message="pip made no temporary files of its own")
        os.kill(_parent(pip), signal.SIGKILL)
        answer = loading.result()
    assert answer.status_code == 500 and "was killed by SIGKILL" in answer.json()["error"], answer.text
    wait_for(lambda: exited(pip), message="pip outlived the worker that ran it")
    assert staging.is_dir()
    assert server.load("brokenreqs").status_code == 400  # an install: it begins by sweeping
    assert not staging.exists()


def test_the_requirements_cache_keeps_to_its_size_and_never_evicts_what_a_worker_uses(start_server, tmp_path):
    """SERVE_REQUIREMENTS_CACHE_SIZE of one byte: after each install, only what a worker uses stays.
    Three models whose files differ only by a comment are three installs of the same wheel."""
    wheel = tiny_wheel(tmp_path)
    for name in "abc":
        directory = handler_model(tmp_path / "models", name, REQUIRES, Scale())
        (directory / "code" / "requirements.txt").write_text(f"# {name}\n{wheel}\n")
    cache = tmp_path / "cache"
    server = start_server(tmp_path / "models", SERVE_REQUIREMENTS_CACHE=str(cache), SERVE_REQUIREMENTS_CACHE_SIZE="1")

    def installs() -> int:
        return sum(1 for entry in cache.iterdir() if not entry.name.startswith("."))

    def without_the_wheel(name: str):
        os.rename(wheel, wheel.with_suffix(".gone"))  # a load that needs pip fails
        try:
            return server.load(name)
        finally:
            os.rename(wheel.with_suffix(".gone"), wheel)

    loaded(server, "a", "b")
    assert installs() == 2  # over its size, but each is in use
    assert server.request("DELETE", "/models/a").status_code == 200  # its worker has ended
    loaded(server, "c")
    assert installs() == 2 and all(post(server, n, b"x", "text/plain").text == "hello from requirements.txt" for n in "bc")
    assert without_the_wheel("a").status_code == 400  # its install was evicted: pip ran, and failed
    loaded(server, "a")  # installed again; b and c are in use, so they stay
    assert installs() == 3
    assert server.request("DELETE", "/models/b").status_code == 200
    assert without_the_wheel("b").status_code == 200  # kept: served from the cache, no pip
    assert post(server, "b", b"x", "text/plain").text == "hello from requirements.txt"


def _running_with(argument: str) -> int | None:
    for process in Path("/proc").iterdir():
        try:
            if process.name.isdigit() and argument.encode() in (process / "cmdline").read_bytes().split(b"\0"):
                return int(process.name)
        except OSError:  # it ended meanwhile
            pass
    return None


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="module")
def toolkit_env_server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("program")
    handler_model(root, "program", None, Scale())
    (root / "program" / "code").mkdir()
    (root / "program" / "code" / "predict.py").write_text(textwrap.dedent(PROGRAM))
    handler_model(root, "plain", None, Scale())
    handler_model(root, "requires", REQUIRES, Scale())
    (root / "requires" / "code" / "inference.py").rename(root / "requires" / "code" / "predict.py")
    (root / "requires" / "code" / "requirements.txt").write_text("tinypkg\n")
    return start_server(root, SAGEMAKER_PROGRAM="predict.py", SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT="text/csv",
                        SERVE_INSTALL_REQUIREMENTS="false")


def test_sagemaker_program_and_default_accept(toolkit_env_server):
    server = toolkit_env_server
    loaded(server, "program", "plain")
    assert post(server, "program", b"x").text == "predict.py:text/csv"
    answer = post(server, "plain", b"[[1, 2]]")
    assert answer.headers["Content-Type"] == "text/csv" and answer.text == "2.0,4.0\n"


def test_requirements_can_be_turned_off(toolkit_env_server):
    answer = toolkit_env_server.load("requires")
    assert answer.status_code == 400 and "No module named 'tinypkg'" in answer.json()["error"]
