"""Every request a test sends has a deadline, so a server that never answers fails its test instead of
holding the suite for ever: `requests` calls, sockets and the barriers clients meet at name theirs, and
tritonclient's gRPC clients, which have none by default, come from tests/grpc_clients.py, which gives
each call and stream one."""

import ast
import asyncio
import socket
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tests import grpc_clients

TESTS = Path(__file__).resolve().parent.parent
_REQUESTS = {"get", "post", "put", "delete", "patch", "head", "request"}
_GRPC_MODULES = {"tritonclient.grpc", "tritonclient.grpc.aio"}
_GRPC_CLIENT = "tritonclient's gRPC client without a deadline (use tests.grpc_clients)"


def _undeadlined(source: str) -> list[str]:
    """Where `source` sends a request without a deadline: 'line: what'."""
    tree = ast.parse(source)
    grpc_aliases = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names if alias.name in _GRPC_MODULES}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in _GRPC_MODULES and \
                any(alias.name == "InferenceServerClient" for alias in node.names):
            found.append(f"{node.lineno}: {_GRPC_CLIENT}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in grpc_aliases and node.attr == "InferenceServerClient":
            found.append(f"{node.lineno}: {_GRPC_CLIENT}")
        elif isinstance(node, ast.Call) and (what := _call_without_timeout(node)):
            found.append(f"{node.lineno}: {what}")
    return found


def _call_without_timeout(call: ast.Call) -> str | None:
    function, named = call.func, {keyword.arg for keyword in call.keywords}
    if not (isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name)) or None in named:
        return None  # (**kwargs may carry one: Server.request sets its own default)
    if function.value.id == "requests" and function.attr in _REQUESTS and "timeout" not in named:
        return f"requests.{function.attr} without a timeout"
    if (function.value.id, function.attr) == ("socket", "create_connection") and len(call.args) < 2 and "timeout" not in named:
        return "a socket without a timeout"
    if (function.value.id, function.attr) == ("threading", "Barrier") and len(call.args) < 3 and "timeout" not in named:
        return "a barrier without a timeout (a client that failed before it would hold the others for ever)"
    return None


def test_every_request_a_test_sends_has_a_deadline():
    found = [f"{path.relative_to(TESTS.parent)}:{line}" for path in sorted(TESTS.rglob("*.py"))
             if path.name != "grpc_clients.py" for line in _undeadlined(path.read_text())]
    assert not found, "\n".join(found)


def test_the_check_finds_each_kind_of_request_without_a_deadline():
    source = ("import requests, socket\nimport tritonclient.grpc as g\nfrom tritonclient.grpc.aio import InferenceServerClient\n"
              "requests.get(url)\nsocket.create_connection(address)\ng.InferenceServerClient(url)\n"
              "requests.get(url, timeout=5)\nsocket.create_connection(address, 5)\nserver.request('GET', path)\n"
              "threading.Barrier(2)\nthreading.Barrier(2, timeout=5)\n")
    assert sorted(_undeadlined(source)) == [
        "10: a barrier without a timeout (a client that failed before it would hold the others for ever)",
        f"3: {_GRPC_CLIENT}", "4: requests.get without a timeout", "5: a socket without a timeout", f"6: {_GRPC_CLIENT}"]


@pytest.fixture
def silent_port():
    """A port that takes connections and never says a word."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def test_a_grpc_call_to_a_silent_server_ends_at_its_deadline(silent_port, monkeypatch):
    monkeypatch.setattr(grpc_clients, "DEADLINE", 0.5)
    with grpc_clients.InferenceServerClient(f"127.0.0.1:{silent_port}") as client:
        with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
            client.is_server_live()


def test_an_asyncio_grpc_call_to_a_silent_server_ends_at_its_deadline(silent_port, monkeypatch):
    monkeypatch.setattr(grpc_clients, "DEADLINE", 0.5)

    async def call():
        async with grpc_clients.AsyncInferenceServerClient(f"127.0.0.1:{silent_port}") as client:
            await client.is_server_live()

    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        asyncio.run(asyncio.wait_for(call(), 30))
