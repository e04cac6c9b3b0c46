"""A model's execution threads (scheduling/instances.py): calls run on real threads, each answer
reaches the greenlet that asked, and the event loop runs on meanwhile. Held with events, not timing."""

import threading
from pathlib import Path

import gevent
import pytest

from container.errors import Cancelled
from container.inference import Ticket
from container.scheduling.instances import Instances
from tests.builders import poll, take_turns


class Held:
    """A call that waits on its instance thread until the test releases it; it returns that thread's id."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self) -> int:
        self.entered.set()
        assert self.release.wait(30), "the test never released the call"
        return threading.get_native_id()

    def start(self, instances: Instances) -> gevent.Greenlet:
        """The call, from a greenlet of its own, once it runs on a thread."""
        call = gevent.spawn(instances.apply, self)
        poll(self.entered.is_set, message="the call did not start on a thread")
        return call


@pytest.fixture
def held():
    held = Held()
    yield held
    held.release.set()


def test_each_call_runs_on_an_instance_thread_and_answers_its_own_greenlet():
    instances = Instances(2)
    loop_thread = threading.get_ident()

    def where(value):
        return value, threading.get_ident()

    try:
        answers = [g.get() for g in [gevent.spawn(instances.apply, where, (i,)) for i in range(64)]]
    finally:
        instances.close()
    assert [value for value, _ in answers] == list(range(64))
    assert loop_thread not in {thread for _, thread in answers}
    assert len({thread for _, thread in answers}) <= 2


def test_an_exception_is_raised_in_the_caller_and_the_threads_serve_on():
    instances = Instances(1)

    def fail():
        raise ValueError("from the model")

    try:
        with pytest.raises(ValueError, match="from the model"):
            instances.apply(fail)
        assert instances.apply(int, ("7",)) == 7
    finally:
        instances.close()


def test_the_loop_serves_other_greenlets_while_a_call_runs(held):
    instances = Instances(1)
    try:
        call = held.start(instances)
        assert gevent.spawn(lambda: "the loop ran").get(timeout=10) == "the loop ran"  # while the call is held
        held.release.set()
        assert call.get(timeout=10) > 0
    finally:
        instances.close()


def test_a_caller_killed_while_waiting_does_not_disturb_the_next_answers(held):
    instances = Instances(1)
    try:
        held.start(instances).kill()
        held.release.set()
        assert [g.get(timeout=10) for g in [gevent.spawn(instances.apply, str, (i,)) for i in range(3)]] == ["0", "1", "2"]
    finally:
        instances.close()


def test_idle_threads_do_not_keep_the_event_loop_alive():
    """A loop with nothing left to do ends although the threads wait for work; one with a call in
    flight waits for its answer. In a thread of its own, so the test has a hub to itself."""
    outcome = {}

    def own_hub():
        instances = Instances(1)
        outcome["answer"] = gevent.spawn(instances.apply, sum, ([1, 2],)).get()
        outcome["loop ended"] = gevent.wait(timeout=10)
        instances.close()
        gevent.get_hub().destroy(destroy_loop=True)

    thread = threading.Thread(target=own_hub)
    thread.start()
    thread.join(30)
    assert outcome == {"answer": 3, "loop ended": True}


def test_close_ends_the_threads_after_the_calls_queued_before_it(held):
    instances = Instances(1)
    first = held.start(instances)
    second = gevent.spawn(instances.apply, str, ("queued",))
    take_turns(1)  # queued behind the held call
    instances.close()
    held.release.set()
    gevent.joinall([first, second], timeout=10, raise_error=True)
    assert second.value == "queued"
    thread = Path(f"/proc/self/task/{first.value}")
    poll(lambda: not thread.exists(), message="the instance thread did not end")


def test_a_call_posts_answers_to_the_loop_before_it_ends():
    """What a call posts from its thread runs on the loop, in order, while the call is still running:
    a handler model's worker answers a group's requests one by one this way."""
    instances, posted, release = Instances(1), [], threading.Event()

    def note(what: str) -> None:
        posted.append((threading.get_ident(), what))

    def answering() -> str:
        instances.post(note, "first")
        instances.post(note, "second")
        assert release.wait(30), "the test never released the call"
        return "done"

    try:
        call = gevent.spawn(instances.apply, answering)
        poll(lambda: len(posted) == 2, message="the posted answers did not reach the loop")
        assert not call.ready()
        release.set()
        assert call.get(timeout=30) == "done"
    finally:
        release.set()
        instances.close()
    assert posted == [(threading.get_ident(), "first"), (threading.get_ident(), "second")]  # run on the loop's thread


def test_a_call_whose_request_is_cancelled_while_it_waits_leaves_at_once_and_never_runs(held):
    """Behind a held call, a waiting call's request is cancelled (its client hung up): its caller gets
    Cancelled while the held call still runs, the call never runs, and the next call runs as before; a
    request cancelled once its call has a thread changes nothing (its answer comes)."""
    instances, ran = Instances(1), []
    try:
        first, request = Ticket(), Ticket()
        call = gevent.spawn(instances.apply, held, (), first)
        poll(held.entered.is_set, message="the call did not start on a thread")
        waiting = gevent.spawn(instances.apply, ran.append, ("withdrawn",), request)
        take_turns(1)  # queued behind the held call
        request.cancel()
        with pytest.raises(Cancelled):
            waiting.get(timeout=10)
        first.cancel()  # it has its thread
        assert not call.ready()
        held.release.set()
        assert call.get(timeout=10) > 0 and instances.apply(str, ("next",)) == "next"
        assert ran == []
    finally:
        instances.close()
