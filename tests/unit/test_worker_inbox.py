"""What a python model's worker reads (backends/worker_inbox.py): a cancellation marks a request of a
numbered message whenever it comes, before its message or while `execute` runs, and whoever reads it
keeps the other messages, in order, for the worker's loop. Over a real pipe, as the worker's socket."""

import pickle
from multiprocessing import Pipe

from container.backends.worker_inbox import Inbox


def pipe():
    server, worker = Pipe()
    return (lambda message: server.send_bytes(pickle.dumps(message))), Inbox(worker)


def test_a_cancellation_marks_its_request_whether_it_comes_before_or_after_its_message():
    send, inbox = pipe()
    send(("cancel", 1, 0))  # its message is on its way behind it
    send(("execute", ["a", "b"], False, 1))
    assert inbox.next() == ("execute", ["a", "b"], False, 1)
    inbox.running(1)
    assert inbox.cancelled(1, 0) and not inbox.cancelled(1, 1)
    send(("cancel", 1, 1))  # while `execute` runs
    assert inbox.cancelled(1, 1)


def test_what_is_cancelled_reads_while_execute_runs_keeps_the_other_messages_in_order():
    send, inbox = pipe()
    send(("execute", ["a"], True, 1))
    assert inbox.next()[3] == 1
    inbox.running(1)
    send(("execute", ["b"], True, 2))
    send(("cancel", 1, 0))
    send("finalize")
    assert inbox.cancelled(1, 0)  # read past the message behind it, which is kept
    assert inbox.next() == ("execute", ["b"], True, 2)
    inbox.running(2)
    assert not inbox.cancelled(1, 0)  # an earlier message's cancellations are forgotten
    assert inbox.next() == "finalize"


def test_a_request_is_skipped_for_a_cancellation_that_came_at_any_moment_before_its_turn():
    """However short the runs before it, a cancellation on the socket by a request's turn is heard: the
    first of its message's too, cancelled after the message was sent."""
    send, inbox = pipe()
    send(("each", ["a", "b", "c"], False, 4))
    assert inbox.next()[3] == 4
    inbox.running(4)
    send(("cancel", 4, 0))
    assert inbox.cancelled(4, 0)
    send(("cancel", 4, 2))
    assert not inbox.cancelled(4, 1) and inbox.cancelled(4, 2)
