"""The models' memory budget leaves room for the processes beside the model process."""

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
