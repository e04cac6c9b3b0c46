"""Requests that arrive together for a model of worker processes go to its workers a few at a time, each
few to the first worker free, as TorchServe's workers and Triton's instances take them: a handler model's
(core.transform_all), and a python model's without a batcher (core.infer_all), each run on its own (a
python model's through an `execute` apiece, as Triton runs them) and answered as soon as it is done. A
request waits behind a slow one only in the few its worker took at once (one at a time until the model's
requests are timed, about a millisecond of them after). A request that kills its worker, hangs past the
timeout, breaks the device or runs out of its memory fails (or runs again) alone, and the worker is started
again for the next. Real worker processes, without a server; messages are counted at the worker's socket."""

import os
import signal

import gevent
import numpy as np
import psutil
import pytest

from container.backends.worker_process import WorkerProcess
from container.core import Core
from container.errors import Cancelled, ModelError
from container.inference import Client, InferRequest, Ticket, TransformRequest
from tests.builders import Gate, handler_model, make_core, poll, python_model, tensor

# Answers "<its body>:<its worker's pid>"; some bodies do more first. Without a GPU, the script raises
# the errors the server's device guard would raise for a broken CUDA context or a full GPU.
SCRIPT = """
import os
from container.errors import DeviceFault, DeviceOutOfMemory

def model_fn(model_dir):
    return None

def transform_fn(model, body, content_type, accept):
    if body == b"exit":
        os._exit(3)
    if body == b"hang":
        open({hang!r}).read()  # nobody opens its other end: the handler timeout ends it
    if body == b"gate":
        {gate}
    if body == b"fault":
        raise DeviceFault("the device failed (a test)")
    if body == b"oom" and not os.path.exists({ran_out!r}):
        open({ran_out!r}, "w").close()
        raise DeviceOutOfMemory("out of memory (a test)", "cpu", 0)
    return body + b":" + str(os.getpid()).encode(), "text/plain"
"""


@pytest.fixture
def messages(monkeypatch) -> list[int]:
    """How many requests each message to a worker carried, in the order they were sent."""
    sent = []
    tell = WorkerProcess.tell

    def counting(self, message):
        sent.append(len(message[1] if isinstance(message, tuple) else message))  # a python model's: (kind, requests, …)
        tell(self, message)
    monkeypatch.setattr(WorkerProcess, "tell", counting)
    return sent


# Each request in an execute of its own: y = x and the instance's pid; x < 0 raises, x == -3 ends the process.
EACH_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        [request] = requests
        x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
        if x[0] == -3:
            os._exit(3)
        if x[0] < 0:
            raise ValueError("x must not be negative")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x),
                                            pb_utils.Tensor("pid", np.array([os.getpid()], np.int64))])]
"""


def handler_core(tmp_path, **options) -> tuple[Core, Gate]:
    gate, hang = Gate(tmp_path, "gate"), tmp_path / "hang.fifo"
    os.mkfifo(hang)
    root = tmp_path / "models"
    handler_model(root, "h", SCRIPT.format(hang=str(hang), gate=gate.code(), ran_out=str(tmp_path / "ran_out")))
    core = make_core(root, **options)
    core.load("h", "h")
    return core, gate


def transform_all(core: Core, bodies: list[bytes], clients: list[Client | None] | None = None):
    """(position, body answered or the exception) for each of `bodies` sent together, as each comes;
    `clients`: each one's connection."""
    leases = core.leases("h", None, clients or [None] * len(bodies))
    for lease in leases:
        lease.__enter__()
    requests = [TransformRequest(body, "application/octet-stream", None, {}) for body in bodies]
    for position, result in core.transform_all(leases, requests):
        leases[position].__exit__()
        yield position, result if isinstance(result, Exception) else result.body


def answers(core: Core, bodies: list[bytes], clients: list[Client | None] | None = None) -> list:
    by_position = dict(transform_all(core, bodies, clients))
    return [by_position[p] for p in range(len(bodies))]


def pid(answer: bytes) -> int:
    return int(answer.rpartition(b":")[2])


def test_a_crash_or_a_hang_fails_only_its_own_request_and_the_worker_starts_again_for_the_next(tmp_path):
    core, _ = handler_core(tmp_path, handler_timeout=1.0)
    try:
        first, crashed, second, hung, third = answers(core, [b"a", b"exit", b"b", b"hang", b"c"])
        assert isinstance(crashed, ModelError) and "exited with code 3 in a request" in str(crashed)
        assert isinstance(hung, ModelError) and "did not finish a request within 1 s" in str(hung)
        assert [answer.partition(b":")[0] for answer in (first, second, third)] == [b"a", b"b", b"c"]
        assert len({pid(first), pid(second), pid(third)}) == 3  # a new worker after each death
    finally:
        core.unload("h")


def test_a_request_that_breaks_the_device_ends_its_worker_and_the_rest_go_to_a_new_one(tmp_path):
    core, _ = handler_core(tmp_path)
    try:
        first, broken, second = answers(core, [b"a", b"fault", b"b"])
        assert isinstance(broken, ModelError) and "the device failed (a test)" in str(broken)
        assert pid(first) != pid(second)
    finally:
        core.unload("h")


def test_a_request_out_of_device_memory_runs_again_alone_once_room_is_made(tmp_path, messages):
    core, _ = handler_core(tmp_path)
    try:
        assert [a.partition(b":")[0] for a in answers(core, [b"a", b"oom", b"b"])] == [b"a", b"oom", b"b"]
        assert sum(messages) == 4 and core.counters.recoveries == 1  # the one out of memory, twice
    finally:
        core.unload("h")


def test_each_request_of_a_message_is_answered_as_soon_as_it_is_done(tmp_path, messages):
    core, gate = handler_core(tmp_path)
    try:
        answering = transform_all(core, [b"a", b"gate"])
        with gevent.Timeout(30):
            position, answer = next(answering)  # while the second is held at the gate
        assert (position, answer.partition(b":")[0]) == (0, b"a")
        gate.wait_entered()
        gate.release()
        with gevent.Timeout(30):
            [(position, answer)] = list(answering)
        assert (position, answer.partition(b":")[0]) == (1, b"gate") and sum(messages) == 2
    finally:
        core.unload("h")


@pytest.mark.parametrize("turn_ns, sent", [(0, 2), (1, 3)], ids=["one at a time", "in one message"])
def test_a_handler_request_whose_client_left_while_the_one_before_it_runs_is_skipped(tmp_path, messages, turn_ns, sent):
    """Three requests together for one worker, the first held at the gate while the second's client hangs
    up: the second is Cancelled, and not an execution, and the third runs. Taken one at a time (the model's
    requests not timed yet), the second is never sent; taken in one message (fast requests), the worker
    skips it at its turn."""
    core, gate = handler_core(tmp_path)
    core._registry.models["h"].scheduler.turn_ns = turn_ns
    try:
        client = Client()
        answering = gevent.spawn(answers, core, [b"gate", b"b", b"c"], [None, client, None])
        poll(gate.marker.exists, 30, "the first request never reached the gate")
        client.close()
        gate.release()
        first, second, third = answering.get(timeout=30)
        assert [first.partition(b":")[0], third.partition(b":")[0]] == [b"gate", b"c"] and isinstance(second, Cancelled)
        assert sum(messages) == sent and core._registry.models["h"].statistics[1].execution_count == 2
    finally:
        core.unload("h")


def test_no_request_waits_behind_a_slow_one_while_another_worker_of_the_pool_is_free(tmp_path, messages):
    """Four requests together for a pool of two workers, the first held at the gate: the other worker
    answers the three others meanwhile (they once went two to a worker, the second behind the held one)."""
    core, gate = handler_core(tmp_path, handler_workers=2, handler_max_workers=2)
    try:
        [pool] = core._registry.models["h"].versions.values()
        poll(lambda: pool.workers == 2, 60, "the second worker did not start")  # it starts on a thread of its own
        answering = transform_all(core, [b"gate", b"b", b"c", b"d"])
        try:
            with gevent.Timeout(30):
                others = dict(next(answering) for _ in range(3))  # while the first is held
        finally:
            gate.wait_entered()
            gate.release()
        assert sorted(others) == [1, 2, 3] and [others[p].partition(b":")[0] for p in (1, 2, 3)] == [b"b", b"c", b"d"]
        with gevent.Timeout(30):
            [(position, held)] = list(answering)
        assert position == 0 and len({pid(held)} | {pid(a) for a in others.values()}) == 2
        assert sum(messages) == 4
    finally:
        core.unload("h")


def killed(pid: int) -> None:
    """SIGKILL to a process (as the OOM killer sends it), once it has ended."""
    os.kill(pid, signal.SIGKILL)
    ended(pid)


def ended(pid: int) -> None:
    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # its parent has yet to reap it
        except psutil.NoSuchProcess:
            return True
    poll(gone, 30, f"process {pid} did not end")


def test_a_handler_worker_that_died_while_idle_is_started_again_for_the_next_request(tmp_path):
    """Killed while it waited (a signal, the OOM killer): the next request is served by the worker started
    in its place (it once failed on the dead worker's closed socket, a BrokenPipeError, and so did every
    request after it)."""
    core, _ = handler_core(tmp_path)
    try:
        [first] = answers(core, [b"a"])
        killed(pid(first))
        second, third = answers(core, [b"b", b"c"])
        assert [second.partition(b":")[0], third.partition(b":")[0]] == [b"b", b"c"] and pid(second) != pid(first)
    finally:
        core.unload("h")


def test_a_killed_fork_server_is_replaced_by_the_next_worker_start(tmp_path):
    """The fork server the workers start from, killed (its workers end with it): the next request starts
    a new one, and a worker from that (it once failed with a broken pipe, a 500, before the one after it
    could)."""
    core, _ = handler_core(tmp_path)
    try:
        [first] = answers(core, [b"a"])
        fork_server = psutil.Process(pid(first)).ppid()
        killed(fork_server)
        ended(pid(first))
        [second] = answers(core, [b"b"])
        assert second.partition(b":")[0] == b"b" and psutil.Process(pid(second)).ppid() != fork_server
    finally:
        core.unload("h")


def python_core(tmp_path, instances: int, gate: Gate | None = None, batcher: dict | None = None) -> Core:
    """`gate`: a request whose x is 5 waits at it first; `batcher`: its dynamic_batching (none: each
    request an `execute` of its own, `execute_each`)."""
    source = EACH_PY if gate is None else EACH_PY.replace("        if x[0] == -3:", f"        if x[0] == 5:\n            {gate.code()}\n        if x[0] == -3:")
    config = {"input": [tensor("x", "TYPE_FP32", [1])],
              "output": [tensor("y", "TYPE_FP32", [1]), tensor("pid", "TYPE_INT64", [1])],
              "instance_group": [{"count": instances, "kind": "KIND_CPU"}]}
    python_model(tmp_path, "p", source, config if batcher is None else {**config, "dynamic_batching": batcher})
    core = make_core(tmp_path)
    core.load("p", "p")
    return core


def infer_all(core: Core, values: list[float], tickets: list[Ticket | None] | None = None) -> list:
    """Each request's (y, pid), or the exception it failed with, in the order sent; `tickets`: each one's."""
    leases = core.leases("p", None, [None] * len(values))
    for lease in leases:
        lease.__enter__()
    answered = {}
    tickets = tickets or [None] * len(values)
    requests = [InferRequest({"x": np.array([v], np.float32)}, ticket=ticket) for v, ticket in zip(values, tickets, strict=True)]
    for position, result in core.infer_all(leases, requests):
        leases[position].__exit__()
        answered[position] = result if isinstance(result, Exception) else (result.outputs["y"][0], result.outputs["pid"][0])
    return [answered[p] for p in range(len(values))]


def test_a_python_models_group_runs_an_execute_apiece_and_a_failure_is_its_own(tmp_path):
    core = python_core(tmp_path, instances=1)
    try:
        first, raised, second, crashed, third = infer_all(core, [1.0, -1.0, 2.0, -3.0, 4.0])
        assert isinstance(raised, ModelError) and "raised ValueError: x must not be negative" in str(raised)
        assert isinstance(crashed, ModelError) and "exited with code 3" in str(crashed)
        assert [first[0], second[0], third[0]] == [1.0, 2.0, 4.0]
        assert first[1] == second[1] != third[1]  # the instance that died was started again for the last
        # as Triton counts them: an execute that raised ran, one whose instance died did not
        assert core._registry.models["p"].statistics[1].execution_count == 4
    finally:
        core.unload("p")


def test_no_python_request_waits_behind_a_slow_one_while_another_instance_is_free(tmp_path, messages):
    """Four requests together for two instances, the first held at the gate: the other instance answers
    the three others meanwhile, as Triton's instances each take the next request once free."""
    gate = Gate(tmp_path, "gate")
    core = python_core(tmp_path / "models", instances=2, gate=gate)
    try:
        answering = gevent.spawn(infer_all, core, [5.0, 6.0, 7.0, 8.0])
        poll(gate.marker.exists, 30, "the first request never reached the gate")
        try:
            poll(lambda: core._registry.models["p"].statistics[1].execution_count == 3, 30,
                 "the other instance did not answer the others while the first was held")
        finally:
            gate.release()
        answered = answering.get(timeout=30)
        assert [y for y, _ in answered] == [5.0, 6.0, 7.0, 8.0] and len({pid for _, pid in answered}) == 2
        assert sum(messages) == 4
    finally:
        core.unload("p")


def test_a_python_request_cancelled_while_the_one_before_it_runs_is_skipped_and_not_counted(tmp_path, messages):
    """Two requests together for one instance; the first held at a gate while the second is cancelled (its
    gRPC caller left): the second is never sent, and is Cancelled and no execution."""
    gate = Gate(tmp_path, "gate")
    core = python_core(tmp_path / "models", instances=1, gate=gate)
    try:
        ticket = Ticket()
        answering = gevent.spawn(infer_all, core, [5.0, 6.0], [None, ticket])
        poll(gate.marker.exists, 30, "the first request never reached the gate")
        ticket.cancel()
        gate.release()
        first, second = answering.get(timeout=30)
        assert first[0] == 5.0 and isinstance(second, Cancelled)
        assert sum(messages) == 1 and core._registry.models["p"].statistics[1].execution_count == 1
    finally:
        core.unload("p")


@pytest.mark.parametrize("batcher", [None, {}], ids=["an execute apiece", "batched"])
def test_a_python_instance_that_died_while_idle_is_started_again_for_the_next_request(tmp_path, batcher):
    core = python_core(tmp_path, instances=1, batcher=batcher)
    try:
        [(_, first)] = infer_all(core, [1.0])
        killed(int(first))
        [(y, second)] = infer_all(core, [2.0])
        assert y == 2.0 and second != first
    finally:
        core.unload("p")


@pytest.fixture
def dies_before_the_message(monkeypatch) -> list[int]:
    """Put a pid in it: that worker is killed, and has ended, just before the next message is sent to it,
    after the look that would have seen it gone: as when the OOM killer strikes between the two."""
    doomed = []
    tell = WorkerProcess.tell

    def killing_first(self, message):
        if doomed and doomed[0] == self.pid:
            killed(doomed.pop())
        tell(self, message)
    monkeypatch.setattr(WorkerProcess, "tell", killing_first)
    return doomed


def test_a_handler_worker_killed_just_before_its_message_is_started_again_and_sent_it(tmp_path, dies_before_the_message):
    """It once failed the requests with a BrokenPipeError: an internal error, a 500."""
    core, _ = handler_core(tmp_path)
    try:
        [first] = answers(core, [b"a"])
        dies_before_the_message.append(pid(first))
        second, third = answers(core, [b"b", b"c"])
        assert [second.partition(b":")[0], third.partition(b":")[0]] == [b"b", b"c"] and pid(second) != pid(first)
        assert not dies_before_the_message
    finally:
        core.unload("h")


@pytest.mark.parametrize("batcher", [None, {}], ids=["an execute apiece", "batched"])
def test_a_python_instance_killed_just_before_its_message_is_started_again_and_sent_it(tmp_path, batcher,
                                                                                      dies_before_the_message):
    core = python_core(tmp_path, instances=1, batcher=batcher)
    try:
        [(_, first)] = infer_all(core, [1.0])
        dies_before_the_message.append(int(first))
        [(y, second)] = infer_all(core, [2.0])
        assert y == 2.0 and second != first and not dies_before_the_message
    finally:
        core.unload("p")
