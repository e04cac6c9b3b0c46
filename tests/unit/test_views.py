"""A front-end's views of the models (v2/views.py): which answers make it fetch a view again, and what
a call decoded against one weighs for grouping."""

import json

import numpy as np

from container.v2.views import Views, call_size

DESCRIPTION = [7, 8, [["x", "FP32", [4], False]], [["y", "FP32", [4], False]], {}]


def test_a_view_decoded_against_an_earlier_load_is_dropped_and_a_newer_one_kept():
    views = Views()
    old = views.keep("double", DESCRIPTION)
    new = views.keep("double", [8, *DESCRIPTION[1:]])
    views.stale("double", old)  # a request decoded against the first load came back stale
    assert views.views["double"] is new
    views.stale("double", new)
    assert "double" not in views.views


def test_a_missing_version_keeps_the_view_and_a_missing_model_drops_it():
    views = Views()
    view = views.keep("double", DESCRIPTION)
    views.not_found("double", view, version_named=True)  # the version is not there; the load may still serve
    assert views.views["double"] is view
    views.not_found("double", view, version_named=False)  # the model itself is not there
    assert "double" not in views.views


def test_a_decoded_call_weighs_its_tensors_where_they_outweigh_its_body():
    body = json.dumps({"instances": [[0] * 1000]}).encode()  # two bytes a value
    assert call_size(len(body), {"x": np.zeros((1, 1000), np.float64)}) == 8000
    assert call_size(len(body), {"x": np.zeros((1, 10), np.float32)}) == len(body)
    assert call_size(0, {"x": np.ones((1, 64), np.int32)}) == 256  # gRPC's typed contents: no raw bytes
