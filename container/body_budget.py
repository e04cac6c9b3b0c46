"""The bytes of request bodies one HTTP process holds at once (SERVE_MAX_BODIES_SIZE, shared among the
HTTP processes). A request's body is counted from its head, before it is read, until its answer is
made: in between it is read, decoded, queued and run, a few copies of it at once (not while the answer
is sent: a client that never reads its answer must not hold up everyone else's bodies). A request that does
not fit waits, unread (its bytes stay in its client's socket and the kernel's buffers), for the requests
before it to be answered, first come first served; a body larger than the whole budget goes alone.
Without it, a thousand clients each sending a body within SAGEMAKER_MAX_PAYLOAD_IN_MB made the server
hold many GiB at once, and the out-of-memory killer takes the process with the models."""

from collections import deque

from gevent.event import Event


class BodyBudget:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self._waiting: deque[tuple[int, Event]] = deque()

    def take(self, size: int, timeout: float) -> bool:
        """Count `size` bytes, waiting up to `timeout` seconds for them to fit; False if they never did."""
        if not self._waiting and self._fits(size):
            self.used += size
            return True
        turn = (size, Event())
        self._waiting.append(turn)
        if turn[1].wait(timeout):  # counted by `_admit`
            return True
        self._waiting.remove(turn)
        self._admit()  # those behind it may fit now
        return False

    def give(self, size: int) -> None:
        """`size` bytes counted by `take` are no longer held."""
        self.used -= size
        self._admit()

    def _fits(self, size: int) -> bool:
        return self.used + size <= self.capacity or not self.used

    def _admit(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            size, admitted = self._waiting.popleft()
            self.used += size
            admitted.set()
