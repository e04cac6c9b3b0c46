"""What front-ends hand the core and get back: named numpy tensors, protocol-free."""

from dataclasses import dataclass, field
from typing import Callable

import numpy as np


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
        self._jobs: set | None = None  # its requests under way (scheduling.job.Job)

    def when_closed(self, callback: Callable[["Client"], None]) -> None:
        self._on_close.add(callback)

    def under_way(self, job) -> None:
        """`job`, a request of this connection's, is cancelled if the connection closes before `done(job)`
        (at once if it has closed)."""
        if self.gone:
            job.cancel()
        elif self._jobs is None:
            self._jobs = {job}
        else:
            self._jobs.add(job)

    def done(self, job) -> None:
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
