import gevent
import pytest

from container.errors import Cancelled, InsufficientMemory, InvalidRequest, ModelError, QueueTimeout, Unavailable, WorkerLost
from container.models.statistics import FAILURE_REASONS, Statistics, failure_reason


@pytest.mark.parametrize("exc, reason", [
    (Cancelled(), "CANCELED"),
    (gevent.GreenletExit(), "CANCELED"),  # its caller went away
    (Unavailable("the server is shutting down"), "REJECTED"),
    (QueueTimeout("the request waited out its queue timeout and was not executed"), "REJECTED"),
    (ModelError("execute of model 'm' raised ValueError: no"), "BACKEND"),
    (WorkerLost("the worker died"), "BACKEND"),
    (InvalidRequest("x must not be negative"), "BACKEND"),  # a python model's own TritonError
    (InsufficientMemory("cuda:0 ran out of memory"), "BACKEND"),
])
def test_a_failure_is_counted_under_triton_s_reason_for_it(exc, reason):
    statistics = Statistics()
    statistics.record_failure(1_000, exc)
    assert failure_reason(exc) == reason
    assert statistics.failures == {r: int(r == reason) for r in FAILURE_REASONS} and statistics.fail.count == 1
