"""The generate extension's shape rule: a flat list of values filling an input's dims as Triton fills them."""

import pytest

from container.api.v2_generate import _shape
from container.errors import InvalidRequest


@pytest.mark.parametrize("dims, count, shape", [
    ((-1, 4), 8, [2, 4]),  # a batching model: the batch takes what the row leaves
    ((-1, -1), 3, [1, 3]),  # the innermost variable dimension takes the values, the others are 1
    ((2, -1), 6, [2, 3]),
    ((4,), 4, [4]),
    ((), 1, []),  # a scalar
    ((-1,), 0, [0]),
])
def test_values_fill_fixed_dimensions_then_the_innermost_variable_one(dims, count, shape):
    assert _shape("x", dims, count) == shape


@pytest.mark.parametrize("dims, count", [((4,), 3), ((-1, 3), 4), ((), 2), ((2, 2), 8)])
def test_values_that_cannot_fill_the_dims_are_refused(dims, count):
    with pytest.raises(InvalidRequest, match=f"input 'x': {count} value"):
        _shape("x", dims, count)
