import numpy as np
import pytest

from container import content
from container.errors import InvalidRequest, NotAcceptable


@pytest.mark.parametrize("accept, expected", [
    (None, "application/json"), ("", "application/json"), ("*/*", "application/json"),
    ("text/csv", "text/csv"), ("text/csv; charset=utf-8", "text/csv"),
    ("text/html, application/x-npy, application/json", "application/x-npy"),
    ("TEXT/CSV", "text/csv"), ("image/png, */*", "application/json"),
])
def test_negotiate(accept, expected):
    assert content.negotiate(accept) == expected


def test_negotiate_refuses_unsupported():
    with pytest.raises(NotAcceptable, match="image/png"):
        content.negotiate("image/png, text/html")


def test_media_type():
    assert content.media_type("application/json; charset=utf-8") == "application/json"
    assert content.media_type(None) == "application/json"


def test_round_trips():
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    assert np.array_equal(content.decode_npy(content.encode_npy(array)), array)
    assert content.decode_npy(content.encode_npy(array)).dtype == np.int16
    assert content.decode_csv(content.encode_csv(array)).tolist() == array.tolist()
    assert content.encode_json(np.array([1.5, 2], dtype=np.float16)) == b"[1.5,2.0]"
    assert content.encode_json(np.array([b"a", b"b"], dtype=object)) == b'["a","b"]'


def test_npy_never_unpickles():
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InvalidRequest, match="object arrays are refused"):
        content.decode_npy(buffer.getvalue())


def test_csv_rank_limit():
    with pytest.raises(NotAcceptable, match="2 dimensions"):
        content.encode_csv(np.zeros((1, 1, 1)))


@pytest.mark.parametrize("accept, expected", [
    (None, "application/json"),
    ("*/*", "application/json"),
    ("text/csv;q=0.5, application/json", "application/json"),
    ("*/*, text/csv", "text/csv"),
    ("text/*", "text/csv"),
    ("image/png, application/x-npy;q=0.2", "application/x-npy"),
    ("application/json;q=0, */*;q=0.1", "text/csv"),
    ("TEXT/CSV; charset=utf-8", "text/csv"),
])
def test_negotiate_by_quality_then_specificity(accept, expected):
    assert content.negotiate(accept) == expected


def test_wildcards_take_the_default_type():
    assert content.negotiate("*/*", default="text/csv") == "text/csv"
    assert content.preferred("*/*", default="text/csv") == "text/csv"
    assert content.preferred("image/*;q=1, image/png;q=0.5") == "image/png"


def test_nothing_acceptable_is_406():
    with pytest.raises(NotAcceptable):
        content.negotiate("image/png, text/csv;q=0")
