import pytest

from container.errors import InsufficientMemory
from container.models.cache import MemoryCache

MIB = 1 << 20


def everyone_idle(name):
    return True


def cache(evict=True, gpu=False):
    budgets = {"cpu": 100 * MIB} | ({"cuda:0": 50 * MIB} if gpu else {})
    return MemoryCache(budgets, evict)


def test_fits_without_eviction():
    c = cache()
    assert list(c.reserve("a", {"cpu": 40 * MIB}, everyone_idle)) == []
    assert list(c.reserve("b", {"cpu": 60 * MIB}, everyone_idle)) == []
    assert c.used("cpu") == 100 * MIB


def test_evicts_least_recently_used_first_and_only_as_many_as_needed():
    c = cache()
    for name in "abc":
        c.reserve(name, {"cpu": 30 * MIB}, everyone_idle)
    c.touch("a")
    assert list(c.reserve("d", {"cpu": 40 * MIB}, everyone_idle)) == ["b"]
    assert list(c.reserve("e", {"cpu": 60 * MIB}, everyone_idle)) == ["c", "a"]
    assert c.used("cpu") == 100 * MIB


def test_busy_models_are_skipped():
    c = cache()
    for name in "abc":
        c.reserve(name, {"cpu": 30 * MIB}, everyone_idle)
    assert list(c.reserve("d", {"cpu": 20 * MIB}, lambda n: n != "a")) == ["b"]


def test_all_or_nothing_when_busy_models_block():
    c = cache()
    c.reserve("a", {"cpu": 50 * MIB}, everyone_idle)
    c.reserve("b", {"cpu": 50 * MIB}, everyone_idle)
    with pytest.raises(InsufficientMemory, match="busy"):
        c.reserve("c", {"cpu": 80 * MIB}, lambda n: n == "a")
    assert c.size_of("a") and c.size_of("b") and not c.size_of("c")


def test_larger_than_budget_evicts_nothing():
    c = cache()
    c.reserve("a", {"cpu": 10 * MIB}, everyone_idle)
    with pytest.raises(InsufficientMemory, match="more than the whole budget"):
        c.reserve("huge", {"cpu": 101 * MIB}, everyone_idle)
    assert c.size_of("a") == {"cpu": 10 * MIB}


def test_eviction_off():
    c = cache(evict=False)
    c.reserve("a", {"cpu": 90 * MIB}, everyone_idle)
    with pytest.raises(InsufficientMemory, match="SERVE_EVICTION=none"):
        c.reserve("b", {"cpu": 20 * MIB}, everyone_idle)


def test_re_reserving_replaces_the_estimate():
    c = cache()
    c.reserve("a", {"cpu": 80 * MIB}, everyone_idle)
    assert list(c.reserve("a", {"cpu": 100 * MIB}, everyone_idle)) == []
    assert c.used("cpu") == 100 * MIB


def test_devices_are_budgeted_separately():
    c = cache(gpu=True)
    c.reserve("cpu-model", {"cpu": 90 * MIB}, everyone_idle)
    c.reserve("gpu-a", {"cuda:0": 30 * MIB, "cpu": 1 * MIB}, everyone_idle)
    assert list(c.reserve("gpu-b", {"cuda:0": 30 * MIB}, everyone_idle)) == ["gpu-a"]  # the CPU model stays
    assert list(c.idle_on("cuda:0", everyone_idle)) == ["gpu-b"]
    assert list(c.idle_on("cuda:0", everyone_idle, keep="gpu-b")) == []


def test_release_and_unknown_devices():
    c = cache()
    c.reserve("a", {"cpu": 60 * MIB, "cuda:7": 10 << 40}, everyone_idle)  # no budget for cuda:7: not limited
    c.release("a")
    assert c.used("cpu") == 0


def test_the_budget_is_the_configured_limit_or_what_the_machine_leaves_less_what_the_server_takes():
    c = MemoryCache({"cpu": 100 * MIB, "cuda:0": 50 * MIB}, evict=True, ceilings={"cpu": 120 * MIB})
    assert c.budgets == {"cpu": 100 * MIB, "cuda:0": 50 * MIB}  # the limit binds
    c.reserve("a", {"cpu": 30 * MIB}, everyone_idle)
    c.reserve("b", {"cpu": 30 * MIB}, everyone_idle)
    c.server_holds({"cpu": 40 * MIB})  # a runtime, a helper process: now the machine binds
    assert c.budgets == {"cpu": 80 * MIB, "cuda:0": 50 * MIB}
    assert list(c.reserve("c", {"cpu": 30 * MIB}, everyone_idle)) == ["a"]
    c.server_holds({})  # what held it ended
    assert c.budgets["cpu"] == 100 * MIB and list(c.reserve("d", {"cpu": 40 * MIB}, everyone_idle)) == []
