"""The schedulers on their own, with a backend whose executions the test holds and releases, so
batching, priorities, timeouts and parallelism are decided by events, never by timing."""

import socket
import threading

import gevent
import numpy as np
import pytest
from gevent.socket import wait_read
from google.protobuf import json_format

from container import kept
from container.errors import Cancelled, DeviceOutOfMemory, QueueFull, QueueTimeout
from container.inference import Client
from container.models.statistics import Statistics
from container.models.triton_schema import model_config_pb2 as pb
from container.scheduling import direct, dynamic, scheduler_for
from container.scheduling.base import as_done, preferred_sizes
from container.scheduling.inline import INLINE_WINDOW
from container.scheduling.job import Job
from container.scheduling.sequence import Turn
from tests.builders import poll, take_turns

fulfil = dynamic._fulfil


class HeldBackend:
    """execute() doubles its input; while `hold` is set, each execution waits for `release`."""

    def __init__(self):
        self.batches: list[list[float]] = []
        self.inputs: list[dict] = []
        self.running = 0
        self.most_running = 0
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.hold = True
        self._lock = threading.Lock()

    def execute(self, inputs, outputs, phases):
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        self.entered.release()
        self._held()
        with self._lock:
            self.running -= 1
            self.batches.append(inputs["x"][:, 0].tolist())
            self.inputs.append(inputs)
        return {"y": inputs["x"] * 2}

    def _held(self) -> None:
        if self.hold:
            assert self.release.wait(30), "the test never released the backend"

    def wait_entered(self, count=1):
        for _ in range(count):
            poll(lambda: self.entered.acquire(blocking=False), message="no execution started")


def config(**fields) -> pb.ModelConfig:
    document = {"max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1]}],
                "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1]}], **fields}
    return json_format.ParseDict(document, pb.ModelConfig())


def job(backend, value: float, rows=1, width=1, **parameters) -> Job:
    return Job(backend, Statistics(), {"x": np.full((rows, width), value, np.float32)}, None, rows, parameters)


def spawn(scheduler, *jobs):
    greenlets = [gevent.spawn(scheduler.infer, j) for j in jobs]
    gevent.sleep(0)  # let them queue
    return greenlets


def spawn_announced(scheduler, *jobs):
    """Requests whose headers were all read before the first is queued; each leaves once answered."""
    announcements = [scheduler.request() for _ in jobs]
    for announcement in announcements:
        announcement.__enter__()

    def infer(announcement, job):
        try:
            return scheduler.infer(job)
        finally:
            announcement.__exit__(None, None, None)

    greenlets = [gevent.spawn(infer, a, j) for a, j in zip(announcements, jobs, strict=True)]
    gevent.sleep(0)  # let them queue
    return greenlets


def values(greenlet) -> list[float]:
    return greenlet.get(timeout=30)[0]["y"][:, 0].tolist()


@pytest.fixture
def backend():
    backend = HeldBackend()
    yield backend
    backend.release.set()


def start_blocked(scheduler, backend):
    """Occupy the one instance so that what comes next has to queue."""
    first = spawn(scheduler, job(backend, -1))[0]
    backend.wait_entered()
    return first


def behind_one(scheduler, backend, jobs: list[Job]) -> dict:
    """`infer_all(jobs)` queued behind a request that holds the one instance, which is then let go: each
    position's result."""
    first = start_blocked(scheduler, backend)
    group = gevent.spawn(lambda: dict(scheduler.infer_all(jobs)))
    poll(lambda: scheduler.queue_depth() == len(jobs), message="the group did not queue")
    backend.release.set()
    first.get(timeout=30)
    return group.get(timeout=30)


def answered_one_by_one(monkeypatch) -> list[Job]:
    """Each queued job the dynamic batcher hands a result to, as it does."""
    answered = []
    monkeypatch.setattr(dynamic, "_fulfil", lambda *args: (answered.append(args[0]), fulfil(*args)))
    return answered


def test_a_lone_request_does_not_wait_for_the_queue_delay(backend):
    backend.hold = False
    scheduler = scheduler_for("m", config(dynamic_batching={"max_queue_delay_microseconds": 3_600_000_000}))
    with gevent.Timeout(10):  # an hour's delay would trip this
        assert values(spawn(scheduler, job(backend, 1))[0]) == [2.0]
    scheduler.close()


def test_requests_on_their_way_are_waited_for(backend):
    """Two requests have had their headers read; the first to be queued waits for the second, however
    often the loop turns, and they run as one batch."""
    scheduler = scheduler_for("m", config(dynamic_batching={"max_queue_delay_microseconds": 3_600_000_000}))
    with scheduler.request(), scheduler.request():
        first = spawn(scheduler, job(backend, 1))[0]
        for _ in range(100):
            gevent.sleep(0)
        assert not backend.entered.acquire(blocking=False), "the batch left without the request on its way"
        second = spawn(scheduler, job(backend, 2))[0]
        backend.release.set()
        assert values(first) == [2.0] and values(second) == [4.0]
    assert backend.batches == [[1.0, 2.0]]
    scheduler.close()


def test_a_request_that_never_comes_is_waited_for_only_the_delay(backend):
    backend.hold = False
    scheduler = scheduler_for("m", config(dynamic_batching={"max_queue_delay_microseconds": 1000}))
    with scheduler.request(), scheduler.request():
        assert values(spawn(scheduler, job(backend, 1))[0]) == [2.0]
    assert backend.batches == [[1.0]]
    scheduler.close()


def connection(requests: int) -> Client:
    """A client connection that has carried `requests` requests so far."""
    client = Client()
    client.requests = requests
    return client


def answered(scheduler, client: Client) -> None:
    """One of `client`'s requests was answered just now."""
    with scheduler.request(client):
        pass


def infer_as(scheduler, client: Client, request: Job):
    """`request` from `client`, counted on its way from its lease to its answer."""
    def infer():
        with scheduler.request(client):
            return scheduler.infer(request)
    greenlet = gevent.spawn(infer)
    gevent.sleep(0)
    return greenlet


def test_a_client_answered_within_the_delay_is_waited_for_until_it_comes_back(backend):
    """A kept connection answered a moment ago is expected back: another client's request waits for it,
    however often the loop turns, and the two run as one batch."""
    scheduler = scheduler_for("m", config(dynamic_batching={"max_queue_delay_microseconds": 3_600_000_000}))
    returning, other = connection(2), connection(1)
    answered(scheduler, returning)
    waiting = infer_as(scheduler, other, job(backend, 1))
    for _ in range(100):
        gevent.sleep(0)
    assert not backend.entered.acquire(blocking=False), "the batch left without the client expected back"
    back = infer_as(scheduler, returning, job(backend, 2))
    backend.release.set()
    assert values(waiting) == [2.0] and values(back) == [4.0]
    assert backend.batches == [[1.0, 2.0]]
    scheduler.close()


def test_a_client_expected_back_is_not_waited_for_once_it_closes(backend):
    backend.hold = False
    scheduler = scheduler_for("m", config(dynamic_batching={"max_queue_delay_microseconds": 3_600_000_000}))
    gone = connection(2)
    answered(scheduler, gone)
    waiting = infer_as(scheduler, connection(1), job(backend, 1))
    gone.close()
    with gevent.Timeout(10):  # an hour's delay would trip this
        assert values(waiting) == [2.0]
    scheduler.close()


def test_a_connection_used_for_one_request_is_not_expected_back(backend):
    """A client that opens a connection per request leaves each one open until it is collected: were
    that connection waited for, every request of one such client would wait out the delay."""
    backend.hold = False
    scheduler = scheduler_for("m", config(dynamic_batching={"max_queue_delay_microseconds": 3_600_000_000}))
    answered(scheduler, connection(1))
    with gevent.Timeout(10):
        assert values(infer_as(scheduler, connection(1), job(backend, 1))) == [2.0]
    scheduler.close()


def test_queued_requests_merge_and_each_gets_its_own_rows(backend):
    scheduler = scheduler_for("m", config(dynamic_batching={}))
    first = start_blocked(scheduler, backend)
    queued = spawn(scheduler, job(backend, 1), job(backend, 2, rows=3), job(backend, 3, rows=2))
    backend.release.set()
    assert values(first) == [-2.0]
    assert [values(g) for g in queued] == [[2.0], [4.0] * 3, [6.0] * 2]
    assert backend.batches == [[-1.0], [1.0, 2.0, 2.0, 2.0, 3.0, 3.0]]  # one execution for all three
    scheduler.close()


class Gated(HeldBackend):
    """Each execution waits for a pass of its own. It announces itself once, as it enters: announcing
    again as it left let a test's wait for the next execution return on the last one's way out."""

    def __init__(self):
        super().__init__()
        self.passes = threading.Semaphore(0)

    def _held(self) -> None:
        assert self.passes.acquire(timeout=30), "the test never let the execution through"


def test_a_freed_instance_takes_the_requests_the_loop_has_received_before_it_cuts_a_batch(monkeypatch):
    """A client answered by one batch sends its next request at once; the loop has it before the next
    batch is cut, so it runs with the request queued meanwhile, not in a batch of its own. The wait for
    the loop is bounded by wall time (the next test): unbounded here, so that a loaded machine that
    preempts this process for 2 ms cannot cut the batch early."""
    monkeypatch.setattr(dynamic, "GATHER_LIMIT", None)
    backend = Gated()
    scheduler = scheduler_for("m", config(dynamic_batching={}))

    def closed_loop_client():
        with scheduler.request():
            scheduler.infer(job(backend, 0))
        with scheduler.request():
            return scheduler.infer(job(backend, 2))

    blocker = start_blocked(scheduler, backend)
    client = gevent.spawn(closed_loop_client)
    gevent.sleep(0)  # its first request queues behind the blocker
    backend.passes.release()
    backend.wait_entered()  # its first request executes ...
    queued = spawn_announced(scheduler, job(backend, 1))  # ... while another queues
    backend.passes.release(3)
    assert values(blocker) == [-2.0] and values(client) == [4.0] and values(queued[0]) == [2.0]
    assert backend.batches == [[-1.0], [0.0], [1.0, 2.0]]
    scheduler.close()


def test_a_busy_loop_holds_a_free_instance_back_only_briefly(backend):
    """The loop is never idle while a socket is always ready to read; the batch leaves all the same."""
    scheduler = scheduler_for("m", config(dynamic_batching={}))
    reader, writer = socket.socketpair()
    writer.send(b"x")
    busy = gevent.spawn(lambda: [wait_read(reader.fileno()) for _ in iter(int, 1)])
    try:
        first = start_blocked(scheduler, backend)
        with scheduler.request(), scheduler.request():  # another on its way: the freed instance waits for the loop
            queued = spawn(scheduler, job(backend, 1))[0]
            backend.release.set()
            with gevent.Timeout(10):
                assert values(first) == [-2.0] and values(queued) == [2.0]
    finally:
        busy.kill()
        reader.close()
        writer.close()
    scheduler.close()


def test_different_shapes_never_merge_and_max_batch_size_holds(backend):
    scheduler = scheduler_for("m", config(max_batch_size=4, dynamic_batching={}))
    first = start_blocked(scheduler, backend)
    queued = spawn(scheduler, job(backend, 1, rows=3), job(backend, 2, width=2), job(backend, 3, rows=2), job(backend, 4))
    backend.release.set()
    [g.get(timeout=30) for g in [first, *queued]]
    assert backend.batches == [[-1.0], [1.0, 1.0, 1.0, 4.0], [2.0], [3.0, 3.0]]
    scheduler.close()


def test_preferred_batch_size_cuts_the_batch(backend):
    scheduler = scheduler_for("m", config(dynamic_batching={"preferred_batch_size": [2, 4]}))
    first = start_blocked(scheduler, backend)
    queued = spawn(scheduler, *[job(backend, i) for i in range(1, 6)])
    backend.release.set()
    [g.get(timeout=30) for g in [first, *queued]]
    assert backend.batches == [[-1.0], [1.0, 2.0, 3.0, 4.0], [5.0]]
    scheduler.close()


def test_higher_priority_runs_first(backend):
    scheduler = scheduler_for("m", config(max_batch_size=1, dynamic_batching={"priority_levels": 2, "default_priority_level": 2}))
    first = start_blocked(scheduler, backend)
    queued = spawn(scheduler, job(backend, 1), job(backend, 2, priority=2), job(backend, 3, priority=1), job(backend, 4, priority=1))
    backend.release.set()
    [g.get(timeout=30) for g in [first, *queued]]
    assert backend.batches == [[-1.0], [3.0], [4.0], [1.0], [2.0]]
    scheduler.close()


def test_a_priority_past_the_levels_waits_at_the_default_level(backend):
    """As Triton sets a request's priority: 0, or past the model's levels, is the default level."""
    scheduler = scheduler_for("m", config(max_batch_size=1, dynamic_batching={"priority_levels": 2, "default_priority_level": 2}))
    first = start_blocked(scheduler, backend)
    queued = spawn(scheduler, job(backend, 1, priority=3), job(backend, 2, priority=1), job(backend, 3, priority=2))
    backend.release.set()
    [g.get(timeout=30) for g in [first, *queued]]
    assert backend.batches == [[-1.0], [2.0], [1.0], [3.0]]  # priority 3 queued at level 2, before the later 2
    scheduler.close()


def test_a_full_queue_answers_503_at_once(backend):
    scheduler = scheduler_for("m", config(dynamic_batching={"default_queue_policy": {"max_queue_size": 2}}))
    first = start_blocked(scheduler, backend)
    queued = spawn(scheduler, job(backend, 1), job(backend, 2))
    with pytest.raises(QueueFull, match="^Exceeds maximum queue size: ") as refused:  # Triton's words, then ours
        scheduler.infer(job(backend, 3))
    assert refused.value.status == 503 and "Retry-After" in refused.value.headers
    backend.release.set()
    [g.get(timeout=30) for g in [first, *queued]]
    scheduler.close()


def test_a_request_past_its_queue_timeout_is_rejected_and_never_runs(backend):
    policy = {"default_timeout_microseconds": 1000, "allow_timeout_override": True}
    scheduler = scheduler_for("m", config(dynamic_batching={"default_queue_policy": policy}))
    first = start_blocked(scheduler, backend)
    with pytest.raises(QueueTimeout, match="^Request timeout expired: .*queue timeout"):  # Triton's words, then ours
        scheduler.infer(job(backend, 1))
    patient = spawn(scheduler, job(backend, 2, timeout=0))[0]  # 0: no override, the 1 ms default holds
    patient.join(timeout=30)  # the instance is held: only its timeout can end it
    with pytest.raises(QueueTimeout):
        patient.get()
    backend.release.set()
    first.get(timeout=30)
    assert backend.batches == [[-1.0]]  # neither timed-out request was executed late
    scheduler.close()


def test_delay_serves_expired_requests_after_the_others(backend):
    # An hour by default, so that however slow the machine only the request asking for 1 ms expires.
    policy = {"default_timeout_microseconds": 3_600_000_000, "allow_timeout_override": True,
              "timeout_action": "DELAY"}
    scheduler = scheduler_for("m", config(max_batch_size=1, dynamic_batching={"default_queue_policy": policy}))
    first = start_blocked(scheduler, backend)
    expiring = job(backend, 1, timeout=1000)
    late = spawn(scheduler, expiring)[0]
    poll(lambda: expiring.delayed, message="the 1 ms queue timeout did not pass")  # while the instance is held
    on_time = spawn(scheduler, job(backend, 2))
    backend.release.set()
    [g.get(timeout=30) for g in [first, late, *on_time]]
    assert backend.batches[1:] == [[2.0], [1.0]]
    scheduler.close()


def test_instances_execute_in_parallel(backend):
    scheduler = scheduler_for("m", config(instance_group=[{"count": 2, "kind": "KIND_CPU"}]))
    running = spawn(scheduler, job(backend, 1), job(backend, 2))
    backend.wait_entered(2)  # both are inside execute at once
    assert backend.most_running == 2
    backend.release.set()
    assert sorted(values(g)[0] for g in running) == [2.0, 4.0]
    scheduler.close()


def test_preserve_ordering_answers_in_arrival_order(backend):
    scheduler = scheduler_for("m", config(max_batch_size=1, instance_group=[{"count": 2}],
                                          dynamic_batching={"preserve_ordering": True}))
    slow = spawn(scheduler, job(backend, 1))[0]
    backend.wait_entered()
    backend.hold = False
    fast = spawn(scheduler, job(backend, 2))[0]
    poll(lambda: backend.batches, message="the second request did not run")  # it finished first …
    take_turns()
    assert not fast.ready()  # … but is held back until the first is answered
    backend.release.set()
    assert values(slow) == [2.0] and values(fast) == [4.0]
    scheduler.close()


def test_a_client_that_gives_up_while_queued_is_not_executed(backend):
    scheduler = scheduler_for("m", config(dynamic_batching={}))
    first = start_blocked(scheduler, backend)
    gone = spawn(scheduler, job(backend, 1))[0]
    gone.kill()
    backend.release.set()
    first.get(timeout=30)
    assert backend.batches == [[-1.0]]
    scheduler.close()


def test_requests_that_came_together_wait_in_greenlets_kept_from_one_group_to_the_next():
    """Each request of a group may wait in a greenlet (as_done: for its turn on a thread, for a model too
    slow for the event loop). A greenlet that ends unmaps the frame stack its start mapped
    (container/kept.py): 18% of the model process's time once a request, so the next group's requests wait
    in the greenlets of the last."""
    first = dict(as_done(lambda _: gevent.getcurrent(), range(8)))
    second = dict(as_done(lambda _: gevent.getcurrent(), range(8)))
    assert len(set(first.values())) == 8
    assert set(second.values()) == set(first.values())


def test_a_request_cancelled_in_its_queued_group_is_not_run_and_the_others_are(backend):
    """Requests that came together wait in greenlets of their own (as_done): a cancelled one is dropped
    from the batch it would have joined (Triton's request cancellation), and only it."""
    scheduler = scheduler_for("m", config(dynamic_batching={}))
    first = start_blocked(scheduler, backend)
    jobs = [job(backend, value) for value in (1, 2, 3)]
    group = gevent.spawn(lambda: dict(scheduler.infer_all(jobs)))
    poll(lambda: scheduler.queue_depth() == 3, message="the group did not queue")
    jobs[1].cancel()
    backend.release.set()
    first.get(timeout=30)
    results = group.get(timeout=30)
    assert backend.batches == [[-1.0], [1.0, 3.0]]
    assert results[0][0]["y"].ravel().tolist() == [2.0] and results[2][0]["y"].ravel().tolist() == [6.0]
    assert isinstance(results[1], Cancelled)
    scheduler.close()


def test_a_queued_request_whose_client_hangs_up_leaves_a_full_queue_at_once(backend):
    """Its connection's Client closes (the front-end saw the client hang up): the request is cancelled and
    gives up its place at once, so the next request is queued, not refused, and it alone runs."""
    scheduler = scheduler_for("m", config(dynamic_batching={"default_queue_policy": {"max_queue_size": 1}}))
    first = start_blocked(scheduler, backend)
    client, leaving = Client(), job(backend, 1)
    client.under_way(leaving)
    gone = spawn(scheduler, leaving)[0]
    poll(lambda: scheduler.queue_depth() == 1, message="the request did not queue")
    client.close()
    with pytest.raises(Cancelled):
        gone.get(timeout=30)
    staying = spawn(scheduler, job(backend, 3))[0]
    backend.release.set()
    first.get(timeout=30)
    assert values(staying) == [6.0] and backend.batches == [[-1.0], [3.0]]
    late = job(backend, 4)
    client.under_way(late)  # a request of a connection already closed is cancelled as it comes
    assert late.cancelled
    scheduler.close()


def test_a_batching_models_group_without_queue_timeouts_is_answered_with_no_greenlet_a_request(backend, monkeypatch):
    """Each job's result hands itself to the group (dynamic.py's `_as_set`): a greenlet waiting for each
    cost two switches a request. Priorities still order the batch."""
    monkeypatch.setattr(kept, "spawn", lambda *args: pytest.fail("a greenlet was started for a request of the group"))
    scheduler = scheduler_for("m", config(dynamic_batching={"priority_levels": 2, "default_priority_level": 2}))
    results = behind_one(scheduler, backend, [job(backend, 1), job(backend, 2, priority=1), job(backend, 3)])
    assert backend.batches == [[-1.0], [2.0, 1.0, 3.0]]
    assert [results[p][0]["y"].ravel().tolist() for p in range(3)] == [[2.0], [4.0], [6.0]]
    scheduler.close()


def test_requests_that_came_together_and_would_batch_together_queue_and_are_answered_as_one(backend, monkeypatch):
    """A group's requests of one batch key and priority are one entry of the queue and one result handed
    back (dynamic.py's merges); queue_depth still counts each request, and each is answered its own rows."""
    answered = answered_one_by_one(monkeypatch)
    scheduler = scheduler_for("m", config(dynamic_batching={}))
    jobs = [job(backend, 1), job(backend, 2, rows=2), job(backend, 3)]
    results = behind_one(scheduler, backend, jobs)
    assert backend.batches == [[-1.0], [1.0, 2.0, 2.0, 3.0]]
    assert [results[p][0]["y"][:, 0].tolist() for p in range(3)] == [[2.0], [4.0, 4.0], [6.0]]
    [merge] = answered  # the first request ran at once, from its own greenlet
    assert merge.members == jobs
    assert scheduler.queue_depth() == 0
    scheduler.close()


@pytest.mark.parametrize("batching", [{"default_queue_policy": {"max_queue_size": 8}},
                                      {"preferred_batch_size": [2], "preserve_ordering": True}])
def test_requests_are_not_merged_where_the_batcher_tells_them_apart(backend, monkeypatch, batching):
    """A bounded queue counts its entries, and a merge kept in order could not be cut to a preferred size:
    there each request of a group queues alone, as it would without one."""
    answered = answered_one_by_one(monkeypatch)
    scheduler = scheduler_for("m", config(dynamic_batching=batching))
    jobs = [job(backend, value) for value in (1, 3, 2)]
    results = behind_one(scheduler, backend, jobs)
    assert [results[p][0]["y"][:, 0].tolist() for p in range(3)] == [[2.0], [6.0], [4.0]]
    assert all(j in answered for j in jobs)
    scheduler.close()


def test_a_merge_is_cut_to_the_preferred_size_its_batch_makes(backend, monkeypatch):
    """A group of three merges; the batch it makes is cut to the preferred 2 between its second request and
    its third, which goes back to the queue and runs next (job.cut), as three requests queued apart would."""
    answered = answered_one_by_one(monkeypatch)
    scheduler = scheduler_for("m", config(dynamic_batching={"preferred_batch_size": [2]}))
    jobs = [job(backend, value) for value in (1, 3, 2)]
    results = behind_one(scheduler, backend, jobs)
    assert rows_of(results) == [[2.0], [6.0], [4.0]]
    assert backend.batches == [[-1.0], [1.0, 3.0], [2.0]]
    [first, rest] = answered  # the merge's two parts, each answered (the request ahead ran from its own greenlet)
    assert first.members == jobs[:2] and rest is jobs[2]
    scheduler.close()


def test_a_merge_holds_no_more_than_the_models_largest_batch(backend):
    scheduler = scheduler_for("m", config(dynamic_batching={}))  # max_batch_size 8
    results = behind_one(scheduler, backend, [job(backend, value, rows=3) for value in (1, 2, 3, 4)])
    assert backend.batches == [[-1.0], [1.0] * 3 + [2.0] * 3, [3.0] * 3 + [4.0] * 3]
    assert [results[p][0]["y"][:, 0].tolist() for p in range(4)] == [[2.0] * 3, [4.0] * 3, [6.0] * 3, [8.0] * 3]
    scheduler.close()


def test_a_merge_whose_requests_are_all_cancelled_leaves_the_queue_at_once(backend):
    scheduler = scheduler_for("m", config(dynamic_batching={}))
    first = start_blocked(scheduler, backend)
    jobs = [job(backend, value) for value in (1, 2)]
    group = gevent.spawn(lambda: dict(scheduler.infer_all(jobs)))
    poll(lambda: scheduler.queue_depth() == 2, message="the group did not queue")
    jobs[0].cancel()
    assert scheduler.queue_depth() == 2  # the other one still waits for its batch
    jobs[1].cancel()
    assert scheduler.queue_depth() == 0
    results = group.get(timeout=30)
    assert all(isinstance(result, Cancelled) for result in results.values())
    backend.release.set()
    first.get(timeout=30)
    assert backend.batches == [[-1.0]]
    scheduler.close()


def queue_groups(scheduler, *groups: list[Job], heard=lambda position: None) -> list:
    """Each group through `infer_all`, all of them queued: a greenlet each, with its results by position.
    `heard(position)` for each answer of the last group, as it comes."""

    def answers(jobs: list[Job], heard) -> dict:
        results = {}
        for position, result in scheduler.infer_all(jobs):
            results[position] = result
            heard(position)
        return results

    greenlets = [gevent.spawn(answers, jobs, heard if jobs is groups[-1] else lambda position: None) for jobs in groups]
    poll(lambda: scheduler.queue_depth() == sum(map(len, groups)), message="the groups did not queue")
    return greenlets


def rows_of(results: dict) -> list:
    return [results[p] if isinstance(results[p], Exception) else results[p][0]["y"][:, 0].tolist() for p in sorted(results)]


def test_a_merge_too_large_for_the_room_a_batch_has_left_fills_it_and_the_rest_keeps_its_place():
    """Two groups of five merge as five each; with eight items a batch, the second gives the first batch
    its first three and keeps its place with the other two (job.cut): batches of 8 and 2 where whole
    merges made 5 and 5. The requests of the cut batch are answered with it, not after the rest (a
    batcher waiting for them to come back would wait for ever)."""
    backend = Gated()
    scheduler = scheduler_for("m", config(dynamic_batching={}))
    first = start_blocked(scheduler, backend)
    answered = []
    whole, cut_group = queue_groups(scheduler, [job(backend, v) for v in range(1, 6)], [job(backend, v) for v in range(11, 16)],
                                    heard=answered.append)
    backend.passes.release()
    backend.wait_entered()  # the batch of eight
    assert scheduler.queue_depth() == 2  # the rest, in the queue
    backend.passes.release()
    backend.wait_entered()  # the rest's batch, held ...
    poll(lambda: answered == [0, 1, 2], message="the first part was not answered with its batch")  # ... while the first part is answered
    backend.passes.release()
    assert values(first) == [-2.0]
    assert rows_of(whole.get(timeout=30)) == [[2.0 * v] for v in range(1, 6)]
    assert rows_of(cut_group.get(timeout=30)) == [[2.0 * v] for v in range(11, 16)]
    assert backend.batches == [[-1.0], [1.0, 2.0, 3.0, 4.0, 5.0, 11.0, 12.0, 13.0], [14.0, 15.0]]
    assert scheduler.queue_depth() == 0
    scheduler.close()


def test_with_preserve_ordering_a_merge_is_answered_whole_and_not_cut(backend):
    scheduler = scheduler_for("m", config(dynamic_batching={"preserve_ordering": True}))
    first = start_blocked(scheduler, backend)
    groups = queue_groups(scheduler, [job(backend, v) for v in range(1, 6)], [job(backend, v) for v in range(11, 16)])
    backend.release.set()
    assert values(first) == [-2.0]
    assert [rows_of(g.get(timeout=30)) for g in groups] == [[[2.0 * v] for v in range(1, 6)], [[2.0 * v] for v in range(11, 16)]]
    assert backend.batches == [[-1.0], [1.0, 2.0, 3.0, 4.0, 5.0], [11.0, 12.0, 13.0, 14.0, 15.0]]
    scheduler.close()


@pytest.mark.parametrize("before_the_cut", [False, True])
@pytest.mark.parametrize("ahead", [5, 4])  # the rest of the cut group: two requests, or one
def test_the_rest_of_a_cut_merge_whose_requests_are_all_cancelled_leaves_the_queue_at_once(ahead, before_the_cut):
    """Cancelled while the merge was whole or once it was cut: the requests of its rest are let go of, the
    others of the group run in the batch the cut filled."""
    backend = Gated()
    scheduler = scheduler_for("m", config(dynamic_batching={}))
    first = start_blocked(scheduler, backend)
    cut_one = [job(backend, v) for v in range(11, 16)]
    groups = queue_groups(scheduler, [job(backend, v) for v in range(1, 1 + ahead)], cut_one)
    fit = 8 - ahead

    def cancel_the_rest():
        for cancelled in cut_one[fit:]:
            cancelled.cancel()

    if before_the_cut:
        cancel_the_rest()
    backend.passes.release()
    backend.wait_entered()  # the batch of eight runs, the rest of the cut group waits
    if not before_the_cut:
        cancel_the_rest()
    assert scheduler.queue_depth() == 0
    backend.passes.release()
    assert values(first) == [-2.0]
    results = rows_of(groups[1].get(timeout=30))
    assert results[:fit] == [[2.0 * v] for v in range(11, 11 + fit)] and all(isinstance(r, Cancelled) for r in results[fit:])
    assert backend.batches == [[-1.0], [float(v) for v in range(1, 1 + ahead)] + [float(v) for v in range(11, 11 + fit)]]
    scheduler.close()


@pytest.mark.parametrize("before_the_cut", [False, True])
@pytest.mark.parametrize("rest", [1, 2])  # what the preferred size leaves of the group: one request, or a merge of two
def test_the_rest_of_a_merge_cut_to_a_preferred_size_whose_requests_are_all_cancelled_leaves_the_queue_at_once(rest, before_the_cut):
    """A group of 2 + `rest` merges; its batch is cut to the preferred 2 and the rest goes back to the queue
    (JobQueue.split). Its requests cancelled, before the cut or while the batch runs, it leaves at once."""
    backend = Gated()
    scheduler = scheduler_for("m", config(dynamic_batching={"preferred_batch_size": [2]}))
    first = start_blocked(scheduler, backend)
    jobs = [job(backend, v) for v in range(1, 3 + rest)]
    [group] = queue_groups(scheduler, jobs)

    def cancel_the_rest():
        for cancelled in jobs[2:]:
            cancelled.cancel()

    if before_the_cut:
        cancel_the_rest()
    backend.passes.release()
    backend.wait_entered()  # the batch of two runs, the rest waits in the queue
    if not before_the_cut:
        cancel_the_rest()
    assert scheduler.queue_depth() == 0
    backend.passes.release()
    assert values(first) == [-2.0]
    results = rows_of(group.get(timeout=30))
    assert results[:2] == [[2.0], [4.0]] and all(isinstance(r, Cancelled) for r in results[2:])
    assert backend.batches == [[-1.0], [1.0, 2.0]]
    scheduler.close()


class Refusing(HeldBackend):
    """Fails every execution whose batch holds 13."""

    def execute(self, inputs, outputs, phases):
        if 13 in inputs["x"]:
            raise ValueError("13 is refused")
        return super().execute(inputs, outputs, phases)


def test_a_failed_batch_fails_only_the_part_of_a_cut_merge_it_held():
    """The batch holding a merge's first part fails whole; the merge's other members, run later, are
    answered all the same."""
    backend = Refusing()
    scheduler = scheduler_for("m", config(dynamic_batching={}))
    first = start_blocked(scheduler, backend)
    groups = queue_groups(scheduler, [job(backend, v) for v in range(1, 6)], [job(backend, v) for v in range(11, 16)])
    backend.release.set()
    assert values(first) == [-2.0]
    whole, cut_one = (rows_of(g.get(timeout=30)) for g in groups)
    assert all(isinstance(r, ValueError) for r in whole + cut_one[:3])
    assert cut_one[3:] == [[28.0], [30.0]]
    assert backend.batches == [[-1.0], [14.0, 15.0]]
    scheduler.close()


def test_a_group_with_a_request_that_has_a_queue_timeout_and_requests_merged_is_answered_whole(backend, monkeypatch):
    """The timed request waits out its timeout in a greenlet, the merge of the others hands its answer
    over: one group, both ways of waiting, every position answered once."""
    waiting = []
    monkeypatch.setattr(kept, "spawn", lambda function, *args: (waiting.append(args[3]), gevent.spawn(function, *args)))
    policy = {"1": {"default_timeout_microseconds": 3_600_000_000}}  # priority 1 is timed; 2 merges
    scheduler = scheduler_for("m", config(dynamic_batching={"priority_levels": 2, "default_priority_level": 2,
                                                            "priority_queue_policy": policy}))
    jobs = [job(backend, 1), job(backend, 2, priority=1), job(backend, 3)]
    results = behind_one(scheduler, backend, jobs)
    assert rows_of(results) == [[2.0], [4.0], [6.0]]
    assert waiting == [jobs[1]]  # the timed one alone waits in a greenlet
    assert backend.batches == [[-1.0], [2.0, 1.0, 3.0]]
    scheduler.close()


def test_a_request_of_a_group_past_its_queue_timeout_is_rejected_alone(backend):
    policy = {"default_timeout_microseconds": 3_600_000_000, "allow_timeout_override": True}
    scheduler = scheduler_for("m", config(dynamic_batching={"default_queue_policy": policy}))
    first = start_blocked(scheduler, backend)
    jobs = [job(backend, 1), job(backend, 2, timeout=1000), job(backend, 3)]
    group = gevent.spawn(lambda: dict(scheduler.infer_all(jobs)))
    poll(lambda: scheduler.queue_depth() == 2, message="the 1 ms queue timeout did not pass")  # the instance is held
    backend.release.set()
    first.get(timeout=30)
    results = group.get(timeout=30)
    assert isinstance(results[1], QueueTimeout)
    assert results[0][0]["y"].ravel().tolist() == [2.0] and results[2][0]["y"].ravel().tolist() == [6.0]
    assert backend.batches == [[-1.0], [1.0, 3.0]]
    scheduler.close()


@pytest.mark.parametrize("batching", [{"dynamic_batching": {}}, {}])
def test_requests_all_cancelled_before_an_instance_takes_them_never_execute(backend, batching):
    scheduler = scheduler_for("m", config(**batching))
    first = start_blocked(scheduler, backend)
    jobs = [job(backend, value) for value in (1, 2)]
    group = gevent.spawn(lambda: dict(scheduler.infer_all(jobs)))
    gevent.sleep(0)  # let them reach the scheduler
    for cancelled in jobs:
        cancelled.cancel()
    backend.release.set()
    first.get(timeout=30)
    assert all(isinstance(result, Cancelled) for result in group.get(timeout=30).values())
    assert backend.batches == [[-1.0]]
    scheduler.close()


def test_a_running_job_tells_its_listeners_once_cancelled_and_a_late_listener_at_once(backend):
    told = []
    running = job(backend, 1)
    running.when_cancelled(lambda: told.append("early"))
    assert told == []
    running.cancel()
    running.when_cancelled(lambda: told.append("late"))
    assert told == ["early", "late"]


def test_direct_execution_without_a_batcher(backend):
    backend.hold = False
    scheduler = scheduler_for("m", config())
    assert values(spawn(scheduler, job(backend, 5))[0]) == [10.0]
    scheduler.close()


def sequence_config(strategy: dict | None = None) -> pb.ModelConfig:
    batching = {"control_input": [
        {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "fp32_false_true": [0, 1]}]},
        {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY", "int32_false_true": [0, 1]}]}]}
    return config(max_batch_size=4, sequence_batching={**batching, **(strategy or {})})


def sequence_job(backend, value: float, sequence_id: int, start=False, end=False) -> Job:
    return job(backend, value, sequence_id=sequence_id, sequence_start=start, sequence_end=end)


@pytest.mark.parametrize("strategy", [
    {"oldest": {"max_candidate_sequences": 4, "preferred_batch_size": [2], "max_queue_delay_microseconds": 3_600_000_000}},
    {"direct": {"max_queue_delay_microseconds": 3_600_000_000}},
])
def test_sequences_batch_together_one_request_each(backend, strategy):
    """Three requests on their way: two of sequence 1, one of sequence 2. The first batch takes one of
    each sequence; the second request of sequence 1 runs after its first, with its state."""
    scheduler = scheduler_for("m", sequence_config(strategy))
    queued = spawn_announced(scheduler, sequence_job(backend, 1, 1, start=True), sequence_job(backend, 3, 2, start=True),
                             sequence_job(backend, 2, 1))
    backend.release.set()
    assert [values(g) for g in queued] == [[2.0], [6.0], [4.0]]
    assert backend.batches == [[1.0, 3.0], [2.0]]
    assert scheduler.sequences_active() == 2
    scheduler.close()


def test_oldest_takes_only_its_candidate_sequences(backend):
    strategy = {"oldest": {"max_candidate_sequences": 1, "max_queue_delay_microseconds": 1000}}
    scheduler = scheduler_for("m", sequence_config(strategy))
    first, backlog = spawn(scheduler, sequence_job(backend, 1, 1, start=True), sequence_job(backend, 3, 2, start=True))
    backend.release.set()
    assert values(first) == [2.0]
    assert not backlog.ready()  # sequence 2 waits in the backlog while sequence 1 is the candidate
    assert values(spawn(scheduler, sequence_job(backend, 5, 1, end=True))[0]) == [10.0]
    assert values(backlog) == [6.0]
    assert backend.batches == [[1.0], [5.0], [3.0]]
    scheduler.close()


def test_direct_keeps_each_sequence_in_its_slot_and_fills_gaps_with_ready_false(backend):
    backend.hold = False
    scheduler = scheduler_for("m", sequence_config({"direct": {"max_queue_delay_microseconds": 3_600_000_000}}))
    started = spawn_announced(scheduler, *[sequence_job(backend, v, v, start=True) for v in (1, 2, 3)])
    assert [values(g) for g in started] == [[2.0], [4.0], [6.0]]
    later = spawn_announced(scheduler, sequence_job(backend, 6, 3), sequence_job(backend, 4, 1))
    assert [values(g) for g in later] == [[12.0], [8.0]]
    assert backend.batches == [[1.0, 2.0, 3.0], [4.0, 0.0, 6.0]]  # sequence 2's slot stays empty
    assert backend.inputs[1]["READY"][:, 0].tolist() == [1, 0, 1]
    scheduler.close()


def test_direct_gives_each_instance_its_own_slots(backend):
    """max_batch_size 1 on two instances: two slots, so two sequences run at once, one per instance,
    and a third waits for a slot until one of them ends."""
    config_ = sequence_config({"direct": {}})
    config_.max_batch_size = 1
    config_.instance_group.add(count=2)
    scheduler = scheduler_for("m", config_)
    first = spawn(scheduler, sequence_job(backend, 1, 1, start=True), sequence_job(backend, 2, 2, start=True))
    backend.wait_entered(2)  # both executions are running together
    third = spawn(scheduler, sequence_job(backend, 3, 3, start=True))[0]
    backend.release.set()
    assert [values(g) for g in first] == [[2.0], [4.0]] and backend.most_running == 2
    assert not third.ready()  # every slot is held by a running sequence
    assert values(spawn(scheduler, sequence_job(backend, 5, 1, end=True))[0]) == [10.0]
    assert values(third) == [6.0]
    scheduler.close()


@pytest.mark.parametrize("where", ["waiting for its turn", "waiting for an instance"])
def test_a_cancelled_sequence_request_cancels_the_requests_of_its_sequence_behind_it(backend, where):
    """As Triton does; the sequence goes on with the requests that come after, and other sequences are
    not touched."""
    scheduler = scheduler_for("m", sequence_config({"direct": {}}))
    other = spawn(scheduler, sequence_job(backend, 9, 8, start=True))[0]
    backend.wait_entered()
    ahead = spawn(scheduler, sequence_job(backend, 1, 7, start=True))[0]
    if where == "waiting for its turn":  # the one ahead of it holds the turn
        cancelled, behind = spawn(scheduler, sequence_job(backend, 2, 7), sequence_job(backend, 3, 7))
    else:
        ahead.kill()  # the sequence's first request was cancelled: nobody was behind it yet
        cancelled, behind = spawn(scheduler, sequence_job(backend, 2, 7, start=True), sequence_job(backend, 3, 7))
    cancelled.kill()
    backend.release.set()
    assert values(other) == [18.0]
    if where == "waiting for its turn":
        assert values(ahead) == [2.0]
    with pytest.raises(Cancelled):
        behind.get(timeout=30)
    assert values(spawn(scheduler, sequence_job(backend, 4, 7, end=True))[0]) == [8.0]
    scheduler.close()


@pytest.mark.parametrize("where", ["waiting for its turn", "waiting for a slot"])
def test_a_sequence_request_whose_client_hangs_up_leaves_at_once_and_its_retry_is_served(backend, where):
    """A request of sequence 7 waits (for the turn its sequence's first request holds, or for a slot while
    other sequences hold all four), and its HTTP client hangs up (its job is cancelled): it is answered
    Cancelled at once, while the execution ahead is still held, and no longer counts as waiting; the
    client's retry, sent after it, is not cancelled with it, and runs."""
    scheduler = scheduler_for("m", sequence_config({"direct": {}}))  # max_batch_size 4: four slots
    if where == "waiting for its turn":
        ahead = spawn(scheduler, sequence_job(backend, 1, 7, start=True))
        gone, retry = sequence_job(backend, 2, 7), sequence_job(backend, 2, 7)
    else:
        ahead = spawn(scheduler, *[sequence_job(backend, value, value, start=True) for value in (1, 2, 3, 4)])
        gone, retry = sequence_job(backend, 5, 7, start=True), sequence_job(backend, 5, 7, start=True)
    backend.wait_entered()
    waiting = spawn(scheduler, gone)[0]
    depth = scheduler.queue_depth()
    gone.cancel()
    with pytest.raises(Cancelled):
        waiting.get(timeout=30)
    assert not any(greenlet.ready() for greenlet in ahead)  # the execution ahead is still held
    assert scheduler.queue_depth() == depth - (where == "waiting for a slot")
    retried = spawn(scheduler, retry)[0]
    backend.release.set()
    assert [values(greenlet) for greenlet in ahead] == [[2.0 * value] for value in range(1, len(ahead) + 1)]
    if where == "waiting for a slot":
        assert values(spawn(scheduler, sequence_job(backend, 6, 1, end=True))[0]) == [12.0]  # a slot comes free
    assert values(retried) == [4.0 if where == "waiting for its turn" else 10.0]
    scheduler.close()


def _taking(turn: Turn, order: list, name: str):
    def take():
        turn.acquire()
        try:
            order.append(name)
        finally:
            turn.release()
    return gevent.spawn(take)


def test_a_sequence_turn_goes_in_arrival_order_to_the_requests_still_waiting():
    """A request that comes just as the turn is released (here the releasing greenlet, asking again at
    once) goes behind those already waiting; gevent's Semaphore gave it the turn ahead of them. A
    waiter whose client went away is passed over, and the waiters behind it are cancelled (Triton's
    request cancellation: a sequence's pending requests go with a cancelled one)."""
    turn, order = Turn(), []
    turn.acquire()
    waiting = [_taking(turn, order, name) for name in ("second", "gone", "third")]
    gevent.sleep(0)  # all three wait
    waiting[1].kill()
    turn.release()
    turn.acquire()
    order.append("newcomer")
    turn.release()
    gevent.joinall(waiting, timeout=10)
    assert order == ["second", "newcomer"] and not turn.locked()
    assert isinstance(waiting[2].exception, Cancelled)


def test_a_waiter_gone_just_as_its_turn_came_passes_the_turn_on():
    turn, order = Turn(), []
    turn.acquire()
    gone, next_ = _taking(turn, order, "gone"), _taking(turn, order, "next")
    gevent.sleep(0)
    gevent.get_hub().loop.run_callback(gone.throw)  # its client leaves after the turn is handed to it, before it runs
    turn.release()
    gevent.joinall([gone, next_], timeout=10)
    assert order == [] and isinstance(next_.exception, Cancelled) and not turn.locked()
    turn.acquire()  # the turn goes on to whoever comes next
    turn.release()


def test_a_restart_waits_its_turn_and_keeps_the_slot(backend):
    """sequence_start on a running sequence runs after the request before it, in the same slot."""
    scheduler = scheduler_for("m", sequence_config({"direct": {}}))
    first = spawn(scheduler, sequence_job(backend, 1, 1, start=True))[0]
    backend.wait_entered()
    restart = spawn(scheduler, sequence_job(backend, 2, 1, start=True))[0]
    backend.release.set()
    assert values(first) == [2.0] and values(restart) == [4.0]
    assert backend.batches == [[1.0], [2.0]] and scheduler.sequences[1].slot == 0
    assert backend.inputs[1]["START"][:, 0].tolist() == [1.0]
    scheduler.close()


class Cramped(HeldBackend):
    """A device that holds `room` batch items: larger batches run out of memory, asking for what they
    lack, until recovery (the test's `recover`) makes more room."""

    def __init__(self, room: int):
        super().__init__()
        self.room = room
        self.hold = False

    def execute(self, inputs, outputs, phases):
        rows = len(inputs["x"])
        if rows > self.room:
            raise DeviceOutOfMemory("cuda:0 ran out of memory", "cuda:0", (rows - self.room) * 1024)
        return super().execute(inputs, outputs, phases)


def batched_after_block(scheduler, backend, count):
    """`count` one-item requests queued behind a held first request, so they form one batch."""
    backend.hold = True
    first = start_blocked(scheduler, backend)
    greenlets = spawn(scheduler, *[job(backend, v) for v in range(count)])
    backend.hold = False
    backend.release.set()
    first.get(timeout=30)
    return greenlets


def test_a_batch_out_of_memory_recovers_once_then_runs_in_halves_and_every_request_is_answered():
    backend, recoveries = Cramped(room=2), []
    scheduler = scheduler_for("m", config(dynamic_batching={}), recover=lambda device, need: recoveries.append((device, need)))
    greenlets = batched_after_block(scheduler, backend, 8)
    assert [values(g) for g in greenlets] == [[2.0 * v] for v in range(8)]
    assert recoveries == [("cuda:0", 6 * 1024)]  # one recovery for the batch, asking what it lacked
    assert backend.batches[1:] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]


def test_recovery_that_makes_room_runs_the_batch_whole():
    backend = Cramped(room=2)

    def recover(device, need):
        backend.room += need // 1024

    scheduler = scheduler_for("m", config(dynamic_batching={}), recover=recover)
    greenlets = batched_after_block(scheduler, backend, 4)
    assert [values(g) for g in greenlets] == [[0.0], [2.0], [4.0], [6.0]]
    assert backend.batches[1:] == [[0.0, 1.0, 2.0, 3.0]]


def test_a_request_that_fits_no_batch_is_answered_507_and_the_others_are_served():
    backend, recoveries = Cramped(room=1), []
    scheduler = scheduler_for("m", config(dynamic_batching={}), recover=lambda device, need: recoveries.append(need))
    backend.hold = True
    first = start_blocked(scheduler, backend)
    small, large = spawn(scheduler, job(backend, 1), job(backend, 2, rows=2))
    backend.hold = False
    backend.release.set()
    first.get(timeout=30)
    assert values(small) == [2.0]
    with pytest.raises(DeviceOutOfMemory) as caught:
        large.get(timeout=30)
    assert caught.value.status == 507 and len(recoveries) == 1


@pytest.mark.parametrize("strategy", [None, {"direct": {}}])
def test_direct_and_sequence_requests_recover_once_and_retry(strategy):
    backend, recoveries = Cramped(room=0), []

    def recover(device, need):  # room for the first request only
        recoveries.append(need)
        backend.room = int(len(recoveries) == 1)

    if strategy is None:
        scheduler = scheduler_for("m", config(), recover=recover)
        outcome = scheduler.infer(job(backend, 3))
    else:
        scheduler = scheduler_for("m", sequence_config(strategy), recover=recover)
        outcome = gevent.spawn(scheduler.infer, sequence_job(backend, 3, 1, start=True)).get(timeout=30)
    assert outcome[0]["y"][:, 0].tolist() == [6.0] and recoveries == [1024]
    backend.room = 0
    recoveries.append("served")
    with pytest.raises(DeviceOutOfMemory):
        scheduler.infer(job(backend, 4)) if strategy is None else gevent.spawn(
            scheduler.infer, sequence_job(backend, 4, 1)).get(timeout=30)
    assert recoveries == [1024, "served", 1024]  # once per failed request, then 507


class TimedBackend:
    """Reports each execution as taking `ns` of CPU and `wall` (default: `ns`) of wall time, and notes
    the thread it ran on."""

    def __init__(self, ns: int, wall: int | None = None):
        self.ns, self.wall, self.threads = ns, wall, []
        self.release = {-1.0: threading.Event(), -2.0: threading.Event()}

    def execute(self, inputs, outputs, phases):
        self.threads.append(threading.get_ident())
        value = float(inputs["x"][0, 0])
        if value in self.release:  # a request the test holds on its thread; -2 reports 5 ms when let go
            assert self.release[value].wait(30), "the test never released the backend"
        ns = 5_000_000 if value == -2.0 else self.ns
        phases.cpu_ns, phases.infer_ns = ns, self.wall or ns
        return {"y": inputs["x"] * 2}


def test_a_fast_model_runs_inline_once_measured_and_leaves_when_it_slows():
    backend, hub = TimedBackend(20_000), threading.get_ident()
    scheduler = scheduler_for("m", config(), inline_below_ns=300_000)
    for value in range(INLINE_WINDOW):  # measured on its instance thread first
        assert values(gevent.spawn(scheduler.infer, job(backend, value))) == [2.0 * value]
    assert hub not in backend.threads
    assert values(gevent.spawn(scheduler.infer, job(backend, 1))) == [2.0]
    assert backend.threads[-1] == hub  # now on the event loop's own thread
    backend.ns = 5_000_000  # one execution past the threshold may be the system's doing …
    values(gevent.spawn(scheduler.infer, job(backend, 1)))
    backend.ns = 20_000
    values(gevent.spawn(scheduler.infer, job(backend, 1)))
    assert backend.threads[-2:] == [hub, hub]
    backend.ns = 5_000_000  # … two in a row send the model back to its thread
    for _ in range(3):
        values(gevent.spawn(scheduler.infer, job(backend, 1)))
    assert backend.threads[-3:-1] == [hub, hub] and backend.threads[-1] != hub
    scheduler.close()


def test_with_a_zero_threshold_a_model_never_runs_inline():
    backend, hub = TimedBackend(1), threading.get_ident()
    scheduler = scheduler_for("m", config(), inline_below_ns=0)
    for value in range(3 * INLINE_WINDOW):
        values(gevent.spawn(scheduler.infer, job(backend, value)))
    assert hub not in backend.threads
    scheduler.close()


def test_a_model_at_the_threshold_tries_the_loop_ever_more_rarely():
    backend, hub = TimedBackend(300_000), threading.get_ident()
    scheduler = scheduler_for("m", config(), inline_below_ns=300_000)
    for value in range(1 + INLINE_WINDOW * (1 + 2 + 4 + 8) + 4):
        values(gevent.spawn(scheduler.infer, job(backend, value)))
    tries = [index for index, thread in enumerate(backend.threads) if thread == hub]
    # after 16 executions on its thread, then 32, 64 and 128: each try came back over the threshold
    assert tries == [16, 16 + 1 + 32, 16 + 1 + 32 + 1 + 64, 16 + 1 + 32 + 1 + 64 + 1 + 128]
    scheduler.close()


class HandOffBackend(TimedBackend):
    """20 µs of work; on a thread other than `hub` its CPU time grows beside a busy loop (500 µs)."""

    def __init__(self, hub: int):
        super().__init__(20_000)
        self.hub = hub

    def execute(self, inputs, outputs, phases):
        result = super().execute(inputs, outputs, phases)
        if self.threads[-1] != self.hub:
            phases.cpu_ns = phases.infer_ns = 500_000
        return result


def test_a_fast_model_that_its_threads_make_look_slow_still_comes_to_the_loop():
    backend = HandOffBackend(threading.get_ident())
    scheduler = scheduler_for("m", config(), inline_below_ns=300_000)
    for value in range(INLINE_WINDOW + 3):
        values(gevent.spawn(scheduler.infer, job(backend, value)))
    assert backend.hub not in backend.threads[:INLINE_WINDOW]
    assert backend.threads[INLINE_WINDOW:] == [backend.hub] * 3  # tried on the loop, found fast there, and kept
    scheduler.close()


def test_a_batched_models_lone_requests_run_inline_once_measured():
    backend, hub = TimedBackend(20_000), threading.get_ident()
    scheduler = scheduler_for("m", config(dynamic_batching={}), inline_below_ns=300_000)
    for value in range(INLINE_WINDOW):  # measured on its instance thread first
        assert values(gevent.spawn(scheduler.infer, job(backend, value))) == [2.0 * value]
    assert hub not in backend.threads
    assert values(gevent.spawn(scheduler.infer, job(backend, 1))) == [2.0]
    assert backend.threads[-1] == hub
    scheduler.close()


@pytest.mark.parametrize("ns, on_loop", [(20_000, True), (2_000_000, False)], ids=["fit", "too slow"])
def test_a_batch_runs_on_the_loop_once_its_models_batches_say_it_fits(ns, on_loop):
    """A thread's hand-off cost ~50 µs of CPU a batch, more than a tiny model's whole batch: a batch that
    the model's latest batches' cost per item, times its items, puts under the threshold runs on the
    loop, once measured on its thread."""
    backend, hub = TimedBackend(ns), threading.get_ident()
    scheduler = scheduler_for("m", config(dynamic_batching={}), inline_below_ns=300_000)
    for value in range(INLINE_WINDOW + 1):  # one batch a pair that came together
        pair = [job(backend, value), job(backend, value)]
        answered = dict(gevent.spawn(lambda jobs: list(scheduler.infer_all(jobs)), pair).get(timeout=30))
        assert [answered[p][0]["y"][0, 0] for p in (0, 1)] == [2.0 * value] * 2
    assert len(backend.threads) == INLINE_WINDOW + 1
    assert hub not in backend.threads[:INLINE_WINDOW]  # measured on its thread first
    assert (backend.threads[-1] == hub) is on_loop
    scheduler.close()


def test_a_larger_batch_runs_on_the_loop_where_the_smaller_ones_before_it_did():
    """A small model's batch costs about the same at any size: judged by its smaller batches' cost per item,
    a batch of eight would have looked four times too slow, and stayed on a thread for good."""
    backend, hub = TimedBackend(100_000), threading.get_ident()  # 100 µs a batch, whatever its size
    scheduler = scheduler_for("m", config(dynamic_batching={}), inline_below_ns=300_000)
    for value in range(INLINE_WINDOW + 1):
        dict(gevent.spawn(lambda jobs: list(scheduler.infer_all(jobs)), [job(backend, value), job(backend, value)])
             .get(timeout=30))
    assert backend.threads[-1] == hub
    eight = [job(backend, value) for value in range(8)]
    answered = dict(gevent.spawn(lambda: list(scheduler.infer_all(eight))).get(timeout=30))
    assert [answered[p][0]["y"][0, 0] for p in range(8)] == [2.0 * value for value in range(8)]
    assert backend.threads[-1] == hub and len(backend.threads) == INLINE_WINDOW + 2
    scheduler.close()


@pytest.mark.parametrize("batching", [{}, {"dynamic_batching": {}}], ids=["direct", "dynamic"])
def test_a_request_with_more_items_than_the_loop_may_wait_for_goes_to_a_thread(batching):
    backend, hub = TimedBackend(20_000), threading.get_ident()  # 20 µs an item, the loop waits 300 at most
    scheduler = scheduler_for("m", config(max_batch_size=32, **batching), inline_below_ns=300_000)
    for value in range(INLINE_WINDOW + 1):  # measured on its thread, then on the loop
        values(gevent.spawn(scheduler.infer, job(backend, value)))
    assert backend.threads[-1] == hub
    values(gevent.spawn(scheduler.infer, job(backend, 1, rows=16)))  # 320 µs
    assert backend.threads[-1] != hub
    values(gevent.spawn(scheduler.infer, job(backend, 1, rows=14)))  # 280 µs
    assert backend.threads[-1] == hub
    scheduler.close()


def test_waits_for_the_gil_on_a_thread_do_not_keep_a_fast_model_off_the_loop():
    backend, hub = TimedBackend(20_000, wall=5_000_000), threading.get_ident()  # 20 µs of work, 5 ms of waiting
    scheduler = scheduler_for("m", config(), inline_below_ns=300_000)
    for value in range(INLINE_WINDOW + 1):
        values(gevent.spawn(scheduler.infer, job(backend, value)))
    assert backend.threads[-1] == hub
    scheduler.close()


def test_under_load_a_fast_model_returns_to_the_loop_once_its_threads_drain():
    backend, hub = TimedBackend(20_000), threading.get_ident()
    scheduler = scheduler_for("m", config(instance_group=[{"count": 2}]), inline_below_ns=300_000)
    held = gevent.spawn(scheduler.infer, job(backend, -1.0))  # busy on one instance thread
    for value in range(INLINE_WINDOW):  # measured fast on the other one meanwhile
        values(gevent.spawn(scheduler.infer, job(backend, value)))
    waiting = gevent.spawn(scheduler.infer, job(backend, 1.0))
    take_turns()
    assert not waiting.ready()  # fast enough for the loop, but it waits for the thread's request …
    backend.release[-1.0].set()
    assert values(waiting) == [2.0] and values(held) == [-2.0]
    assert backend.threads[-1] == hub  # … and then runs on the loop
    scheduler.close()


def test_a_request_waiting_for_the_loop_goes_to_a_thread_when_the_model_turns_slow():
    backend, hub = TimedBackend(20_000), threading.get_ident()
    scheduler = scheduler_for("m", config(instance_group=[{"count": 3}]), inline_below_ns=300_000)
    held, slow = gevent.spawn(scheduler.infer, job(backend, -1.0)), gevent.spawn(scheduler.infer, job(backend, -2.0))
    for value in range(INLINE_WINDOW):  # fast on the third thread meanwhile: fit for the loop
        values(gevent.spawn(scheduler.infer, job(backend, value)))
    waiting = gevent.spawn(scheduler.infer, job(backend, 1.0))
    take_turns()
    assert not waiting.ready()
    backend.release[-2.0].set()  # a 5 ms execution finishes: the model is no longer fit for the loop
    assert values(slow) == [-4.0] and values(waiting) == [2.0]  # served on a thread, not left waiting
    assert backend.threads[-1] != hub and not held.ready()
    backend.release[-1.0].set()
    assert values(held) == [-2.0]
    scheduler.close()


def test_a_worker_takes_about_chunk_ns_of_a_groups_requests_at_a_time_and_never_more_than_its_share():
    """A model of worker processes (run_all): one request at a time while its requests have not been timed,
    then as many as take about CHUNK_NS (a message carries that much of a worker's work), but never more than
    an even share of those left, so the others' workers have theirs."""
    taken = []

    def take_all(turns) -> None:  # every take before any answer, so that no answer times the model meanwhile
        calls = []
        while chunk := turns.take():
            taken.append(len(chunk))
            calls += chunk
        for position, call in calls:
            turns.answer(position, call * 2)

    def run(instances: int, turn_ns: int, count: int) -> list[int]:
        scheduler, taken[:] = scheduler_for("m", None, instances=instances), []
        scheduler.turn_ns = turn_ns
        with gevent.Timeout(30):
            answers = dict(scheduler.run_all(take_all, list(range(count)), Statistics()))
        assert {position: result for position, (result, _) in answers.items()} == {p: 2 * p for p in range(count)}
        scheduler.close()
        return taken

    assert run(1, 0, 3) == [1, 1, 1]  # not timed yet
    assert run(1, direct.CHUNK_NS // 10, 25) == [10, 10, 5]
    assert run(1, direct.CHUNK_NS * 2, 3) == [1, 1, 1]
    chunks = run(2, direct.CHUNK_NS // 100, 10)  # two threads take turns at one group: at most half of those left each
    assert sum(chunks) == 10 and max(chunks) <= 5


@pytest.mark.parametrize("sizes, expected", [([8], []), ([], []), ([8, 4], [4, 8]), ([4], [4])])
def test_the_preferred_size_a_normalised_config_adds_cuts_nothing_and_is_left_out(sizes, expected):
    """`[max_batch_size]` alone is what Triton's normalisation writes where a config gives no size; beside
    smaller sizes it still counts (a full batch then stays whole rather than being cut to the next size)."""
    assert preferred_sizes(sizes, 8) == expected
