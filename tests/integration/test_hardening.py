"""Hostile and unlucky input, one test per class: each case gets a 4xx with an `{"error": …}` that
says what to fix, and afterwards the same worker process still answers a normal request."""

import base64
import io
import os
import socket
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest
import requests

from tests.builders import (
    MIB,
    Scale,
    Upper,
    archive,
    fp32_model,
    handler_model,
    tensor,
    triton_model,
    wait_for,
)

X = [[1.0, 2.0, 3.0, 4.0]]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "mlp")
    triton_model(root, "upper", Upper(), [tensor("TEXT", "TYPE_STRING", [-1])], [tensor("OUT", "TYPE_STRING", [-1])])
    classes = fp32_model(root, "classes", dims=(-1,), max_batch_size=0)
    config = orjson.loads((classes / "config.json").read_bytes())
    config["output"][0]["label_filename"] = "labels.txt"
    (classes / "config.json").write_bytes(orjson.dumps(config))
    (classes / "labels.txt").write_text("a\nb\n")
    handler_model(root, "handler", None, Scale())
    return root


@pytest.fixture(scope="module")
def server(start_server, root):
    # Shared memory and model files are relaxations; these tests hold them to their own bounds.
    server = start_server(root, SERVE_LOAD_MODELS="mlp,upper,classes,handler", SERVE_MAX_DECODED_SIZE="64MiB",
                          SERVE_ALLOW_CLIENT_SHM="true", SERVE_ALLOW_MODEL_FILES="true")
    wait_for(lambda: len(server.loaded()) == 4, 60, "the models did not load")
    server.pid = server.worker_pid()
    return server


def refused(response: requests.Response, status: int, *words: str) -> dict:
    assert response.status_code == status, (response.status_code, response.text[:300])
    document = response.json()
    assert isinstance(document.get("error"), str) and document["error"], document
    for word in words:
        assert word in document["error"], (word, document["error"])
    return document


def still_serving(server) -> None:
    assert server.worker_pid() == server.pid, "the worker process was replaced"
    assert server.request("GET", "/ping", timeout=5).status_code == 200
    assert server.invoke("mlp", X).json() == [[2.0, 4.0, 6.0, 8.0]]


def v2(name: str, *inputs, **extra) -> dict:
    return {"inputs": list(inputs), **extra}


def fp32(data, shape, **parameters) -> dict:
    return {"name": "x", "shape": shape, "datatype": "FP32", "data": data, "parameters": parameters}


def npy(array_or_header) -> bytes:
    if isinstance(array_or_header, bytes):  # a hand-written header with no data behind it
        return b"\x93NUMPY\x01\x00" + len(array_or_header).to_bytes(2, "little") + array_or_header
    buffer = io.BytesIO()
    np.save(buffer, array_or_header)
    return buffer.getvalue()


NPY = {"Content-Type": "application/x-npy"}
JSON = {"Content-Type": "application/json"}
DEEP = b"[" * 5000 + b"]" * 5000

# (what, method, path, keyword arguments of requests, expected status, words the error must hold)
MALFORMED = [
    ("JSON nested thousands deep, V2", "POST", "/v2/models/mlp/infer", {"data": DEEP}, 400, "depth"),
    ("JSON nested thousands deep, invoke", "POST", "/models/mlp/invoke", {"data": DEEP, "headers": JSON}, 400, "depth"),
    ("JSON nested thousands deep, TF Serving", "POST", "/v1/models/mlp:predict", {"data": b'{"instances":' + DEEP + b"}"}, 400, ""),
    ("JSON nested deep with NaN, TF Serving", "POST", "/v1/models/mlp:predict",
     {"data": b'{"instances":' + b"[" * 3000 + b"NaN" + b"]" * 3000 + b"}"}, 400, ""),
    ("BYTES element null", "POST", "/v2/models/upper/infer",
     {"json": v2("upper", {"name": "TEXT", "shape": [2], "datatype": "BYTES", "data": [None, "a"]})}, 400, "null"),
    ("BYTES element object", "POST", "/v2/models/upper/infer",
     {"json": v2("upper", {"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": [{"a": 1}]})}, 400, "send strings"),
    ("BYTES element integer (bytes(n) would allocate n bytes)", "POST", "/v1/models/upper:predict",
     {"json": {"instances": [{"b64": ""}, 808000000]}}, 400, "send strings"),
    ("numbers with nulls", "POST", "/models/mlp/invoke", {"json": [[1, None, 3, 4]]}, 400, "numbers"),
    ("numbers beyond FP32's range", "POST", "/models/mlp/invoke", {"json": [[1e300, 2, 3, 4]]}, 400, "range"),
    ("numbers beyond FP32's range, V2", "POST", "/v2/models/mlp/infer", {"json": v2("mlp", fp32([1e300, 2, 3, 4], [1, 4]))}, 400, "range"),
    ("an empty CSV body", "POST", "/models/mlp/invoke", {"data": b" \n", "headers": {"Content-Type": "text/csv"}}, 400, "CSV"),
    *[(f"NPY of {dtype}", "POST", "/models/mlp/invoke", {"data": npy(np.zeros((1, 4), dtype)), "headers": NPY}, 400, "")
      for dtype in ("U3", "S3", "M8[s]", "m8[s]", "c8", "V4", [("a", "f4"), ("b", "f4")])],
    ("NPY header claiming a huge shape", "POST", "/models/mlp/invoke",
     {"data": npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000, 4), }"), "headers": NPY}, 400, "claims"),
    ("NPY header claiming 771 MiB", "POST", "/models/mlp/invoke",
     {"data": npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (202000000, 1), }"), "headers": NPY}, 400, "claims"),
    ("NPY header that is not a dict", "POST", "/models/mlp/invoke", {"data": npy(b"[1, 2]"), "headers": NPY}, 400, ""),
    ("a shape of 100 dimensions", "POST", "/v2/models/mlp/infer", {"json": v2("mlp", fp32([1], [1] * 100))}, 400, "dimensions"),
    ("JSON data of 100 dimensions", "POST", "/models/mlp/invoke", {"data": b"[" * 100 + b"1" + b"]" * 100, "headers": JSON}, 400, ""),
    ("a shape decoding past the limit", "POST", "/v2/models/mlp/infer",
     {"json": v2("mlp", fp32(None, [100000000, 4], binary_data_size=0))}, 413, "SERVE_MAX_DECODED_SIZE"),
    ("BYTES shared memory past the limit", "POST", "/v2/models/upper/infer",
     {"json": v2("upper", {"name": "TEXT", "shape": [1], "datatype": "BYTES",
                           "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 1 << 40}})},
     413, "SERVE_MAX_DECODED_SIZE"),
    ("a version in non-ASCII digits", "GET", "/v2/models/mlp/versions/\u00b2", {}, 400,
     "version should be an integral value > 0"),
    ("a version in non-ASCII digits, infer", "POST", "/v2/models/mlp/versions/\u0663/infer", {"json": {}}, 400,
     "version should be an integral value > 0"),
    ("a TF Serving version in non-ASCII digits", "GET", "/v1/models/mlp/versions/\u00b2", {}, 400, "numeric"),
    ("a page limit in non-ASCII digits", "GET", "/models?limit=\u00b2", {}, 400, "limit"),
    ("a header length in non-ASCII digits", "POST", "/v2/models/mlp/infer",
     {"data": b"{}", "headers": {"Inference-Header-Content-Length": "\u00b2".encode().decode("latin-1")}}, 400, "Inference-Header"),
    ("a model name holding NUL", "POST", "/models", {"json": {"model_name": "a\x00b", "url": "mlp"}}, 400, "control"),
    ("a model name of 300 bytes", "POST", "/models", {"json": {"model_name": "a" * 300, "url": "mlp"}}, 400, "255"),
    ("the model name '.'", "POST", "/models", {"json": {"model_name": ".", "url": "mlp"}}, 400, "'.'"),
    ("the model name '..', V2", "POST", "/v2/repository/models/%2E%2E/load", {}, 400, "'.'"),
    ("a model name of 100,000 characters, V2", "POST", "/v2/repository/models/" + "n" * 100_000 + "/load", {}, 414, "Request Line"),
    ("a model name of 1,000 characters, V2", "POST", "/v2/repository/models/" + "n" * 1000 + "/load", {}, 400, "255"),
    ("a url holding NUL", "POST", "/models", {"json": {"model_name": "ab", "url": "ml\x00p"}}, 400, "url"),
    ("a url longer than the file system allows", "POST", "/models", {"json": {"model_name": "ab", "url": "a" * 5000}}, 400, "url"),
    ("a url component longer than the file system allows", "POST", "/models",
     {"json": {"model_name": "ab", "url": "mlp/" + "a" * 300}}, 400, "url"),
    ("an /invocations target holding NUL", "POST", "/invocations",
     {"json": X, "headers": {"X-Amzn-SageMaker-Target-Model": "ml%00p"}}, 404, ""),
    ("an /invocations target longer than the file system allows", "POST", "/invocations",
     {"json": X, "headers": {"X-Amzn-SageMaker-Target-Model": "t" * 5000}}, 400, "url"),
]


@pytest.mark.parametrize("what, method, path, kwargs, status, words", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_requests_are_client_errors(server, what, method, path, kwargs, status, words):
    refused(server.request(method, path, **kwargs), status, *([words] if words else []))
    still_serving(server)


def test_the_same_name_rules_in_every_api(server):
    for name in ("a" * 256, "tab\there", "back\\slash", "\u00e9" * 128):  # URLs cannot carry '.' or '..' as names
        first = refused(server.request("POST", "/models", json={"model_name": name, "url": "mlp"}), 400)
        quoted = requests.utils.quote(name, safe="")
        second = refused(server.request("POST", f"/v2/repository/models/{quoted}/load"), 400)
        assert first == second
    still_serving(server)


def raw_request(server, head: bytes, body: bytes = b"") -> bytes:
    """What the server answers to bytes no HTTP library would send."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("path", ["/v2/models/mlp/infer", "/v2/repository/index"])
def test_a_bad_chunk_size_is_a_client_error(server, path):
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
    answer = raw_request(server, head, b"zz\r\nabc\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b'"error"' in answer
    still_serving(server)


@pytest.mark.parametrize("path", ["/v2/models/mlp/infer", "/models/mlp/invoke", "/v2/repository/index",
                                  "/v1/models/mlp:predict", "/models"])
def test_oversized_chunked_bodies_are_413(server, path):
    def chunks():
        for _ in range(7):
            yield b" " * MIB

    refused(server.request("POST", path, data=chunks(), headers=JSON), 413, "6291456")
    still_serving(server)


def test_a_large_codec_job_does_not_stall_the_event_loop(server):
    values = np.arange(1_500_000, dtype=np.float32)
    body = {"inputs": [{"name": "x", "shape": [len(values)], "datatype": "FP32", "parameters": {"binary_data_size": values.nbytes}}],
            "outputs": [{"name": "y", "parameters": {"classification": 1_500_000}}]}
    header = orjson.dumps(body)
    with ThreadPoolExecutor(1) as pool:
        heavy = pool.submit(server.request, "POST", "/v2/models/classes/infer", data=header + values.tobytes(),
                            headers={"Inference-Header-Content-Length": str(len(header))})
        while not heavy.done():  # the loop stalled 6.8 s on this before: each /ping has a deadline of 2
            assert server.request("GET", "/ping", timeout=2).status_code == 200
        assert heavy.result().status_code == 200
    still_serving(server)


def test_a_client_config_cannot_reach_outside_the_model(server, tmp_path):
    secret = tmp_path / "secret.pt"
    secret.write_bytes(b"not yours")
    base = orjson.loads((server.model_root / "mlp" / "config.json").read_bytes())
    labels = {"output": [{**base["output"][0], "label_filename": "{}"}]}
    fields = [("default_model_filename", {"default_model_filename": "{}"}), ("label_filename", labels),
              ("cc_model_filenames", {"cc_model_filenames": {"8.0": "{}"}}),
              ("model_warmup", {"model_warmup": [{"name": "w", "batch_size": 1, "inputs": {"x": {
                  "data_type": "TYPE_FP32", "dims": [4], "input_data_file": "{}"}}}]})]
    for field, change in fields:
        answers = set()
        for path in (str(secret), str(tmp_path / "missing.pt"), "../../../../" + str(secret), "1/../../x"):
            config = orjson.loads(orjson.dumps({**base, **change}).replace(b"{}", path.encode()))
            response = server.request("POST", "/v2/repository/models/mlp/load",
                                      json={"parameters": {"config": orjson.dumps(config).decode()}})
            answers.add(refused(response, 400, field, "inside the model directory")["error"].replace(path, "PATH"))
        assert len(answers) == 1, answers  # the answer does not tell whether the path exists
    still_serving(server)


@pytest.mark.parametrize("warmup, words", [
    ({"name": "huge", "batch_size": 1, "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [1 << 40], "zero_data": True}}},
     ("model_warmup 'huge' takes 4398046511104 bytes; at most", "SERVE_MAX_DECODED_SIZE")),
    ({"name": "endless", "count": 1 << 30, "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}}},
     ("model_warmup asks for 1073741824 executions; at most 100",)),
    ({"name": "file", "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [4], "input_data_file": "large"}}},
     ("model_warmup 'file' takes 67108865 bytes; at most 67108864", "SERVE_MAX_DECODED_SIZE")),
])
def test_a_client_config_cannot_make_the_load_allocate_or_run_without_bound(server, warmup, words):
    """The warmup a client's config override asks for is sized before any of it is made, and a data file
    it names before it is read: the model's warmup/ holds a file one byte past SERVE_MAX_DECODED_SIZE."""
    large = server.model_root / "mlp" / "warmup" / "large"
    large.parent.mkdir(exist_ok=True)
    with large.open("wb") as sparse:
        sparse.truncate((64 << 20) + 1)
    config = {**orjson.loads((server.model_root / "mlp" / "config.json").read_bytes()), "model_warmup": [warmup]}
    try:
        response = server.request("POST", "/v2/repository/models/mlp/load",
                                  json={"parameters": {"config": orjson.dumps(config).decode()}}, timeout=10)
    finally:
        large.unlink()
    refused(response, 400, *words)
    still_serving(server)


def test_load_answers_do_not_tell_what_exists_outside_the_root(server, tmp_path):
    answers = {refused(server.load("probe", url), 400)["error"].replace(url, "URL")
               for url in ("/etc/passwd", "/no/such/file", "../" * 10 + "etc", "mlp/../../" + tmp_path.name)}
    assert len(answers) == 1, answers


def test_override_files_that_clash(server):
    config = (server.model_root / "mlp" / "config.json").read_text()
    model = base64.b64encode((server.model_root / "mlp" / "1" / "model.pt").read_bytes()).decode()
    for files, words in (({"file:1/model.pt": model, "file:1//model.pt": model}, "same file"),
                         ({"file:1/model.pt": model, "file:./1/model.pt": model}, "same file"),
                         ({"file:1": model, "file:1/model.pt": model}, "directory"),
                         ({"file:" + "d" * 300 + "/model.pt": model}, "cannot be written"),
                         ({"file:1/config.json": model, "file:config.json": model}, "config")):
        response = server.request("POST", "/v2/repository/models/clash/load", json={"parameters": {"config": config, **files}})
        assert tempfile.gettempdir() not in refused(response, 400, words)  # the server's own paths are its own
    assert server.request("POST", "/v2/repository/models/clash/load", json={"parameters": {
        "config": config, "file:1/model.pt": model}}).status_code == 200
    still_serving(server)


def test_a_full_disk_is_a_507_whose_words_name_no_path_of_the_servers(start_server, tmp_path_factory):
    """What the server writes for a load (an archive extracted, a load request's files) may meet a full
    disk: the server's storage, a 507 as for a download that does not fit, never a 400 that blames the
    model. A file size limit (prlimit) stands in for the full disk here: writes past it fail as they
    would (EFBIG, ENOSPC)."""
    root = tmp_path_factory.mktemp("models")
    padded = fp32_model(tmp_path_factory.mktemp("src"), "padded")
    (padded / "1" / "padding.bin").write_bytes(bytes(16 * MIB))  # an archive of a few KiB
    archive(padded, root / "padded.tar.gz")
    fp32_model(root, "plain")
    server = start_server(root, wrapper=("prlimit", f"--fsize={8 * MIB}", "--"), SERVE_GRPC_PORT="off",
                          SERVE_HTTP_WORKERS="0", SAGEMAKER_MAX_PAYLOAD_IN_MB="32",  # the body crosses no file
                          SERVE_ALLOW_MODEL_FILES="true")
    config = (root / "plain" / "config.json").read_text()
    written = {"config": config, "file:1/model.pt": base64.b64encode(bytes(9 * MIB)).decode()}
    for answer in (server.load("padded", "padded.tar.gz"),
                   server.request("POST", "/v2/repository/models/uploaded/load", json={"parameters": written})):
        assert tempfile.gettempdir() not in refused(answer, 507, "no room to write")
    assert server.load("plain").status_code == 200


@pytest.mark.parametrize("change, words", [
    ({"instance_group": [{"count": 20000, "kind": "KIND_CPU"}]}, "SERVE_MAX_INSTANCES"),
    ({"instance_group": [{"count": 40, "kind": "KIND_CPU"}, {"count": 40, "kind": "KIND_CPU"}]}, "SERVE_MAX_INSTANCES"),
    ({"dynamic_batching": {"priority_levels": 100000, "default_priority_level": 1}}, "SERVE_MAX_PRIORITY_LEVELS"),
])
def test_configs_asking_for_too_much_are_refused(server, change, words):
    base = orjson.loads((server.model_root / "mlp" / "config.json").read_bytes())
    config = orjson.dumps({**base, **change}).decode()
    refused(server.request("POST", "/v2/repository/models/mlp/load", json={"parameters": {"config": config}}), 400, words)
    still_serving(server)


def test_label_files_that_are_not_utf8(server):
    directory = server.model_root / "latin1"
    fp32_model(server.model_root, "latin1", dims=(-1,), max_batch_size=0)
    config = orjson.loads((directory / "config.json").read_bytes())
    config["output"][0]["label_filename"] = "labels.txt"
    (directory / "config.json").write_bytes(orjson.dumps(config))
    (directory / "labels.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    refused(server.load("latin1"), 400, "UTF-8")
    (directory / "config.pbtxt").write_bytes(b"name: \"caf\xe9\"")
    refused(server.load("latin1"), 400, "UTF-8")
    still_serving(server)


# -- shared memory ---------------------------------------------------------------------------------

def shm_register(server, name: str, key: str, size: int) -> requests.Response:
    return server.request("POST", f"/v2/systemsharedmemory/region/{name}/register", json={"key": key, "offset": 0, "byte_size": size})


def test_shared_memory_never_follows_a_symlink(server, tmp_path):
    target = tmp_path / "outside"
    target.write_bytes(b"\0" * 64)
    key = f"hardening-link-{os.getpid()}"
    os.symlink(target, f"/dev/shm/{key}")
    try:
        refused(shm_register(server, "link", "/" + key, 64), 400, key)
    finally:
        os.unlink(f"/dev/shm/{key}")
    assert target.read_bytes() == b"\0" * 64
    refused(shm_register(server, "dir", "/..", 64), 400, "key")
    still_serving(server)


def test_shared_memory_truncated_by_its_client_is_a_client_error(server):
    key = f"hardening-truncate-{os.getpid()}"
    path = f"/dev/shm/{key}"
    with open(path, "wb") as region:
        region.write(np.array(X, np.float32).tobytes() * 2)
    try:
        assert shm_register(server, "shrinking", "/" + key, 32).status_code == 200
        infer = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                             "parameters": {"shared_memory_region": "shrinking", "shared_memory_byte_size": 16}}],
                 "outputs": [{"name": "y", "parameters": {"shared_memory_region": "shrinking", "shared_memory_offset": 16,
                                                            "shared_memory_byte_size": 16}}]}
        assert server.request("POST", "/v2/models/mlp/infer", json=infer).status_code == 200
        assert np.frombuffer(Path(path).read_bytes()[16:], np.float32).tolist() == [2.0, 4.0, 6.0, 8.0]
        os.truncate(path, 20)  # the output's place is gone
        refused(server.request("POST", "/v2/models/mlp/infer", json=infer), 400, "truncated")
        os.truncate(path, 0)  # and now the input's
        refused(server.request("POST", "/v2/models/mlp/infer", json=infer), 400, "truncated")
        assert os.path.getsize(path) == 0  # a refused write does not grow the object either
    finally:
        server.request("POST", "/v2/systemsharedmemory/region/shrinking/unregister")
        os.unlink(path)
    still_serving(server)


# -- archives ----------------------------------------------------------------------------------------

def _archive(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))


@pytest.mark.parametrize("members, words", [
    ([("/".join(["d"] * 2000) + "/model.pt", 1)], "SERVE_MAX_ARCHIVE_DEPTH"),
    ([(f"f{i}", 0) for i in range(10_001)], "SERVE_MAX_ARCHIVE_MEMBERS"),
    ([("model.pt", 70 * MIB)], "SERVE_MAX_ARCHIVE_SIZE"),
])
def test_archives_are_checked_while_they_expand(start_server, tmp_path, members, words):
    root = tmp_path / "models"
    root.mkdir()
    _archive(root / "bomb.tar.gz", members)
    server = start_server(root, SERVE_MEMORY_LIMIT="64MiB")
    refused(server.load("bomb", "bomb.tar.gz"), 400, words)
    (entry,) = server.request("POST", "/v2/repository/index").json()
    assert entry["name"] == "bomb" and entry["state"] == "UNAVAILABLE" and words in entry["reason"]
    fp32_model(root, "mlp")
    assert server.load("mlp").status_code == 200  # the name is free and the server serves


# -- connections -------------------------------------------------------------------------------------

def test_idle_connections_cannot_lock_new_clients_out(start_server, root):
    # One front-end: the limit is each HTTP process's, and which of two takes a connection is the kernel's
    # choice, so with two the pings could all go to the one that does not hold the oldest connection.
    server = start_server(root, SERVE_MAX_CONNECTIONS="20", SERVE_HTTP_WORKERS="1")
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=15) for _ in range(40)]
    try:
        # every slot is taken by a silent connection: the longest idle makes room, long before
        # SERVE_FIRST_REQUEST_TIMEOUT (10 s) would close any of them
        for _ in range(3):
            assert server.request("GET", "/ping", timeout=5).status_code == 200
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b""  # the oldest was hung up on
        closed = 0
        for sock in idle:
            sock.settimeout(15)
            closed += sock.recv(1) == b""
        assert closed == 40  # and the rest, by their first-request timeout
    finally:
        for sock in idle:
            sock.close()
