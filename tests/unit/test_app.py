"""The models' memory budget leaves room for the processes beside the model process, and for what they
come to hold beyond it."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from container import frontends, resources
from container.app import memory_cache
from container.settings import Settings

MiB = 1 << 20


@pytest.mark.parametrize("env, beside", [
    ({"SERVE_HTTP_WORKERS": "0", "SERVE_GRPC_PORT": "off"}, 0),
    ({"SERVE_HTTP_WORKERS": "4", "SERVE_GRPC_PORT": "off"}, 4 * 32 * MiB),
    ({"SERVE_HTTP_WORKERS": "16", "SERVE_GRPC_PORT": "8001"}, 16 * 32 * MiB + 16 * 48 * MiB),  # a gRPC front-end per HTTP one
    ({"SERVE_HTTP_WORKERS": "0", "SERVE_GRPC_PORT": "8001"}, 48 * MiB),
])
def test_the_budget_is_the_ram_less_the_idle_process_and_the_front_ends(env, beside):
    settings = Settings.from_env({"SERVE_MEMORY_LIMIT": "100%", **env})
    idle = 300 * MiB
    cache = memory_cache(settings, SimpleNamespace(devices=[]), idle)
    assert cache.budgets == {"cpu": resources.memory_limit() - idle - beside}
    assert frontends.memory(settings.http_workers, settings.grpc_port is not None) == beside


def test_a_smaller_limit_is_the_budget_whatever_the_front_ends():
    settings = Settings.from_env({"SERVE_MEMORY_LIMIT": "512MiB", "SERVE_HTTP_WORKERS": "16"})
    assert memory_cache(settings, SimpleNamespace(devices=[]), 300 * MiB).budgets == {"cpu": 512 * MiB}


def test_the_front_ends_memory_beyond_their_allowance_is_measured_and_nothing_else_is_counted(tmp_path):
    """In a forked 'model process': a sibling (a process its parent started, as the master starts the
    front-ends) holding 64 MiB is measured; its own child (as a python model's worker, which reaches the
    channel too) is not; nor the sibling once its connection is gone."""
    # touches 64 MiB, says so, then holds it until its stdin closes (the test ends it, or kills it)
    holds = "import sys; held = bytearray(64 << 20); held[::4096] = b'x' * 16384; print('ready', flush=True); sys.stdin.read()"
    with subprocess.Popen([sys.executable, "-c", holds], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as sibling:
        try:
            assert sibling.stdout.readline() == "ready\n"
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the model process
                try:
                    with subprocess.Popen([sys.executable, "-c", holds], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True) as child:
                        child.stdout.readline()
                        front_ends, none_allowed = frontends.Connected(32 << 20), frontends.Connected(0)
                        for connected in (front_ends, none_allowed):
                            connected.connected(sibling.pid)
                            connected.connected(child.pid)
                        seen = [front_ends.beyond_allowance(), none_allowed.beyond_allowance()]
                        none_allowed.disconnected(sibling.pid)
                        seen.append(none_allowed.beyond_allowance())
                        child.kill()
                    os.write(write, json.dumps(seen).encode())
                finally:
                    os._exit(0)
            os.close(write)
            with os.fdopen(read, "rb") as answer:
                beyond, whole, gone = json.loads(answer.read())
            os.waitpid(pid, 0)
        finally:
            sibling.kill()
    assert 64 << 20 <= whole < 96 << 20  # the sibling's anonymous pages: its 64 MiB and Python's own
    assert beyond == whole - (32 << 20) and gone == 0
