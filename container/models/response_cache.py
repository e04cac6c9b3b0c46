"""Triton's response cache: a model whose config says `response_cache { enable: true }` has the
outputs of its successful requests kept, so that the same request again is answered without running
it. One cache for every model, of at most `SERVE_RESPONSE_CACHE_SIZE` bytes; the least recently used
responses leave first. A response is found by a digest of the model's load, the version, the
request's inputs (names, types, shapes, values) and the outputs it asks for, and, for models that read
them (python models, ensembles), its parameters: a model loaded again never answers from what its
previous load computed."""

import hashlib
from collections import OrderedDict

import numpy as np

_DIGEST_BYTES = 16  # 128 bits: a collision would answer one request with another's outputs
# what a kept response holds beside its tensors' data, measured with tracemalloc: its key, its dict and its
# place in the order (about 320 bytes), and each tensor's array object (about 140)
_ENTRY_BYTES, _ARRAY_BYTES = 320, 144


class ResponseCache:
    def __init__(self, most_bytes: int):
        self.most_bytes = most_bytes
        self.bytes = 0  # what the kept responses hold
        self.evictions = 0
        self._entries: OrderedDict[bytes, tuple[dict[str, np.ndarray], int]] = OrderedDict()

    @staticmethod
    def key(load: int, version: int, inputs: dict[str, np.ndarray], outputs: list[str] | None,
            parameters: dict | None) -> bytes:
        """The digest a request's response is kept under; `parameters`: None where the model cannot read them."""
        digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
        digest.update(repr((load, version, sorted(outputs) if outputs else None,
                            sorted(parameters.items()) if parameters else None)).encode())
        for name in sorted(inputs):
            array = inputs[name]
            digest.update(repr((name, array.dtype.str, array.shape)).encode())
            if array.dtype.kind == "O":  # BYTES: each element behind its length
                for value in array.reshape(-1):
                    data = value if isinstance(value, bytes) else str(value).encode()
                    digest.update(len(data).to_bytes(8, "little"))
                    digest.update(data)
            else:
                digest.update(np.ascontiguousarray(array).data)
        return digest.digest()

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return dict(entry[0])

    def put(self, key: bytes, outputs: dict[str, np.ndarray]) -> None:
        """Keep a copy of `outputs` (read-only: every answer from it shares it), making room by least
        recent use; a response larger than the whole cache is not kept."""
        kept = {name: _frozen(array) for name, array in outputs.items()}
        size = _ENTRY_BYTES + sum(_ARRAY_BYTES + _bytes(array) for array in kept.values())
        if size > self.most_bytes or key in self._entries:
            return
        while self.bytes + size > self.most_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self.bytes -= freed
            self.evictions += 1
        self._entries[key] = (kept, size)
        self.bytes += size


def _frozen(array: np.ndarray) -> np.ndarray:
    copy = np.array(array, copy=True)
    copy.flags.writeable = False
    return copy


def _bytes(array: np.ndarray) -> int:
    if array.dtype.kind == "O":
        return array.nbytes + sum(len(value) if isinstance(value, bytes) else len(str(value)) for value in array.reshape(-1))
    return array.nbytes
