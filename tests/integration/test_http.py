"""HTTP/1.1 as the worker speaks it, byte for byte over a socket: keep-alive, pipelining, chunked
bodies, Expect: 100-continue, HEAD, and malformed or oversized requests answered in JSON; and /ping
answering while 64 clients saturate the server."""

import json
import re
import socket
import threading

import pytest
import requests

from tests.builders import Scale, fp32_model, handler_model, wait_for

X = json.dumps([[1.0, 2.0, 3.0, 4.0]]).encode()
DOUBLED = [[2.0, 4.0, 6.0, 8.0]]


@pytest.fixture(scope="module", params=[None, "1", "0"], ids=["front-ends", "one-front-end", "one-process"])
def server(start_server, tmp_path_factory, request):
    """Every behaviour here as the server runs by default (a front-end per core), with one front-end, and
    with the model process serving HTTP itself: HTTP is one transport (http_transport.py) in all three."""
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "double", Scale())
    server = start_server(root, SERVE_LOAD_MODELS="double", SERVE_HTTP_WORKERS=request.param)
    wait_for(lambda: server.loaded() == ["double"], message="the model did not load")
    return server


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json", *headers]
    if not any(h.lower().startswith("transfer-encoding") for h in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def get(path: str, *headers: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: x", *headers]) + "\r\n\r\n").encode()


class Client:
    """A raw connection that reads whole responses, one at a time, by their Content-Length."""

    def __init__(self, server):
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = 0 if head_only else int(headers.get("content-length", 0))
        while len(self.buffer) < length:
            self._read()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def chunked_body(self) -> list[bytes]:
        """The chunks of a chunked body, up to its last (empty) one."""
        chunks = []
        while True:
            while b"\r\n" not in self.buffer:
                self._read()
            size, self.buffer = self.buffer.split(b"\r\n", 1)
            length = int(size, 16)
            while len(self.buffer) < length + 2:
                self._read()
            chunk, self.buffer = self.buffer[:length], self.buffer[length + 2:]
            if not length:
                return chunks
            chunks.append(chunk)

    def closed(self) -> bool:
        """The server closed the connection (after any bytes still unread)."""
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return True
            self.buffer += chunk

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        assert chunk, f"the server closed the connection; unread: {self.buffer[:200]!r}"
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def client(server):
    connection = Client(server)
    yield connection
    connection.close()


def test_keep_alive_serves_many_requests_on_one_connection(client):
    for index in range(20):
        client.send(post("/models/double/invoke", X) if index % 2 else get("/ping"))
        status, headers, body = client.response()
        assert status == 200 and "close" not in headers.get("connection", "")
        if index % 2:
            assert json.loads(body) == DOUBLED


def test_pipelined_requests_are_answered_in_order(client):
    ids = [f"pipe-{index}" for index in range(8)]
    client.send(b"".join(post("/models/double/invoke", X, f"X-Request-Id: {i}") if n % 2 else get("/ping", f"X-Request-Id: {i}")
                         for n, i in enumerate(ids)))
    answers = [client.response() for _ in ids]
    assert [headers["x-request-id"] for _, headers, _ in answers] == ids
    assert all(status == 200 for status, _, _ in answers)


def test_a_chunked_body_is_read_whole(client):
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in (X[:5], X[5:9], X[9:])) + b"0\r\n\r\n"
    client.send(post("/models/double/invoke", chunks, "Transfer-Encoding: chunked"))
    status, _, body = client.response()
    assert status == 200 and json.loads(body) == DOUBLED
    client.send(get("/ping"))  # and the connection goes on
    assert client.response()[0] == 200


def test_a_streamed_answer_is_chunked_and_the_connection_goes_on(client):
    client.send(post("/v2/models/double/generate_stream", b'{"x": [1, 2, 3, 4], "id": "s"}'))
    status, headers, body = client.response(head_only=True)
    assert (status, headers["transfer-encoding"], headers["content-type"]) == (200, "chunked", "text/event-stream; charset=utf-8")
    assert "content-length" not in headers
    assert client.chunked_body() == [b'data: {"id":"s","model_name":"double","model_version":"1","y":[2.0,4.0,6.0,8.0]}\n\n']
    client.send(get("/ping"))
    assert client.response()[0] == 200


def expecting(length: int) -> bytes:
    """The head of an invoke whose body of `length` bytes waits for the server's 100 Continue."""
    return (f"POST /models/double/invoke HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n").encode()


def test_expect_100_continue(server, client):
    client.send(expecting(len(X)))
    assert client.response(head_only=True)[0] == 100  # "go on": the client sends its body only now
    client.send(X)
    status, _, body = client.response()
    assert status == 200 and json.loads(body) == DOUBLED
    refused = Client(server)
    try:  # a body past the limit is refused before it is sent
        refused.send(expecting(999_999_999))
        status, headers, body = refused.response()
        assert status == 413 and "SAGEMAKER_MAX_PAYLOAD_IN_MB" in json.loads(body)["error"] and headers["connection"] == "close"
        assert refused.closed()
    finally:
        refused.close()


def test_a_content_length_past_the_limit_is_413_before_the_body_is_sent(server):
    refused = Client(server)
    try:
        refused.send(post("/models/double/invoke", b"", f"Content-Length: {7 << 20}").replace(b"Content-Length: 0\r\n", b""))
        status, headers, body = refused.response()  # answered though not a byte of the body was sent
        assert status == 413 and "7340032 bytes" in json.loads(body)["error"] and headers["connection"] == "close"
        assert refused.closed()
    finally:
        refused.close()


def test_head_answers_headers_without_a_body(client):
    client.send(("HEAD /models HTTP/1.1\r\nHost: x\r\n\r\n").encode())
    status, headers, _ = client.response(head_only=True)
    assert status == 200 and int(headers["content-length"]) > 0
    client.send(get("/ping"))  # nothing of the body was sent: the next response starts right away
    assert client.response()[0] == 200


def test_http_1_0_and_connection_close_end_the_connection(server):
    for request in (b"GET /ping HTTP/1.0\r\n\r\n", get("/ping", "Connection: close")):
        client = Client(server)
        try:
            client.send(request)
            status, headers, _ = client.response()
            assert status == 200 and headers["connection"] == "close" and client.closed()
        finally:
            client.close()


@pytest.mark.parametrize("request_bytes, status, words", [
    (b"GARBAGE\r\n\r\n", 400, "malformed HTTP request"),
    (b"GET /ping HTTP/1.1\r\nHost x\r\n\r\n", 400, "malformed HTTP request"),
    (b"POST /ping HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "malformed HTTP request"),
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n", 414, "Request Line"),
    (b"GET /ping HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % n for n in range(101)) + b"\r\n", 431, "header fields"),
    (b"GET /ping HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431, "longer than"),
])
def test_malformed_http_is_a_json_client_error(server, request_bytes, status, words):
    client = Client(server)
    try:
        client.send(request_bytes)
        answer, headers, body = client.response()
        assert answer == status and words in json.loads(body)["error"] and headers["connection"] == "close"
        assert re.fullmatch(r"[0-9a-f]{32}", headers["x-request-id"])  # answered as every request is
        assert client.closed()
    finally:
        client.close()
    assert requests.get(server.url + "/ping", timeout=10).status_code == 200


def test_ping_answers_while_64_clients_saturate_the_server(server):
    stop, served, failures = threading.Event(), [0] * 64, []

    def load(index: int) -> None:
        with requests.Session() as session:
            while not stop.is_set():
                answer = session.post(server.url + "/models/double/invoke", data=X, timeout=60,
                                      headers={"Content-Type": "application/json"})
                if answer.status_code != 200:
                    failures.append(answer.text)
                served[index] += 1

    clients = [threading.Thread(target=load, args=(index,)) for index in range(64)]
    for thread in clients:
        thread.start()
    try:
        wait_for(lambda: all(served), 60, "not every client was served")  # all 64 are in the loop now
        for _ in range(20):  # each waits its turn behind at most one round of the 64 clients: a deadline of
            # 5 s that a loaded CI machine cannot reach by chance, and that a stalled loop would
            assert requests.get(server.url + "/ping", timeout=5).status_code == 200
    finally:
        stop.set()
        for thread in clients:
            thread.join()
    assert failures == []


LARGE_ANSWER = """
def model_fn(model_dir):
    return None


def transform_fn(model, body, content_type, accept):
    return b"x" * (8 << 20), "application/octet-stream"
"""


@pytest.mark.parametrize("front_ends", ["1", "0"])
def test_an_answer_read_after_a_pause_arrives_whole(start_server, tmp_path, front_ends):
    """A client that pauses while it reads a large answer, past SERVE_FIRST_REQUEST_TIMEOUT, gets all of it:
    the answer's deadline is its own (SERVE_MIN_BODY_RATE), where it was the last read's, and the answer was
    cut in two with its connection left open until the keep-alive timeout."""
    handler_model(tmp_path / "models", "large", LARGE_ANSWER)
    server = start_server(tmp_path / "models", SERVE_LOAD_MODELS="large", SERVE_FIRST_REQUEST_TIMEOUT="1",
                          SERVE_HTTP_WORKERS=front_ends)
    wait_for(server.ready, 60, "the model did not load")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # the answer waits in the server
        sock.sendall(post("/models/large/invoke", b"{}"))
        answer = b""
        while b"\r\n\r\n" not in answer:  # the head, and the answer under way
            chunk = sock.recv(64 << 10)
            assert chunk, f"the server closed the connection after {answer!r}"
            answer += chunk
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as silent:
            assert silent.recv(1) == b""  # closed by the server after SERVE_FIRST_REQUEST_TIMEOUT: the pause
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(re.search(rb"Content-Length: (\d+)", head)[1])
        while len(body) < length and (chunk := sock.recv(1 << 20)):
            body += chunk
    assert head.startswith(b"HTTP/1.1 200") and len(body) == length == 8 << 20
