"""The channel's wire (container/channel/wire.py): what crosses comes back equal, tensors as their raw
bytes, large data beside the frame in shared memory, and a frame can make nothing but plain values,
numeric or BYTES tensors, and mappings of data this server's processes wrote."""

import os

import msgpack
import numpy as np
import pytest

from container import errors
from container.channel import blobs as blobs_module
from container.channel import wire
from container.channel.blobs import Blobs


def round_trip(value):
    frame = wire.pack(value)
    assert wire.LENGTH.unpack(frame[:4])[0] == len(frame) - 4
    return wire.unpack(frame[4:])


@pytest.mark.parametrize("dtype", ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                                   "float16", "float32", "float64", ">f4", ">i8"])
def test_numeric_tensors_keep_dtype_shape_and_values(dtype):
    array = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    back = round_trip({"x": array, "scalar": np.float32(1.5)})
    assert back["x"].dtype == array.dtype.newbyteorder("<") and back["x"].shape == (2, 3, 4)
    np.testing.assert_array_equal(back["x"], array)
    assert back["scalar"] == 1.5


def test_a_non_contiguous_empty_or_zero_dimensional_tensor_crosses_whole():
    array = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(round_trip([array])[0], array)
    assert round_trip([np.empty((0, 5), np.float32)])[0].shape == (0, 5)
    zero_d = round_trip([np.array(7, np.int16)])[0]
    assert zero_d.shape == () and zero_d.dtype == np.int16 and zero_d == 7


def test_bytes_tensors_cross_as_bytes():
    strings = np.array([[b"a", b""], ["ü".encode(), b"\0\xff"]], dtype=object)
    back = round_trip([strings, np.array(["text"])])
    assert back[0].dtype == object and back[0].tolist() == strings.tolist()
    assert back[1].tolist() == [b"text"]


def test_documents_keep_their_plain_values():
    document = {"id": "r1", "parameters": {"sequence_id": 2**63 - 1, "flag": True, "rate": 0.5, "none": None},
                "inputs": [{"name": "x", "shape": [1, 4]}], "binary": b"\x00\x01"}
    assert round_trip(document) == document


@pytest.mark.parametrize("count", [0, 1, 15, 16, 65_535, 65_536])
def test_items_packed_one_by_one_cross_as_one_frame_of_them_all(count):
    """msgpack heads an array of up to 15 values, of up to 65,535, and of more, each its own way."""
    items = [[position, None, np.full(2, position, np.int32)] for position in range(count)]
    frame = wire.pack_items(7, [wire.packed(item) for item in items])
    assert wire.LENGTH.unpack(frame[:4])[0] == len(frame) - 4
    call_id, kind, back = wire.unpack(frame[4:])
    assert (call_id, kind, len(back)) == (7, wire.ITEMS, count)
    assert all(b[:2] == i[:2] and (b[2] == i[2]).all() for b, i in zip(back, items, strict=True))


def test_what_is_not_data_does_not_cross():
    with pytest.raises(TypeError):
        wire.pack([object()])
    with pytest.raises(TypeError):
        wire.pack([np.array([1 + 2j])])


def test_a_forged_frame_makes_no_object_array_and_a_cut_one_is_refused():
    head = wire._HEAD.pack(b"|O", 1) + np.asarray([2], "<i8").tobytes()
    forged = msgpack.packb(msgpack.ExtType(1, head + b"\0" * 16))
    with pytest.raises(ValueError, match="object"):
        wire.unpack(forged)
    cut = msgpack.packb(msgpack.ExtType(1, wire._HEAD.pack(b"<f4", 3) + np.asarray([2], "<i8").tobytes()))
    with pytest.raises(ValueError, match="cut short"):
        wire.unpack(cut)


@pytest.mark.parametrize("cls", [errors.InvalidInput, errors.ModelNotFound, errors.Unavailable, errors.InsufficientMemory,
                                 errors.Unsupported])
def test_errors_come_back_as_the_same_class_with_status_and_words(cls):
    name, message, status = wire.error_of(cls("what to fix"))
    error = wire.error_from(name, message, status)
    assert type(error) is cls and str(error) == "what to fix" and error.status == cls.status


def test_an_unknown_error_name_is_a_server_error_with_its_status():
    error = wire.error_from("NotAnError", "words", 418)
    assert type(error) is errors.ServeError and error.status == 418


# -- large values beside the frame (container/channel/blobs.py) ---------------------------------------


@pytest.fixture
def blobs(tmp_path):
    return Blobs("container-test", tmp_path)


def test_large_data_crosses_in_shared_memory_and_leaves_nothing(blobs, tmp_path):
    data = np.random.default_rng(0).bytes(blobs_module.THRESHOLD + 1)
    frame = wire.pack([1, "infer", [blobs_module.large(data), blobs_module.large(b"small")]], blobs)
    assert len(frame) < 200 and len(list(tmp_path.iterdir())) == 1  # the name crossed, not the data
    _, _, (back, small) = wire.unpack(frame[4:], blobs)
    assert isinstance(back, memoryview) and bytes(back) == data and small == b"small"
    assert list(tmp_path.iterdir()) == []  # the receiver removed the name as it mapped the data


def test_a_call_past_the_peers_limit_is_refused_before_it_is_sent_and_leaves_nothing(blobs, tmp_path):
    data = bytes(blobs_module.THRESHOLD)
    numbers = list(range(100_000))  # JSON's numbers, as a parsed document holds them: up to 9 bytes each
    with pytest.raises(errors.PayloadTooLarge, match=r"past the 200000 bytes allowed \(SAGEMAKER_MAX_PAYLOAD_IN_MB"):
        wire.pack([1, "v2_infer", [{"data": numbers}, blobs_module.large(data)]], blobs, limit=200_000)
    assert list(tmp_path.iterdir()) == []  # the data it had put in shared memory is gone
    assert len(wire.pack([1, "v2_infer", [{"data": numbers[:1000]}, blobs_module.large(data)]], blobs, limit=200_000)) < 200_000


def test_what_the_receiver_writes_stays_its_own(blobs, tmp_path):
    """The mapping is copy-on-write: an array over it is writable (torch takes it without a copy), and a
    write never reaches the data another process mapped."""
    name = blobs.put(b"\0" * blobs_module.THRESHOLD)
    with (tmp_path / name).open("rb") as other:  # another process's view of the same data
        array = np.frombuffer(blobs.take(name, blobs_module.THRESHOLD), np.uint8)
        assert array.flags.writeable
        array[:4] = 7
        assert other.read(4) == b"\0" * 4 and array[:5].tolist() == [7, 7, 7, 7, 0]


def test_without_blobs_large_data_stays_in_the_frame():
    data = b"x" * blobs_module.THRESHOLD
    assert wire.unpack(wire.pack([blobs_module.large(data)])[4:]) == [data]


def test_a_full_shared_memory_falls_back_to_the_frame(tmp_path):
    gone = Blobs("container-test", tmp_path / "missing")  # any OSError: ENOSPC on a full /dev/shm, here ENOENT
    data = b"y" * blobs_module.THRESHOLD
    assert wire.unpack(wire.pack([blobs_module.large(data)], gone)[4:], gone) == [data]


@pytest.mark.parametrize("forge", ["other-name", "link", "size"])
def test_the_receiver_takes_only_what_a_process_of_this_server_wrote(blobs, tmp_path, forge):
    name = blobs.put(b"z" * 10)
    if forge == "other-name":
        (tmp_path / name).rename(tmp_path / "elsewhere")
        name = "elsewhere"
    elif forge == "link":
        (tmp_path / "target").write_bytes(b"z" * 10)
        (tmp_path / name).unlink()
        (tmp_path / name).symlink_to(tmp_path / "target")
    with pytest.raises((ValueError, OSError)):
        blobs.take(name, 11 if forge == "size" else 10)


def test_what_nobody_took_is_removed_by_the_master(blobs, tmp_path):
    blobs.put(b"left behind")
    (tmp_path / "unrelated").write_bytes(b"")
    blobs.remove_all()
    assert [p.name for p in tmp_path.iterdir()] == ["unrelated"]


def test_what_one_process_wrote_may_be_spared(blobs, tmp_path):
    """The model process's last answers, which the front-ends may still be reading as it exits."""
    ours = blobs.put(b"an answer")
    (tmp_path / "container-test-1-0").write_bytes(b"a request for it")  # another process's (pid 1)
    blobs.remove_all(sparing=os.getpid())
    assert [p.name for p in tmp_path.iterdir()] == [ours]


def test_what_a_connection_s_reader_never_took_goes_when_it_hangs_up(blobs, tmp_path):
    """The model process writes for each front-end's connection apart: one killed with large answers on
    their way leaves them to nobody, and the others' are theirs still."""
    first, second = (Blobs("container-test", tmp_path, connection=n) for n in (0, 1))
    taken, untaken, others = first.put(b"read"), first.put(b"never read"), second.put(b"on its way")
    assert bytes(blobs.take(taken, 4)) == b"read"  # a front-end takes what it reads at once
    first.remove_untaken()
    assert [p.name for p in tmp_path.iterdir()] == [others] and untaken != others
    assert bytes(blobs.take(others, 10)) == b"on its way"
    second.put(b"a last answer")
    blobs.remove_all(sparing=os.getpid())  # the model process's own, per connection or not, spared alike
    assert len(list(tmp_path.iterdir())) == 1
