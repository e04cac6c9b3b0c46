"""Models straight from S3: a real S3 API (moto's server, on a local port) that the server under test
reaches over HTTP with plain boto3, through AWS_ENDPOINT_URL_S3, exactly as it would reach S3. A
gate in front of moto holds the downloads of chosen keys, so "a download in flight" is a state the
test controls, not a race it hopes to win."""

import io
import socket
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pytest
import requests
from werkzeug.serving import make_server

from tests.builders import MIB, fp32_model, sized_model, wait_for
from tests.integration.test_observability import log_lines

BUCKET = "models"


class Gate:
    """WSGI middleware in front of moto: object GETs whose key holds "/held/" wait until the test opens
    the gate, and every request naming "throttled" is answered as S3 answers when it throttles."""

    def __init__(self, app):
        self.app = app
        self.open = threading.Event()
        self.open.set()
        self.throttled = 0

    def __call__(self, environ, start_response):
        path, query = environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", "")
        if "throttled" in path + query:
            self.throttled += 1
            start_response("503 Slow Down", [("Content-Type", "application/xml")])
            return [b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"]
        if environ["REQUEST_METHOD"] == "GET" and "/held/" in path and "list-type" not in query:
            assert self.open.wait(60), "the test never opened the gate"
        return self.app(environ, start_response)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    # moto is imported by the fixture alone: test_pt2 shares it, and the GPU machine's run of test_pt2's
    # GPU test goes without moto (bench/device/bundle leaves it out of what that machine is carried)
    from moto.server import DomainDispatcherApplication, create_backend_app

    gate = Gate(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, gate, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    client.create_bucket(Bucket=BUCKET)
    scratch = tmp_path_factory.mktemp("s3-sources")
    for name, mib in (("a", 1), ("b", 2), ("c", 1)):
        upload_directory(client, sized_model(scratch, name, mib), f"repo/{name}")
    upload_archive(client, fp32_model(scratch, "packed"), "repo/packed.tar.gz")
    upload_directory(client, sized_model(scratch, "big", 8), "big")
    upload_directory(client, sized_model(scratch, "big2", 8), "big2")
    upload_directory(client, sized_model(scratch, "big3", 8), "big3")
    upload_directory(client, sized_model(scratch, "slow", 64), "held/slow")
    client.put_object(Bucket=BUCKET, Key="broken.tar.gz", Body=b"not a gzip stream at all")
    yield S3(endpoint, client, gate, tmp_path_factory)
    server.shutdown()


class S3:
    def __init__(self, endpoint, client, gate, tmp_path_factory):
        self.endpoint, self.client, self.gate = endpoint, client, gate
        self._tmp = tmp_path_factory

    def env(self, cache: Path | None = None, **more) -> dict:
        """What the server needs to reach this S3: an endpoint, a region, credentials, a cache directory."""
        return {"AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "SERVE_DOWNLOAD_CACHE": str(cache or self._tmp.mktemp("cache")),
                "SERVE_LOG_LEVEL": "info", "SERVE_S3_ROOTS": "s3://models,s3://no-such-bucket,s3://private", **more}


def upload_directory(client, directory: Path, prefix: str) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(directory)}")


def upload_archive(client, directory: Path, key: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(directory, arcname=".")
    client.put_object(Bucket=BUCKET, Key=key, Body=buffer.getvalue())


def counter(server, name: str) -> float:
    return server.metrics().get((name, ()), 0)


def invoke_ok(server, name: str) -> bool:
    answer = server.invoke(name, [[1, 1, 1, 1]])
    return answer.status_code == 200


def test_every_url_form_loads_and_serves(start_server, s3, tmp_path):
    server = start_server(tmp_path / "local", **s3.env())
    forms = {"directory": "s3://models/repo/a", "slash": "s3://models/repo/b/", "archive": "s3://models/repo/packed.tar.gz"}
    for name, url in forms.items():
        answer = server.load(name, url)
        assert answer.status_code == 200, answer.text
        assert invoke_ok(server, name)
    assert counter(server, "serve_downloads_total") == 3
    downloaded = [line for line in log_lines(server) if line["message"] == "downloaded model"]
    assert {line["url"] for line in downloaded} == set(forms.values())
    assert all(line["bytes"] > 0 and isinstance(line["seconds"], float) and "MB/s" in line for line in downloaded)
    assert "testing" not in server.log.read_text()  # no credential is ever logged


def test_an_s3_model_root_serves_every_api(start_server, s3, tmp_path):
    server = start_server(tmp_path / "local", SERVE_MODEL_ROOT="s3://models/repo", SERVE_LOAD_MODELS="a", **s3.env())
    wait_for(lambda: "a" in server.loaded(), message="SERVE_LOAD_MODELS did not load from S3")
    index = server.request("POST", "/v2/repository/index", json={}).json()
    assert {e["name"] for e in index} == {"a", "b", "c", "packed"}
    assert server.request("POST", "/v2/repository/models/b/load").status_code == 200
    assert server.request("POST", "/v2/models/b/infer", json={"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]}]}).status_code == 200
    headers = {"X-Amzn-SageMaker-Target-Model": "packed", "Content-Type": "application/json"}  # an archive, by name
    answer = server.request("POST", "/invocations", data="[[1, 2, 3, 4]]", headers=headers)
    assert answer.status_code == 200, answer.text
    assert server.request("GET", "/v1/models/packed").status_code == 200  # TF Serving sees it too
    outside = server.load("escape", "../big")
    assert outside.status_code == 400 and "inside the model root" in outside.json()["error"]
    override = server.request("POST", "/v2/repository/models/c/load", json={"parameters": {"config": "{}"}})
    assert override.status_code == 400 and "'file:' parameters" in override.json()["error"]
    assert server.request("POST", "/v2/models/b/infer", json={"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]}]}).status_code == 200


def test_concurrent_loads_of_one_url_share_one_download_and_ping_answers_meanwhile(start_server, s3, tmp_path):
    server = start_server(tmp_path / "local", **s3.env())
    s3.gate.open.clear()
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(server.load, "slow1", "s3://models/held/slow")
            wait_for(lambda: counter(server, "serve_downloads_in_progress") == 1, message="the download never began")
            second = pool.submit(server.load, "slow2", "s3://models/held/slow")
            for _ in range(5):  # the event loop is free while the download waits at the gate
                assert requests.get(server.url + "/ping", timeout=2).status_code == 200
            s3.gate.open.set()
            assert first.result().status_code == 200 and second.result().status_code == 200
    finally:
        s3.gate.open.set()
    assert counter(server, "serve_downloads_total") == 1
    assert invoke_ok(server, "slow1") and invoke_ok(server, "slow2")


def test_the_disk_budget_evicts_unused_downloads_then_answers_507(start_server, s3, tmp_path):
    server = start_server(tmp_path / "local", SERVE_DOWNLOAD_CACHE_SIZE="20MiB", **s3.env())
    assert server.load("big", "s3://models/big").status_code == 200
    assert server.load("big2", "s3://models/big2").status_code == 200
    full = server.load("big3", "s3://models/big3")  # 24 MiB would not fit, and both copies are in use
    assert full.status_code == 507 and "SERVE_DOWNLOAD_CACHE_SIZE" in full.json()["error"]
    assert server.request("DELETE", "/models/big").status_code == 200
    assert server.load("big3", "s3://models/big3").status_code == 200  # big's unused copy made room
    assert counter(server, "serve_download_cache_evictions_total") == 1
    assert server.request("DELETE", "/models/big2").status_code == 200
    downloads = counter(server, "serve_downloads_total")
    assert server.load("big2", "s3://models/big2").status_code == 200  # reloaded from disk
    assert counter(server, "serve_downloads_total") == downloads
    assert counter(server, "serve_download_cache_bytes") <= 20 * MIB


def test_a_full_disk_under_the_download_cache_is_a_507_naming_no_path(start_server, s3, tmp_path):
    """A file size limit (prlimit) stands in for a full disk: a write past it fails as one would."""
    cache = tmp_path / "cache"
    server = start_server(tmp_path / "local", wrapper=("prlimit", f"--fsize={4 * MIB}", "--"), **s3.env(cache))
    full = server.load("big", "s3://models/big")  # an 8 MiB model
    assert full.status_code == 507 and "no room to write the download of s3://models/big" in full.json()["error"]
    assert str(cache) not in full.json()["error"]
    assert server.load("a", "s3://models/repo/a").status_code == 200 and invoke_ok(server, "a")
    assert not [p for p in cache.iterdir() if p.name.startswith(".partial")]  # nothing of the failed download


def test_a_restart_reuses_the_disk_cache(start_server, s3, tmp_path):
    cache = tmp_path / "cache"
    first = start_server(tmp_path / "one", **s3.env(cache))
    assert first.load("c", "s3://models/repo/c").status_code == 200
    first.stop()
    second = start_server(tmp_path / "two", **s3.env(cache))
    assert second.load("c", "s3://models/repo/c").status_code == 200 and invoke_ok(second, "c")
    assert counter(second, "serve_downloads_total") == 0 and counter(second, "serve_download_cache_hits_total") == 1


@pytest.mark.parametrize("url, status, says", [
    ("s3://models/nothing/here", 404, "s3://models/nothing/here"),
    ("s3://no-such-bucket/m", 404, "NoSuchBucket"),
    ("s3://models/broken.tar.gz", 400, "cannot be read"),
    ("s3://models/../etc", 400, "'..'"),
    ("s3://Bad_Bucket/m", 400, "does not name an S3 bucket"),
])
def test_errors_a_user_can_act_on(start_server, s3, tmp_path, url, status, says):
    server = start_server(tmp_path / "local", **s3.env())
    answer = server.load("m", url)
    assert answer.status_code == status and says in answer.json()["error"], answer.text
    assert server.request("GET", "/ping").status_code == 200


def test_denied_access_is_403_naming_the_bucket_and_key_but_no_credentials(start_server, s3, tmp_path):
    s3.client.create_bucket(Bucket="private")
    s3.client.put_object(Bucket="private", Key="m/config.json", Body=b"{}")
    s3.client.put_bucket_policy(Bucket="private", Policy='{"Version": "2012-10-17", "Statement": [{"Effect": "Deny", '
                                '"Principal": "*", "Action": "s3:*", "Resource": ["arn:aws:s3:::private", "arn:aws:s3:::private/*"]}]}')
    server = start_server(tmp_path / "local", **s3.env())
    answer = server.load("m", "s3://private/m")
    assert answer.status_code == 403, answer.text
    assert "s3://private/m" in answer.json()["error"] and "testing" not in answer.json()["error"]


def test_an_unreachable_s3_is_retried_then_503_with_retry_after(start_server, s3, tmp_path):
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    server = start_server(tmp_path / "local", **s3.env(AWS_ENDPOINT_URL_S3=f"http://127.0.0.1:{port}", AWS_MAX_ATTEMPTS="2"))
    answer = server.load("m", "s3://models/repo/a")
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
    assert "could not be reached" in answer.json()["error"] and "s3://models/repo/a" in answer.json()["error"]


def test_throttling_is_retried_as_aws_max_attempts_says_then_503_with_retry_after(start_server, s3, tmp_path):
    server = start_server(tmp_path / "local", **s3.env(AWS_MAX_ATTEMPTS="3"))  # as shipped: 6 (test_s3_client)
    before = s3.gate.throttled
    answer = server.load("m", "s3://models/throttled/m")
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
    assert "SlowDown" in answer.json()["error"] and "s3://models/throttled/m" in answer.json()["error"]
    assert s3.gate.throttled - before == 3  # the first attempt and two retries


def test_absolute_urls_are_fetched_only_under_the_allowed_roots(start_server, s3, tmp_path):
    default = start_server(tmp_path / "default", **s3.env(SERVE_S3_ROOTS=None))  # as the server ships
    answer = default.load("a", "s3://models/repo/a")
    assert answer.status_code == 403 and "SERVE_S3_ROOTS" in answer.json()["error"], answer.text
    target = {"X-Amzn-SageMaker-Target-Model": "s3://models/repo/a", "Content-Type": "application/json"}
    answer = default.request("POST", "/invocations", data="[[1, 2, 3, 4]]", headers=target)
    assert answer.status_code == 403 and "SERVE_S3_ROOTS" in answer.json()["error"], answer.text
    assert counter(default, "serve_download_cache_misses_total") == 0  # S3 was never asked
    rooted = start_server(tmp_path / "rooted", **s3.env(SERVE_S3_ROOTS="s3://models/repo"))
    assert rooted.load("a", "s3://models/repo/a").status_code == 200
    for url in ("s3://models/big", "s3://models/repo", "s3://models/repo-other/a", "s3://private/m"):
        answer = rooted.load("x", url)
        assert answer.status_code == 403 and "SERVE_S3_ROOTS" in answer.json()["error"], (url, answer.text)
    assert invoke_ok(rooted, "a")


def test_an_object_key_is_judged_as_a_path_before_it_is_written(start_server, s3, tmp_path):
    cache = tmp_path / "cache"
    s3.client.put_object(Bucket=BUCKET, Key="climb/model.pt", Body=b"x")
    s3.client.put_object(Bucket=BUCKET, Key="climb/../../../canary", Body=b"written outside")
    listed = [o["Key"] for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix="climb/")["Contents"]]
    assert "climb/../../../canary" in listed  # S3 keys are any text: the store keeps it as written
    server = start_server(tmp_path / "local", **s3.env(cache))
    answer = server.load("climb", "s3://models/climb")
    assert answer.status_code == 400 and "not a path inside" in answer.json()["error"], answer.text
    assert not list(tmp_path.rglob("canary")) and not (cache.parent.parent / "canary").exists()
    assert server.request("GET", "/ping").status_code == 200
