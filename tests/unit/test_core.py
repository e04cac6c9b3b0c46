"""The core facade and the registry under it, without a server: real TorchScript models loaded from a
model root, a real memory cache, and greenlets that take turns where a request and a lifecycle change
meet. Orders are decided by events (a held lease, a started greenlet), never by timing."""

import dataclasses
import threading

import gevent
import numpy as np
import pytest

from bench.fidelity_models import DOUBLE_PY
from container.core import Core
from container.errors import (
    Cancelled,
    DeviceFault,
    InsufficientMemory,
    InvalidInput,
    InvalidModel,
    InvalidRequest,
    ModelConflict,
    ModelNotFound,
    Unavailable,
)
from container.inference import Client, InferRequest, Ticket
from container.models import registry as registry_module
from container.models.registry import State
from container.scheduling import scheduler_for
from tests.builders import (
    Faults,
    Scale,
    Sized,
    ensemble,
    ensemble_step,
    fp32_model,
    handler_model,
    make_core,
    poll,
    python_model,
    sized_model,
    take_turns,
    tensor,
)

MIB = 1 << 20


class Closings:
    """scheduler_for, noting each scheduler it made and each one closed."""

    def __init__(self):
        self.made, self.closed = [], []

    def __call__(self, name, *args, **kwargs):
        scheduler = scheduler_for(name, *args, **kwargs)
        close = scheduler.close

        def closing():
            self.closed.append(scheduler)
            close()
        scheduler.close = closing
        self.made.append(scheduler)
        return scheduler


def infer(core: Core, name: str, value: float, version: int | None = None) -> tuple[int, list]:
    with core.lease(name, version) as lease:
        response = core.infer(lease, InferRequest({"x": np.full((1, 4), value, np.float32)}))
    return response.model_version, response.outputs["y"].tolist()


def test_a_lease_resolves_the_version_once_and_infer_runs_it(tmp_path):
    fp32_model(tmp_path, "m", versions=(1, 3), version_policy={"all": {}})
    core = make_core(tmp_path)
    core.load("m", "m")
    assert infer(core, "m", 1.0) == (3, [[2.0] * 4])  # the latest
    assert infer(core, "m", 1.0, version=1) == (1, [[2.0] * 4])
    with pytest.raises(ModelNotFound, match="model 'm' has no version 2"):
        core.lease("m", 2)
    with pytest.raises(ModelNotFound, match="model 'absent' is not loaded"):
        core.lease("absent")


def test_requests_that_arrived_together_each_answer_under_their_own_lease(tmp_path):
    """Each item of `infer_all` comes while its lease still holds the model, and a model is measured
    again only then: measured after its lease let go, an unloaded model was charged again for ever
    (the soak's cache filled with models that no longer existed)."""
    fp32_model(tmp_path, "m")
    core = make_core(tmp_path)
    core.load("m", "m")
    registry, measured = core._registry, []
    remeasure = registry.remeasure
    # the leases holding the model as it is measured (a measurement under way holds it too)
    registry.remeasure = lambda model: measured.append(model.in_flight - (model.measuring is not None)) or remeasure(model)
    leases = core.leases("m", None, [None, None, None])
    for lease in leases:
        lease.__enter__()
    requests = [InferRequest({"x": np.full((1, 4), n, np.float32)}) for n in (1, 2)] + [InferRequest({"z": np.ones((1, 4))})]
    answered = {}
    for position, result in core.infer_all(leases, requests):
        answered[position] = result
        leases[position].__exit__()
    assert [answered[p].outputs["y"].tolist() for p in (0, 1)] == [[[2.0] * 4], [[4.0] * 4]]
    assert isinstance(answered[2], InvalidInput)
    assert measured == [2, 1]  # the refused request left first; each measure under a lease
    registry.settle()  # the measurement holds the model while it runs, after the requests were answered
    assert registry.models["m"].in_flight == 0


def test_a_request_is_answered_while_its_model_is_measured_again_and_an_unload_waits_for_the_measure(tmp_path, monkeypatch):
    """Measuring a model's memory again (a handler model's workers through /proc, ~5 ms) runs beside the
    request that asked for it: its answer does not wait. The measurement holds the model, so an unload waits
    for it (a model measured after it was freed would be charged again, for ever)."""
    fp32_model(tmp_path, "m")
    core = make_core(tmp_path)
    core.load("m", "m")
    registry, entered, gate = core._registry, threading.Event(), threading.Event()
    measure = registry_module._memory

    def held(backends):  # on a thread
        entered.set()
        assert gate.wait(60)
        return measure(backends)

    monkeypatch.setattr(registry_module, "_memory", held)
    try:
        assert gevent.spawn(infer, core, "m", 1.0).get(timeout=30) == (1, [[2.0] * 4])  # the gate still shut
        poll(entered.is_set, 30, "the model was not measured again")
        unloading = gevent.spawn(core.unload, "m")
        poll(lambda: registry.models["m"].state is State.UNLOADING, 30, "the unload did not start")
        take_turns()
        assert not unloading.ready() and registry.models["m"].in_flight == 1  # the measurement's hold
    finally:
        gate.set()
    unloading.get(timeout=30)
    assert "m" not in registry.models and registry.cache.used("cpu") == 0


SCHEDULED = {
    "without batching": lambda root: fp32_model(root, "m"),
    "batched": lambda root: fp32_model(root, "m", dynamic_batching={}),
    "batched, with a queue timeout": lambda root: fp32_model(
        root, "m", dynamic_batching={"default_queue_policy": {"default_timeout_microseconds": 60_000_000}}),
    "batched in order": lambda root: fp32_model(root, "m", dynamic_batching={"preserve_ordering": True}),
    "a python model": lambda root: python_model(root, "m", DOUBLE_PY, {"max_batch_size": 8, "input": [tensor("x", "TYPE_FP32", [4])],
                                                                       "output": [tensor("y", "TYPE_FP32", [4])]}),
}


@pytest.mark.parametrize("scheduled", SCHEDULED)
def test_a_request_of_a_closed_connection_or_with_its_ticket_cancelled_never_runs(tmp_path, scheduled):
    """A request whose connection's Client closed (its HTTP client hung up), or whose own Ticket was cancelled
    (one call of a gRPC group), is Cancelled without running; the request beside them runs; a group of such
    requests only is answered too. (A batcher answered a request cancelled before it was queued where nobody
    waited for it: a group of such requests hung for ever, its leases held.)"""
    SCHEDULED[scheduled](tmp_path)
    core = make_core(tmp_path)
    core.load("m", "m")
    answered = answer_group(core, [_gone(), None, None], [None, _cancelled(), None])
    assert isinstance(answered[0], Cancelled) and isinstance(answered[1], Cancelled)
    assert answered[2].outputs["y"].tolist() == [[6.0] * 4]
    answered = answer_group(core, [_gone(), None, _gone()], [None, _cancelled(), None])
    assert all(isinstance(answer, Cancelled) for answer in answered.values())
    [(_, _, statistics)] = core.stats()
    assert statistics.execution_count == 1


def answer_group(core: Core, clients: list[Client | None], tickets: list[Ticket | None]) -> dict[int, object]:
    """Each answer of a group to model "m" whose i-th request, of rows of i + 1, comes from `clients[i]`
    with `tickets[i]`, within a deadline."""
    leases = core.leases("m", None, clients)
    for lease in leases:
        lease.__enter__()
    requests = [InferRequest({"x": np.full((1, 4), i + 1, np.float32)}, ticket=ticket) for i, ticket in enumerate(tickets)]
    answered = {}
    with gevent.Timeout(30):
        for position, result in core.infer_all(leases, requests):
            answered[position] = result
            leases[position].__exit__()
    return answered


def _gone() -> Client:
    client = Client()
    client.close()
    return client


def _cancelled() -> Ticket:
    ticket = Ticket()
    ticket.cancel()
    return ticket


def test_a_batching_models_group_runs_once_and_each_request_counts_as_one(tmp_path):
    """Requests that came together to a TorchScript model with dynamic batching queue as one merge: one
    execution of all their rows, each request its own rows back, and the statistics count each request as
    Triton counts them (success and inference count a request's, execution count and batch size the run's)."""
    fp32_model(tmp_path, "m", dynamic_batching={})
    core = make_core(tmp_path)
    core.load("m", "m")
    leases = core.leases("m", None, [None, None, None])
    for lease in leases:
        lease.__enter__()
    requests = [InferRequest({"x": np.full((rows, 4), value, np.float32)}) for value, rows in ((1, 1), (2, 2), (3, 1))]
    answered = {}
    for position, result in core.infer_all(leases, requests):
        answered[position] = result
        leases[position].__exit__()
    assert [answered[p].outputs["y"].tolist() for p in range(3)] == [[[2.0] * 4], [[4.0] * 4] * 2, [[6.0] * 4]]
    [(_, _, statistics)] = core.stats()
    assert (statistics.execution_count, list(statistics.batches)) == (1, [4])
    assert (statistics.success.count, statistics.inference_count) == (3, 4)


def test_a_front_end_words_each_miss_itself(tmp_path):
    fp32_model(tmp_path, "m")
    core = make_core(tmp_path)
    core.load("m", "m")
    words = lambda name, *version: ModelNotFound(f"{name} {version}")  # noqa: E731
    with pytest.raises(ModelNotFound, match=r"^m \(7,\)$"):
        core.lease("m", 7, not_found=words)
    with pytest.raises(ModelNotFound, match=r"^other \(\)$"):
        core.lease("other", not_found=words)


def test_a_handler_model_refuses_tensors_in_one_place(tmp_path):
    handler_model(tmp_path, "h", module=Scale())
    core = make_core(tmp_path)
    core.load("h", "h")
    try:
        with core.lease("h") as lease:
            assert not lease.takes_tensors
            with pytest.raises(InvalidRequest, match="SageMaker handler model: it takes a request body"):
                core.infer(lease, InferRequest({"x": np.ones((1, 4), np.float32)}))
    finally:
        core.unload("h")


def test_an_unload_waits_for_the_lease_and_then_closes_the_scheduler(tmp_path):
    fp32_model(tmp_path, "m")
    closings = Closings()
    core = make_core(tmp_path, schedulers=closings)
    core.load("m", "m")
    with core.lease("m") as lease:
        unloading = gevent.spawn(core.unload, "m")
        take_turns()
        assert not unloading.ready() and core.state("m") is State.UNLOADING
        assert lease.model.versions, "the model was freed under its lease"
    unloading.get(timeout=30)
    take_turns()
    assert closings.closed == closings.made and len(closings.made) == 1
    assert core.state("m") is None


@pytest.mark.parametrize("batching, message", [
    ({"priority_levels": 2, "default_priority_level": 3}, "default_priority_level must be within 1..2"),
    ({"priority_levels": 2, "default_priority_level": 1, "priority_queue_policy": {"5": {"max_queue_size": 1}}},
     "priority_queue_policy names priority level 5; levels are 1..2"),  # as Triton refuses it
])
def test_a_config_the_scheduler_refuses_fails_the_load_and_frees_it(tmp_path, batching, message):
    fp32_model(tmp_path, "bad", dynamic_batching=batching)
    core = make_core(tmp_path)
    with pytest.raises(InvalidModel, match=message):
        core.load("bad", "bad")
    assert core.state("bad") is None and message in core.failure("bad")
    assert core.memory()["cpu"][1] == 0


def test_a_reload_serves_the_old_copy_until_the_new_one_serves(tmp_path):
    fp32_model(tmp_path, "m")
    closings = Closings()
    core = make_core(tmp_path, schedulers=closings)
    old = core.load("m", "m")
    with core.lease("m") as lease:
        reloading = gevent.spawn(core.reload, "m")
        poll(lambda: not core.model_is_current(old), message="the new copy did not serve")  # it loads on threads
        # the new copy takes new requests; the old one finishes this one before it is freed
        assert infer(core, "m", 2.0)[1] == [[4.0] * 4]
        assert lease.view is old and lease.model.state is State.UNLOADING and lease.model.versions
        assert not reloading.ready()
    new = reloading.get(timeout=30)
    take_turns()
    assert new is not old and core.model_is_current(new) and not core.model_is_current(old)
    assert closings.closed == [closings.made[0]]
    assert infer(core, "m", 2.0)[1] == [[4.0] * 4]


def test_concurrent_first_uses_share_one_load(tmp_path):
    fp32_model(tmp_path, "m")
    core = make_core(tmp_path)
    leases = [gevent.spawn(core.lease_loading, "m", "m") for _ in range(3)]
    models = {lease.get(timeout=30).model for lease in leases}
    assert len(models) == 1 and core.counters.loads == 1
    assert (core.counters.misses, core.counters.hits) == (1, 2)


def test_a_second_load_of_a_name_is_a_conflict(tmp_path):
    fp32_model(tmp_path, "m")
    core = make_core(tmp_path)
    core.load("m", "m")
    with pytest.raises(ModelConflict, match="already loaded"):
        core.load("m", "m")


def test_a_load_evicts_the_idle_model_it_needs_room_from_and_never_a_leased_one(tmp_path):
    sized_model(tmp_path, "first", 24)
    sized_model(tmp_path, "second", 24)
    closings = Closings()
    core = make_core(tmp_path, budget=40 * MIB, schedulers=closings)
    first = core.load("first", "first")
    with core.lease("first"):
        with pytest.raises(InsufficientMemory):
            core.load("second", "second")  # the only model that could make room is in use
    assert core.model_is_current(first) and core.failure("second")
    core.load("second", "second")
    take_turns()
    assert core.state("first") is None and not core.model_is_current(first)
    assert closings.made[0] in closings.closed
    assert [m.name for m in core.ready()] == ["second"]


def test_a_model_holding_a_sequences_state_is_not_idle_to_the_cache(tmp_path):
    """Evicting it would lose its clients' state, and their next request would be refused as a sequence never
    started (a chaos run saw those 400s); once the sequence ends, it is idle again."""
    fp32_model(tmp_path, "counter", Sized(24), sequence_batching={"max_sequence_idle_microseconds": 3_600_000_000})
    sized_model(tmp_path, "other", 24)
    core = make_core(tmp_path, budget=40 * MIB)
    core.load("counter", "counter")

    def step(**flags):
        with core.lease("counter") as lease:
            request = InferRequest({"x": np.ones((1, 4), np.float32)}, parameters={"sequence_id": 7, **flags})
            return core.infer(lease, request).outputs["y"].tolist()

    assert step(sequence_start=True) == [[2.0] * 4]
    with pytest.raises(InsufficientMemory, match="busy"):
        core.load("other", "other")
    assert step() == [[2.0] * 4] and step(sequence_end=True) == [[2.0] * 4]
    core.load("other", "other")
    assert [m.name for m in core.ready()] == ["other"]


def test_an_ensemble_whose_steps_disagree_on_a_tensors_shape_is_refused_at_load(tmp_path):
    """A model without batching feeding one with it: the ensemble loaded, and then failed every request."""
    fp32_model(tmp_path, "plain", max_batch_size=0)
    fp32_model(tmp_path, "batched")
    x, y = tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])
    ensemble(tmp_path, "pipeline", [x], [y], [ensemble_step("plain", {"x": "x"}, {"y": "mid"}),
                                              ensemble_step("batched", {"x": "mid"}, {"y": "y"})])
    core = make_core(tmp_path)
    with pytest.raises(InvalidModel, match=r"tensor 'mid' is FP32\[4\] as output 'y' of step 'plain' but FP32\[-1, 4\]"):
        core.load("pipeline", "pipeline")
    assert [m.name for m in core.ready()] == []  # the steps its load loaded leave with it


def test_a_sticky_device_error_turns_health_red_and_asks_for_a_fresh_process(tmp_path):
    """The HTTP face answers health with `check_health`; the real server's restart is in
    tests/integration/test_device_faults.py."""
    fp32_model(tmp_path, "faulty", Faults(), dims=(1,))
    core = make_core(tmp_path)
    faults = []
    core._registry.on_fault = faults.append  # the server sends itself SIGTERM here
    core.load("faulty", "faulty")
    with core.lease("faulty") as lease:
        assert core.infer(lease, InferRequest({"x": np.ones((1, 1), np.float32)})).outputs["y"].tolist() == [[1.0]]
    core.check_health()
    with core.lease("faulty") as lease, pytest.raises(DeviceFault, match="illegal memory access"):
        core.infer(lease, InferRequest({"x": -np.ones((1, 1), np.float32)}))
    assert len(faults) == 1 and "CUDA context is unusable" in faults[0]
    with pytest.raises(Unavailable, match="restarting its worker"):
        core.check_health()


def test_a_use_waiting_for_a_load_is_served_by_it_though_an_unload_was_sent_first(tmp_path):
    """A first use loads a model; an unload is sent, then a second use comes: both wait for the load. When
    it ends, the unload's turn comes first, and the cache may look for room: the waiting use is a request in
    flight, so the unload waits for it and the model is not idle to the cache. (The use found it unloading,
    loaded it again, and after three such turns under churn answered 503.)"""
    fp32_model(tmp_path, "m")
    core = make_core(tmp_path)
    registry, serve = core._registry, core._registry.serve
    serving, answer, idle = gevent.event.Event(), gevent.event.Event(), []

    def gated_serve(model):
        serving.wait()
        serve(model)
        idle.append(registry._evictable(model))
    registry.serve = gated_serve

    def use():
        with core.lease_loading("m", "m") as lease:
            answer.wait()
            return lease.view, core.infer(lease, InferRequest({"x": np.ones((1, 4), np.float32)})).outputs["y"].tolist()
    uses = [gevent.spawn(use)]
    poll(lambda: core.state("m") is State.LOADING and registry.under_way("m").versions, message="the load did not run")
    unloading = gevent.spawn(core.unload, "m")
    take_turns()
    uses.append(gevent.spawn(use))
    take_turns()
    serving.set()
    poll(lambda: idle, message="the load did not end")
    take_turns()
    assert not unloading.ready() and idle == [False]
    answer.set()
    (first, y), (second, z) = (use.get(timeout=30) for use in uses)
    assert first is second and y == z == [[2.0] * 4]
    unloading.get(timeout=30)
    assert core.state("m") is None and core.counters.loads == 1


def test_a_stop_ends_every_load_under_way_with_a_retry_and_refuses_later_ones(tmp_path):
    """At a stop, a load under way (here stuck in its load thread), the requests sharing it and an ensemble
    whose step it is are each told to retry, at once: not that the ensemble is invalid, and not behind the
    stuck load threads (every one of them here), which freeing what the loads held would wait for."""
    fp32_model(tmp_path, "step")
    fp32_model(tmp_path, "alone")
    x, y = tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])
    ensemble(tmp_path, "pipeline", [x], [y], [ensemble_step("step", {"x": "x"}, {"y": "y"})])
    core = make_core(tmp_path, load_threads=2)
    stuck, entered = threading.Event(), []
    load_backends = core._registry.runtime.load_backends

    def stuck_load(name, source, device):
        if name != "pipeline":
            entered.append(name)
            stuck.wait(60)
        return load_backends(name, source, device)
    core._registry.runtime = dataclasses.replace(core._registry.runtime, load_backends=stuck_load)
    try:
        loads = [gevent.spawn(core.load, "pipeline", "pipeline"), gevent.spawn(core.load, "alone", "alone")]
        poll(lambda: sorted(entered) == ["alone", "step"], message="the loads did not reach their threads")
        sharing = gevent.spawn(core.lease_loading, "alone", "alone")
        take_turns()
        core.stop_loading("stopping; retry")
        gevent.joinall([*loads, sharing], timeout=30)
        for greenlet in [*loads, sharing]:
            assert isinstance(greenlet.exception, Unavailable) and str(greenlet.exception) == "stopping; retry"
        with pytest.raises(Unavailable, match="stopping; retry"):
            core.load("step", "step")
        assert core.ready() == [] and core.failure("alone") == "stopping; retry"
    finally:
        stuck.set()


def test_a_load_that_waited_out_an_unload_of_its_name_across_a_stop_is_refused(tmp_path):
    """A load of a name being unloaded waits for the unload (which waits for its requests) before it
    begins. The stop came meanwhile: the load went on and answered 200 on a process about to exit (seen in
    the chaos scenario's stop), so a restarted model process never had the model its client was told of."""
    fp32_model(tmp_path, "m")
    core = make_core(tmp_path)
    core.load("m", "m")
    with core.lease("m"):
        unloading = gevent.spawn(core.unload, "m")
        take_turns()
        loading = gevent.spawn(core.load, "m", "m")
        take_turns()
        assert core.state("m") is State.UNLOADING and not loading.ready()
        core.stop_loading("stopping; retry")
    unloading.get(timeout=30)
    with pytest.raises(Unavailable, match="stopping; retry"):
        loading.get(timeout=30)
    assert core.state("m") is None


def test_a_load_the_stop_came_to_as_it_ended_is_not_served(tmp_path):
    """The stop tells a load under way through its greenlet, at the loop's next turn: a load that ended
    before that turn was served, and its client told it had loaded on a process about to exit."""
    fp32_model(tmp_path, "m")
    core = make_core(tmp_path)
    registry, serve = core._registry, core._registry.serve

    def stop_then_serve(model):
        core.stop_loading("stopping; retry")
        serve(model)
    registry.serve = stop_then_serve
    with pytest.raises(Unavailable, match="stopping; retry"):
        core.load("m", "m")
    assert core.state("m") is None and core.failure("m") == "stopping; retry"
