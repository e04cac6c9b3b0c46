"""Which device a model loads on, from its instance groups and the room each device has — decided
the same way on a machine with GPUs; here the GPUs are budgets, which is all the choice reads."""

import pytest
from google.protobuf import json_format

from container.errors import InvalidModel
from container.models.cache import MemoryCache
from container.models.registry import place
from container.models.triton_schema import model_config_pb2 as pb

GIB = 1 << 30


def groups(*instance_group) -> pb.ModelConfig:
    return json_format.ParseDict({"instance_group": list(instance_group)}, pb.ModelConfig())


def devices(*free_gib) -> MemoryCache:
    """A cache over `len(free_gib)` GPUs of 10 GiB each, with 10 − free GiB already charged on each."""
    cache = MemoryCache({"cpu": 64 * GIB} | {f"cuda:{i}": 10 * GIB for i in range(len(free_gib))}, evict=True)
    for index, free in enumerate(free_gib):
        cache.charge(f"held{index}", {f"cuda:{index}": (10 - free) * GIB})
    return cache


@pytest.mark.parametrize("config, free, expected", [
    (None, (), ("cpu", "")),  # a handler model on a CPU machine
    (groups(), (), ("cpu", "")),
    (groups({"kind": "KIND_CPU"}), (9, 9), ("cpu", "")),  # asked for CPU: GPUs are not used
    (None, (2, 7, 5), ("cuda:1", "")),  # any GPU: the one with the most room
    (groups({"kind": "KIND_GPU", "count": 2}), (2, 7), ("cuda:1", "")),
    (groups({"kind": "KIND_GPU", "gpus": [0, 2]}), (2, 9, 5), ("cuda:2", "")),  # the roomiest of those named
    (groups({"kind": "KIND_GPU", "gpus": [0]}), (1, 9), ("cuda:0", "")),  # named: even with less room
])
def test_a_model_goes_where_its_groups_allow_with_the_most_room(config, free, expected):
    assert place(config, devices(*free)) == expected


def test_gpus_asked_for_on_a_machine_without_any_run_on_cpu_and_say_why():
    device, why = place(groups({"kind": "KIND_GPU", "gpus": [1]}), devices())
    assert device == "cpu" and "['cuda:1']" in why and "no GPU" in why


def test_a_gpu_the_server_lacks_is_a_400():
    with pytest.raises(InvalidModel, match=r"names \['cuda:3'\]; this server has \['cuda:0', 'cuda:1'\]"):
        place(groups({"kind": "KIND_GPU", "gpus": [3]}), devices(5, 5))
