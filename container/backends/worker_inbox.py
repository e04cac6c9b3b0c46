"""What a worker of user code (a python model's, a handler model's) reads from the model process, the
cancellations of its requests included.

Each message that hands the worker requests is numbered (`WorkerProcess.number`); when the client of one
of them goes away, the model process sends ("cancel", number, index), which may come before its message,
while user code runs, or after. The worker's loop reads the cancellations that come while it waits for its
next message, and skips a request cancelled before its turn; while user code runs, a python
model's `is_cancelled()` reads those that have come, without waiting (from the thread that runs `execute`
or from any the model started), and keeps any other message for the loop."""

import select
import threading
from collections import deque
from multiprocessing.connection import Connection

from container.backends.worker_process import receive


class Inbox:
    def __init__(self, connection: Connection):
        self.connection = connection
        self._reading = threading.Lock()  # one reader of the socket at a time
        self._readable = select.poll()  # made once: Connection.poll(0) builds a selector each time (3.6 against 0.4 µs)
        self._readable.register(connection.fileno(), select.POLLIN)
        self._kept: deque = deque()  # messages `look` read for the loop
        self._cancelled: set[tuple[int, int]] = set()  # (message number, index)
        self._current = -1  # the number of the message being run

    def next(self):
        """The next message that is not a cancellation, waiting for it; EOFError or OSError when the
        model process has hung up."""
        while True:
            with self._reading:
                message = self._kept.popleft() if self._kept else receive(self.connection)
            if not self._cancels(message):
                return message

    def running(self, number: int) -> None:
        """The requests of message `number` run now: cancellations of earlier messages are forgotten."""
        self._current = number
        for key in [key for key in self._cancelled if key[0] < number]:
            self._cancelled.discard(key)

    def cancelled(self, number: int, index: int) -> bool:
        """Whether the request at `index` of message `number` was cancelled, as far as has come (a look costs
        0.4 µs; a request run for nobody may cost seconds): asked at each request's turn, which it skips if so,
        and by a python model's `is_cancelled()`."""
        self._look()
        return (number, index) in self._cancelled

    def _look(self) -> None:
        """Read what has come without waiting: unless the loop is reading, which reads it itself."""
        if not self._reading.acquire(blocking=False):
            return
        try:
            while self._readable.poll(0):
                message = receive(self.connection)
                if not self._cancels(message):
                    self._kept.append(message)
        except (EOFError, OSError):  # the loop hears of it at its next read
            pass
        finally:
            self._reading.release()

    def _cancels(self, message) -> bool:
        if not (isinstance(message, tuple) and message[0] == "cancel"):
            return False
        _, number, index = message
        if number >= self._current:
            self._cancelled.add((number, index))
        return True
