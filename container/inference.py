"""What front-ends hand the core and get back: named numpy tensors, protocol-free."""

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# The parameters a request carries for its scheduling (the queue's priority and timeout, a sequence's id and
# flags), not for its model, with the types they take: Triton's front-ends make them the request's own properties
SCHEDULING_PARAMETERS = {"sequence_id": (int, str), "sequence_start": (bool,), "sequence_end": (bool,),
                         "priority": (int,), "timeout": (int,)}


class Cancellable:
    """A request its client may cancel (Triton's request cancellation, or an HTTP client that hung up:
    Client.under_way): `cancelled`, and listeners told once."""

    __slots__ = ()
    cancelled: bool
    _on_cancel: list | None

    def cancel(self) -> None:
        """Its client went away: not run if no execution has taken it yet (`run_batch`, direct.py's shares);
        a running one's backend hears of it (`when_cancelled`). On the event loop."""
        self.cancelled = True
        for listener in self._on_cancel or ():
            listener()

    def when_cancelled(self, listener) -> None:
        """`listener()` once the request is cancelled, at once if it is (from a thread, it may run twice)."""
        self._on_cancel = [*(self._on_cancel or ()), listener]
        if self.cancelled:
            listener()

    def settled(self) -> None:
        """Its answer is given: nobody is left to hear of a cancel. Its listeners go, since most hold the
        request, a reference cycle that only the garbage collector would free: kept, a queued request left
        ~9 objects to it, whose collections cost ~4 µs a request at 64 clients (measured in process)."""
        self._on_cancel = None


class Ticket(Cancellable):
    """A request's cancellation where the request is not a scheduling Job: a handler model's body, or a
    call of a group, which its front-end may cancel alone (InferRequest.ticket)."""

    __slots__ = ("cancelled", "_on_cancel")

    def __init__(self):
        self.cancelled, self._on_cancel = False, None


@dataclass
class InferRequest:
    """Tensors for the model and version a lease resolved (core.Lease)."""

    inputs: dict[str, np.ndarray]
    outputs: list[str] | None = None  # None: every output
    parameters: dict = field(default_factory=dict)
    # a decoupled model's responses, each as it is sent: respond(outputs, or the error it carries, or None
    # for none; final); called on the event loop. None: the request takes one response only.
    respond: Callable[[dict | Exception | None, bool], None] | None = None
    request_id: str = ""  # the client's id for it (V2's `id`), as python models see it
    # checked already (Signature.check), by a front-end against its view of the very load that runs it
    checked: bool = False
    # its own cancellation, apart from its client's (Ticket): a call of a group that a
    # gRPC front-end's caller abandoned while the group's other calls are still wanted
    ticket: Ticket | None = None


@dataclass
class InferResponse:
    model_name: str
    model_version: int
    outputs: dict[str, np.ndarray]


@dataclass
class TransformRequest:
    """A request body for a SageMaker handler model, which decodes it itself."""

    body: bytes
    content_type: str | None  # one media type, lower-case, without parameters; None when absent
    accept: str | None  # the Accept header as sent
    headers: dict[str, str] = field(default_factory=dict)
    request_id: str | None = None


class Client:
    """One client connection, as the schedulers see it. A dynamic batcher with a queue delay expects a
    client it answered within that delay to come back, and waits for it (up to the delay) to form a
    batch; once the connection closes, nobody waits for it. The front-end makes one per connection
    and closes it with the connection, or as soon as it sees the client hang up while a request of its
    is under way: then that request is cancelled (`under_way`), as nobody is left to answer."""

    __slots__ = ("requests", "gone", "_on_close", "_jobs")

    def __init__(self):
        self.requests = 0  # requests the connection has carried (the front-end counts them)
        self.gone = False  # closed
        self._on_close: set[Callable[["Client"], None]] = set()
        self._jobs: set | None = None  # its requests under way (a scheduling Job, or a Ticket)

    def when_closed(self, callback: Callable[["Client"], None]) -> None:
        self._on_close.add(callback)

    def under_way(self, job: Cancellable) -> None:
        """`job`, a request of this connection's, is cancelled if the connection closes before `done(job)`
        (at once if it has closed)."""
        if self.gone:
            job.cancel()
        elif self._jobs is None:
            self._jobs = {job}
        else:
            self._jobs.add(job)

    def done(self, job: Cancellable) -> None:
        if self._jobs is not None:
            self._jobs.discard(job)

    def close(self) -> None:
        """On the event loop: the callbacks, and the requests under way cancelled."""
        self.gone = True
        callbacks, self._on_close = self._on_close, set()
        for callback in callbacks:
            callback(self)
        jobs, self._jobs = self._jobs, None
        for job in jobs or ():
            job.cancel()
