"""The response cache's keys and its least-recently-used bound."""

import numpy as np
import pytest

from container.models.response_cache import ResponseCache


def key(value, load=1, outputs=None, parameters=None, dtype=np.float32) -> bytes:
    return ResponseCache.key(load, 1, {"x": np.array([[value]], dtype)}, outputs, parameters)


@pytest.mark.parametrize("other", [
    key(2.0), key(1.0, load=2), key(1.0, outputs=["y"]), key(1.0, parameters={"factor": 2}), key(1.0, dtype=np.float64),
    ResponseCache.key(1, 1, {"x": np.array([[1.0, 0.0]], np.float32)}, None, None),
    ResponseCache.key(1, 2, {"x": np.array([[1.0]], np.float32)}, None, None),
])
def test_requests_that_may_answer_differently_have_different_keys(other):
    assert key(1.0) == key(1.0) and key(1.0) != other


def test_text_tensors_are_keyed_by_their_elements_and_lengths():
    def text(*values) -> bytes:
        return ResponseCache.key(1, 1, {"t": np.array(values, dtype=object)}, None, None)

    assert text(b"ab", b"c") != text(b"a", b"bc") and text(b"ab", b"c") == text(b"ab", b"c")


def test_the_least_recently_used_leave_first_and_a_response_larger_than_the_cache_is_not_kept():
    cache = ResponseCache(3 * 500)
    for value in (1.0, 2.0, 3.0):
        cache.put(key(value), {"y": np.zeros(4, np.float32)})
    assert cache.get(key(1.0)) is not None  # 1 used again: 2 is now the least recent
    cache.put(key(4.0), {"y": np.zeros(4, np.float32)})
    assert cache.get(key(2.0)) is None and cache.get(key(1.0)) is not None and cache.evictions == 1
    cache.put(key(5.0), {"y": np.zeros(1000, np.float32)})
    assert cache.get(key(5.0)) is None and cache.bytes <= cache.most_bytes


def test_a_kept_response_is_a_copy_no_answer_can_change():
    cache, outputs = ResponseCache(1 << 20), {"y": np.ones(4, np.float32)}
    cache.put(key(1.0), outputs)
    outputs["y"][0] = 7
    kept = cache.get(key(1.0))["y"]
    assert kept[0] == 1 and not kept.flags.writeable
