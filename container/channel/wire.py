"""The channel's wire: each message is a 4-byte little-endian length and a msgpack document.

A call is `[id, op, args]`; its answer `[id, 0, result]`, or `[id, 1, [error class, message, status]]`.
An operation that streams sends `[id, 2, item]` for each item first, then its answer; a group operation
sends `[id, 3, [item, …]]` for the items it made in one turn (`pack_items`); `[id, CANCEL,
[stream's id]]` stops a stream whose caller went away, and `[id, CANCEL, [stream's id, position]]` one
call of a group operation's stream; neither is answered.
Tensors travel as msgpack extension types holding their raw bytes, never as lists of numbers; unpacking
makes only plain values and numeric arrays (no code runs, no object dtype from the wire), so a frame a
peer forged cannot do more than a client's own request. Binary data marked `blobs.Large` travels
beside the frame, in shared memory (blobs.py), and arrives as a read-only memoryview."""

import functools
import logging
import math
import struct

import msgpack
import numpy as np

from container import errors
from container.channel.blobs import Blobs, Large
from container.errors import PayloadTooLarge, ServeError
from container.tensors import DATATYPES, little_endian, pack_strings, unpack_strings

log = logging.getLogger(__name__)
LENGTH = struct.Struct("<I")
ANSWER, ERROR, ITEM, ITEMS = 0, 1, 2, 3  # what a frame from the model process carries
CANCEL = "cancel stream"  # the op that stops a stream (no operation's name has a space)
MAX_FRAME = (1 << 32) - 1
_ARRAY, _STRINGS, _BLOB = 1, 2, 3  # extension codes: a numeric tensor; a BYTES tensor; data in shared memory
_HEAD = struct.Struct("<8sB")  # dtype (numpy's str, e.g. '<f4'), number of dimensions; then int64 dims
_DIMS = [struct.Struct(f"<{ndim}q") for ndim in range(256)]  # the dims of a head, by their number
_NUMERIC = "biuf"
_DTYPES = {dtype.str.encode().ljust(8, b"\0"): dtype  # the tensor datatypes' numeric dtypes, by their names in a head
           for dtype in map(little_endian, DATATYPES) if dtype.kind in _NUMERIC}


def pack(message, blobs: Blobs | None = None, limit: int = MAX_FRAME) -> bytes:
    """`message` as a frame: length, then msgpack; `blobs` takes its `Large` values. A call past `limit`
    (the peer's, `channel.max_call`) is PayloadTooLarge, and nothing of it is left in shared memory."""
    put = []
    body = packed(message, blobs, put)
    if len(body) > limit:
        for name in put:
            blobs.discard(name)
        raise PayloadTooLarge(f"the request takes {len(body)} bytes as the front-end hands it to the model process, "
                              f"past the {limit} bytes allowed (SAGEMAKER_MAX_PAYLOAD_IN_MB and 1 MiB to describe it); "
                              f"send its tensors as binary data, or raise SAGEMAKER_MAX_PAYLOAD_IN_MB")
    return LENGTH.pack(len(body)) + body


def packed(value, blobs: Blobs | None = None, put: list | None = None) -> bytes:
    """`value` in msgpack, without a frame's length; `blobs` takes its `Large` values, and `put` the
    names it gave them."""
    def extension(value):
        if isinstance(value, Large):
            try:
                name = blobs.put(value.data)
            except (AttributeError, OSError):  # no blobs here, or /dev/shm is full (Docker gives it 64 MiB)
                return value.data
            if put is not None:
                put.append(name)
            return msgpack.ExtType(_BLOB, msgpack.packb([name, len(value.data)]))
        return _extension(value)

    return msgpack.packb(value, default=extension, use_bin_type=True)


def pack_items(call_id: int, items: list[bytes]) -> bytes:
    """The frame `[call_id, ITEMS, [item, …]]` of a stream's `items`, each `packed` already (so that an
    item that cannot cross fails as it is made, not when its frame is sent)."""
    body = b"".join([_ITEMS_FRAME, msgpack.packb(call_id), _ITEMS_KIND, _array_header(len(items)), *items])
    return LENGTH.pack(len(body)) + body


def _array_header(length: int) -> bytes:
    """msgpack's head of an array of `length` values (its spec: fixarray, array 16, array 32)."""
    if length < 16:
        return bytes([0x90 | length])
    if length < 1 << 16:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


_ITEMS_FRAME, _ITEMS_KIND = _array_header(3), msgpack.packb(ITEMS)  # the head of every ITEMS frame


def unpack(body, blobs: Blobs | None = None) -> object:
    def extension(code: int, data: bytes):
        if code == _BLOB and blobs is not None:
            return blobs.take(*msgpack.unpackb(data, raw=False))
        return _tensor(code, data)

    return msgpack.unpackb(body, ext_hook=extension, raw=False, strict_map_key=False, use_list=True)


def error_of(exc: Exception) -> list:
    """`exc` as the peer raises it again; an exception outside the tree is a bug in this process, logged
    with its traceback and sent as a 500 that shows nothing of it."""
    if isinstance(exc, ServeError):
        return [type(exc).__name__, str(exc), exc.status]
    log.error("channel call failed", exc_info=exc)
    return ["ServeError", "internal error in the server; see its log", 500]


def error_from(name: str, message: str, status: int) -> ServeError:
    """The error a peer raised, as the same class of the one tree (a ServeError when the name is not in it),
    for the caller to raise: raised here, it would hold this frame, which holds it, a reference cycle."""
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, ServeError)):
        cls = ServeError
    exc = cls.__new__(cls)
    ServeError.__init__(exc, message)
    exc.status = status
    return exc


def _extension(value):
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OSU":
            return msgpack.ExtType(_STRINGS, _dims(value) + pack_strings(value))
        if value.dtype.kind not in _NUMERIC:
            raise TypeError(f"a {value.dtype} tensor cannot cross the channel")
        dtype = value.dtype.newbyteorder("<") if value.dtype.byteorder == ">" else value.dtype
        return msgpack.ExtType(_ARRAY, _array_head(dtype, value.shape) + np.ascontiguousarray(value, dtype).tobytes())
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} cannot cross the channel")


@functools.lru_cache(maxsize=1024)
def _array_head(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A numeric tensor's head, made once for each dtype and shape: a request's tensors take few of them,
    and making one cost 0.6 µs of the 1.5 its extension took."""
    return _HEAD.pack(dtype.str.encode(), len(shape)) + _shape(shape)


def _dims(array: np.ndarray) -> bytes:
    return _HEAD.pack(b"|O", array.ndim) + _shape(array.shape)


def _shape(shape: tuple[int, ...]) -> bytes:
    return _DIMS[len(shape)].pack(*shape)


def _tensor(code: int, data: bytes):
    # struct and a dtype table rather than numpy for the head: a small tensor's unpacking cost 10 µs, 3 of it here
    try:
        name, ndim = _HEAD.unpack_from(data)
        shape = _DIMS[ndim].unpack_from(data, _HEAD.size)
    except struct.error:
        raise ValueError("a channel tensor's head is cut short") from None
    start = _HEAD.size + 8 * ndim
    if code == _STRINGS:
        return unpack_strings("", data[start:], math.prod(shape)).reshape(shape)
    if code != _ARRAY:
        return msgpack.ExtType(code, data)
    dtype = _DTYPES.get(name) or _dtype(name)
    return np.frombuffer(data, dtype, offset=start).reshape(shape)


def _dtype(name: bytes) -> np.dtype:
    dtype = np.dtype(name.rstrip(b"\0").decode())
    if dtype.kind not in _NUMERIC:
        raise ValueError(f"a {dtype} tensor on the channel")
    return dtype

