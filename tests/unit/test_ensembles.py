"""An ensemble's graph (backends/ensemble.py) and how the core runs it (ensembles.py), with steps that
are plain functions: what runs at once, what waits, what fails, and the bound on requests under way."""

import gevent
import numpy as np
import pytest
from gevent.event import Event
from google.protobuf import json_format

from container import ensembles
from container.backends.ensemble import Ensemble
from container.errors import InvalidModel, InvalidRequest
from container.models.signature import Signature, TensorSpec
from container.models.triton_schema import model_config_pb2 as pb
from tests.builders import poll, take_turns


def plan(steps, inputs=("RAW",), outputs=("OUT",), **scheduling) -> Ensemble:
    document = {"name": "e", "platform": "ensemble",
                "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [1]} for n in inputs],
                "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [1]} for n in outputs],
                "ensemble_scheduling": {"step": [{"model_name": m, "model_version": -1, "input_map": i, "output_map": o}
                                                 for m, i, o in steps], **scheduling}}
    return Ensemble("e", json_format.ParseDict(document, pb.ModelConfig()))


DIAMOND = [("a", {"x": "RAW"}, {"y": "A"}), ("b", {"x": "RAW"}, {"y": "B"}),
           ("join", {"left": "A", "right": "B"}, {"y": "OUT"})]


@pytest.mark.parametrize("steps, message", [
    ([], "no ensemble_scheduling steps"),
    ([("a", {"x": "RAW"}, {"y": "OUT"}), ("b", {"x": "RAW"}, {"y": "OUT"})], "made twice"),
    ([("a", {"x": "NOWHERE"}, {"y": "OUT"})], "which no input or step makes"),
    ([("a", {"x": "RAW"}, {"y": "MID"})], "made by no step"),
    ([("a", {"x": "RAW", "z": "B"}, {"y": "A"}), ("b", {"x": "A"}, {"y": "B"}), ("c", {"x": "B"}, {"y": "OUT"})], "a cycle"),
])
def test_a_graph_that_cannot_run_is_refused_at_load(steps, message):
    with pytest.raises(InvalidModel, match=message):
        plan(steps)


def signature(inputs: dict, outputs: dict, batched: int = 0) -> Signature:
    """name → (datatype, dims) each way; `batched`: its max_batch_size (a leading -1 then, as such a model has)."""
    lead = (-1,) if batched else ()
    return Signature(tuple(TensorSpec(n, t, lead + d) for n, (t, d) in inputs.items()),
                     tuple(TensorSpec(n, t, lead + d) for n, (t, d) in outputs.items()), batched)


CHAIN = [("a", {"x": "RAW"}, {"y": "MID"}), ("b", {"x": "MID"}, {"y": "OUT"})]
ONE = {"x": ("FP32", (1,))}, {"y": ("FP32", (1,))}


@pytest.mark.parametrize("a, b, message", [
    (signature(*ONE), signature(*ONE), None),
    (signature(*ONE), signature({"x": ("FP32", (-1,))}, {"y": ("FP32", (1,))}), None),  # -1 takes any size
    (signature(*ONE), signature(*ONE, batched=8),  # a model without batching feeds one with it
     r"tensor 'MID' is FP32\[1\] as output 'y' of step 'a' but FP32\[-1, 1\] as input 'x' of step 'b'"),
    (signature(*ONE), signature({"x": ("INT32", (1,))}, {"y": ("FP32", (1,))}),
     r"tensor 'MID' is FP32\[1\] as output 'y' of step 'a' but INT32\[1\] as input 'x' of step 'b'"),
    (signature({"x": ("FP32", (2,))}, {"y": ("FP32", (1,))}), signature(*ONE),
     r"tensor 'RAW' is FP32\[1\] as the ensemble's input but FP32\[2\] as input 'x' of step 'a'"),
    (signature(*ONE), signature({"x": ("FP32", (1,))}, {"y": ("FP32", (3,))}),
     r"tensor 'OUT' is FP32\[3\] as output 'y' of step 'b' but FP32\[1\] as the ensemble's output"),
])
def test_a_tensor_is_one_datatype_and_shape_wherever_a_step_makes_or_reads_it(a, b, message):
    """Else every request would fail where they part (an ensemble of a model without batching feeding one with it
    loaded, and refused each request with a 400 of the second step's shape)."""
    graph = plan(CHAIN)
    own = signature({"RAW": ("FP32", (1,))}, {"OUT": ("FP32", (1,))})
    if message is None:
        graph.check_tensors(own, {"a": a, "b": b})
    else:
        with pytest.raises(InvalidModel, match=message):
            graph.check_tensors(own, {"a": a, "b": b})


def test_no_step_that_batches_takes_smaller_batches_than_its_ensemble():
    graph = plan(CHAIN)
    own = signature({"RAW": ("FP32", (1,))}, {"OUT": ("FP32", (1,))}, batched=8)
    graph.check_tensors(own, {"a": signature(*ONE, batched=8), "b": signature(*ONE, batched=16)})
    with pytest.raises(InvalidModel, match="ensemble 'e' allows batches of 8, but its step model 'b' only of 4"):
        graph.check_tensors(own, {"a": signature(*ONE, batched=8), "b": signature(*ONE, batched=4)})


def test_independent_steps_run_at_once_and_a_join_waits_for_both():
    started, release = [], Event()

    def infer(step, inputs):
        started.append(step.model)
        if step.model == "a":
            release.wait()
        value = next(iter(inputs.values()))
        return {"y": value + 1 if step.model != "join" else inputs["left"] * inputs["right"]}

    runner = gevent.spawn(ensembles.run, plan(DIAMOND), {"RAW": np.array([1.0])}, None, infer)
    poll(lambda: started == ["a", "b"], 5, "the two branches did not start together")
    take_turns()
    assert "join" not in started  # it waits for the held branch
    release.set()
    assert runner.get(timeout=5)["OUT"].tolist() == [4.0]


def test_the_first_failing_step_fails_the_request_and_stops_the_others():
    held = Event()
    stopped = []

    def infer(step, inputs):
        if step.model == "a":
            try:
                held.wait()
            except gevent.GreenletExit:
                stopped.append("a")
                raise
        raise InvalidRequest(f"step {step.model} refused")

    with pytest.raises(InvalidRequest, match=r"^in ensemble '\w+', step b refused$"):  # as Triton names the ensemble
        ensembles.run(plan(DIAMOND), {"RAW": np.array([1.0])}, None, infer)
    assert stopped == ["a"]


def test_a_chain_runs_in_the_requests_own_greenlet_and_fails_with_its_steps_error():
    chain = plan([("a", {"x": "RAW"}, {"y": "A"}), ("b", {"x": "A"}, {"y": "B"}), ("c", {"x": "B"}, {"y": "OUT"})])
    ran_in = []

    def infer(step, inputs):
        ran_in.append(gevent.getcurrent())
        if inputs["x"][0] < 0:
            raise InvalidRequest(f"step {step.model} refused")
        return {"y": inputs["x"] * 2}

    assert ensembles.run(chain, {"RAW": np.array([1.0])}, None, infer)["OUT"].tolist() == [8.0]
    assert ran_in == [gevent.getcurrent()] * 3
    with pytest.raises(InvalidRequest, match=r"^in ensemble '\w+', step a refused$"):
        ensembles.run(chain, {"RAW": np.array([-1.0])}, None, infer)


def test_max_inflight_requests_bounds_each_steps_requests_under_way():
    ensemble = plan([("a", {"x": "RAW"}, {"y": "OUT"})], max_inflight_requests=2)
    inside, most, release = [0], [0], Event()

    def infer(step, inputs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        release.wait()
        inside[0] -= 1
        return {"y": inputs["x"]}

    requests = [gevent.spawn(ensembles.run, ensemble, {"RAW": np.array([float(i)])}, None, infer) for i in range(5)]
    poll(lambda: inside[0] == 2, 5, "two requests did not enter the step")
    take_turns()
    assert inside[0] == 2
    release.set()
    assert [r.get(timeout=5)["OUT"][0] for r in requests] == [0, 1, 2, 3, 4]
    assert most[0] == 2


def test_only_the_outputs_asked_for_are_answered():
    ensemble = plan([("a", {"x": "RAW"}, {"y": "OUT", "z": "OTHER"})], outputs=("OUT", "OTHER"))
    answer = ensembles.run(ensemble, {"RAW": np.array([1.0])}, ["OTHER"], lambda step, inputs: {"y": 1, "z": 2})
    assert answer == {"OTHER": 2}
