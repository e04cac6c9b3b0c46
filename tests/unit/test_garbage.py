"""A request served leaves nothing of the server's own for the garbage collector: every object it made is
freed as its last reference goes. A reference cycle (a queued job holding a cancel listener that holds
the job) left ~9 objects a request to the collector, and its collections cost the model process ~4 µs a
request at 64 clients (measured in process). Each scheduler's ways, lone requests and groups, through
the core facade with real models loaded from a model root."""

import gc
from pathlib import Path

import gevent
import numpy as np
import pytest

from bench.fidelity_models import DOUBLE_PY
from container.core import Core
from container.inference import Client, InferRequest, TransformRequest
from tests.builders import ensemble, ensemble_step, fp32_model, handler_model, make_core, python_model, tensor

ECHO_PY = """
def model_fn(model_dir):
    return None

def transform_fn(model, body, content_type, accept):
    return body, "application/octet-stream"
"""
ROWS = {"x": [tensor("x", "TYPE_FP32", [4])], "y": [tensor("y", "TYPE_FP32", [4])]}


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "batched", dynamic_batching={})
    fp32_model(root, "preferred", dynamic_batching={"preferred_batch_size": [2]})
    fp32_model(root, "direct", max_batch_size=0)
    fp32_model(root, "sequence", sequence_batching={"max_sequence_idle_microseconds": 3_600_000_000})
    ensemble(root, "ensemble", ROWS["x"], ROWS["y"], [ensemble_step("direct", {"x": "x"}, {"y": "y"})], {"max_batch_size": 0})
    python_model(root, "python", DOUBLE_PY, {"max_batch_size": 8, "input": ROWS["x"], "output": ROWS["y"]})
    handler_model(root, "handler", ECHO_PY)
    core = make_core(Path(root))
    names = ["batched", "preferred", "direct", "sequence", "ensemble", "python", "handler"]
    for name in names:
        core.load(name, name)
    yield core
    for name in names:
        core.unload(name)


def rows(name: str) -> np.ndarray:
    return np.ones((4,) if name in ("direct", "ensemble") else (1, 4), np.float32)


def one(core: Core, name: str, **parameters) -> None:
    with core.lease(name, client=Client()) as lease:
        response = core.infer(lease, InferRequest({"x": rows(name)}, parameters=parameters))
    assert response.outputs["y"].tolist() == (rows(name) * 2).tolist()


def together(core: Core, name: str, count: int) -> None:
    """`count` requests that arrived together (a front-end's group)."""
    leases = core.leases(name, None, [Client() for _ in range(count)])
    for lease in leases:
        lease.__enter__()
    try:
        answers = [result for _, result in core.infer_all(leases, [InferRequest({"x": rows(name)}) for _ in range(count)])]
    finally:
        for lease in leases:
            lease.__exit__()
    assert [answer.outputs["y"].tolist() for answer in answers] == [(rows(name) * 2).tolist()] * count


def at_once(serve, count: int) -> None:
    gevent.joinall([gevent.spawn(serve) for _ in range(count)], timeout=60, raise_error=True)


def sequence(core: Core) -> None:
    one(core, "sequence", sequence_id=7, sequence_start=True)
    one(core, "sequence", sequence_id=7)
    one(core, "sequence", sequence_id=7, sequence_end=True)


def transform(core: Core) -> None:
    with core.lease("handler", client=Client()) as lease:
        response = core.transform(lease, TransformRequest(b"abc", "application/octet-stream", None, {}, "id"))
    assert response.body == b"abc"


WAYS = {
    "a lone request to a batcher": lambda core: one(core, "batched"),
    "requests from 16 clients at once, queued and batched": lambda core: at_once(lambda: one(core, "batched"), 16),
    "groups of five, merged and cut to fill batches of 8": lambda core: at_once(lambda: together(core, "batched", 5), 4),
    "a group of three cut to a preferred size of 2": lambda core: together(core, "preferred", 3),
    "a lone request without batching": lambda core: one(core, "direct"),
    "a group without batching": lambda core: together(core, "direct", 5),
    "a sequence's requests": sequence,
    "an ensemble's request": lambda core: one(core, "ensemble"),
    "a lone request to a python model": lambda core: one(core, "python"),
    "a group to a python model": lambda core: together(core, "python", 5),
    "a handler model's request": transform,
}


@pytest.mark.parametrize("way", WAYS)
def test_a_request_served_leaves_none_of_its_objects_to_the_garbage_collector(core, way):
    serve = WAYS[way]
    serve(core)  # what lasts beyond a request (a judge's history, a worker's pipes) is made by the first
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage to look at
    try:
        serve(core)
        gc.collect()
        left = sorted({_kind(thing) for thing in gc.garbage if _ours(thing)})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not left, f"left in reference cycles: {left}"


def _ours(thing) -> bool:
    """An object of the server's own making: of a class of its own, or a frame or function of its code."""
    code = getattr(thing, "f_code", None) or getattr(thing, "__code__", None)
    if code is not None:
        return "/container/" in code.co_filename
    return type(thing).__module__.startswith("container.")


def _kind(thing) -> str:
    code = getattr(thing, "f_code", None) or getattr(thing, "__code__", None)
    return f"{type(thing).__name__} {code.co_name}" if code is not None else type(thing).__qualname__
