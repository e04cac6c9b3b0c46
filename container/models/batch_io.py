"""Triton's ragged batching: inputs whose shape may differ between the requests of one batch
(`allow_ragged_batch`), which reach the model as one flat tensor of all their elements; tensors the
server makes for each batch to describe it (`batch_input`); and outputs cut back per request by the
shape of one of its inputs (`batch_output`). Shapes and values as Triton's backends give them; the
batch inputs follow the config's inputs where forward() binds by position."""

import math
from dataclasses import dataclass

import numpy as np

from container.errors import InvalidModel, ModelError
from container.models.triton_schema import model_config_pb2 as pb
from container.tensors import from_config

_BY_ITEM = ("BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN")
_TYPES = (pb.TYPE_INT32, pb.TYPE_FP32)


@dataclass(frozen=True)
class BatchInput:
    kind: str  # BatchInput.Kind's name
    targets: tuple[str, ...]  # the model inputs that receive it
    datatype: str  # INT32 or FP32
    source: str  # the request input it describes
    source_rank: int  # that input's dims, the batch dimension left out

    def shape(self) -> tuple[int, ...]:
        """Its shape as the model sees it, -1 where a batch decides."""
        return (-1, self.source_rank) if self.kind == "BATCH_ITEM_SHAPE" else (-1,)

    def value(self, sources: list[np.ndarray]) -> np.ndarray:
        """Its value for a batch whose requests hold `sources` (each with its batch dimension)."""
        counts = np.array([array.size for array in sources], np.int64)
        dtype = np.int32 if self.datatype == "INT32" else np.float32
        if self.kind == "BATCH_ELEMENT_COUNT":
            return counts.astype(dtype)
        if self.kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
            return np.cumsum(counts).astype(dtype)
        if self.kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
            return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
        if self.kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":  # its shape is what it says; Triton leaves the data unset
            return np.zeros(int(counts.max(initial=0)), dtype)
        rows = [array.shape[1:] for array in sources for _ in range(array.shape[0])]
        shapes = np.array(rows, dtype).reshape(len(rows), self.source_rank)
        return shapes if self.kind == "BATCH_ITEM_SHAPE" else shapes.reshape(-1)


@dataclass(frozen=True)
class BatchOutput:
    """BATCH_SCATTER_WITH_INPUT_SHAPE: the model returns the batch's values one request after another,
    each as large as its `source` input's shape makes the output's dims."""

    target: str
    dims: tuple[int, ...]  # the output's, with the batch dimension first where the model batches
    source: str


@dataclass(frozen=True)
class BatchIO:
    ragged: frozenset[str]
    inputs: tuple[BatchInput, ...]
    outputs: tuple[BatchOutput, ...]

    @classmethod
    def from_config(cls, config) -> "BatchIO | None":
        """The config's ragged inputs, batch inputs and batch outputs (None: it has none), refused with
        Triton's reasons where they do not make sense."""
        ragged = frozenset(t.name for t in config.input if t.allow_ragged_batch)
        if not ragged and not config.batch_input and not config.batch_output:
            return None
        inputs = {t.name: t for t in config.input}
        for name in ragged:
            if inputs[name].HasField("reshape"):
                raise InvalidModel(f"input '{name}' allows a ragged batch, so it reaches the model flat, as one "
                                   f"dimension of all the batch's elements: leave out its reshape")
        made = tuple(_batch_input(b, inputs, config.max_batch_size) for b in config.batch_input)
        targets = [t for b in made for t in b.targets]
        clashes = sorted({t for t in targets if t in inputs or targets.count(t) > 1})
        if clashes:
            raise InvalidModel(f"batch_input target(s) {clashes} name a config input or another batch input: the "
                               f"server makes them, so each needs a name of its own")
        outputs = {t.name: t for t in config.output}
        scattered = tuple(_batch_output(b, inputs, outputs, config.max_batch_size) for b in config.batch_output)
        named = [b.target for b in scattered]
        if len(set(named)) != len(named):
            raise InvalidModel(f"batch_output targets {named}: an output may be scattered by one batch_output only")
        return cls(ragged, made, scattered)

    def key(self, name: str, array: np.ndarray) -> tuple:
        """What requests must share in `name` to run in one batch: its type, and its shape unless ragged."""
        return (name, array.dtype.str, None if name in self.ragged else array.shape[1:])

    def merge(self, requests: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The model's tensors for a batch of `requests`: each input concatenated (a ragged one flat), then
        the batch inputs."""
        merged = {}
        for name, first in requests[0].items():
            if name in self.ragged:
                merged[name] = np.concatenate([r[name].reshape(-1) for r in requests])
            else:
                merged[name] = first if len(requests) == 1 else np.concatenate([r[name] for r in requests])
        for batch_input in self.inputs:
            value = batch_input.value([r[batch_input.source] for r in requests])
            merged.update((target, value) for target in batch_input.targets)
        return merged

    def scatter(self, outputs: dict[str, np.ndarray], requests: list[dict[str, np.ndarray]],
                shares: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """`shares` (each request's rows of the batch's `outputs`) with each scattered output replaced by
        the request's own elements, in the shape its source input gives."""
        for batch_output in self.outputs:
            name = batch_output.target
            if name not in outputs:
                continue
            shapes = [_scattered_shape(batch_output, r[batch_output.source]) for r in requests]
            starts = np.cumsum([0] + [math.prod(shape) for shape in shapes])
            if outputs[name].size != starts[-1]:
                raise ModelError(f"output '{name}' has {outputs[name].size} elements; scattered by input "
                                 f"'{batch_output.source}', its batch's requests need {starts[-1]}")
            flat = outputs[name].reshape(-1)
            for i, share in enumerate(shares):
                if name in share:
                    share[name] = flat[starts[i]: starts[i + 1]].reshape(shapes[i])
        return shares


def _batch_input(batch_input, inputs: dict, max_batch_size: int) -> BatchInput:
    what = f"batch input kind '{pb.BatchInput.Kind.Name(batch_input.kind)}'"
    source = _source(what, batch_input.source_input, inputs)
    if batch_input.data_type not in _TYPES:
        raise InvalidModel(f"{what}: batch input data type must be TYPE_INT32 or TYPE_FP32")
    if not batch_input.target_name:
        raise InvalidModel(f"{what} names no target_name: the model input that receives it")
    kind = pb.BatchInput.Kind.Name(batch_input.kind)
    if kind in _BY_ITEM and not max_batch_size:
        raise InvalidModel(f"{what} gives the shape of each batch item: it needs a model that batches "
                           f"(max_batch_size above 0)")
    datatype = from_config(pb.DataType.Name(batch_input.data_type))
    return BatchInput(kind, tuple(batch_input.target_name), datatype, source, len(inputs[source].dims))


def _batch_output(batch_output, inputs: dict, outputs: dict, max_batch_size: int) -> BatchOutput:
    what = f"batch output kind '{pb.BatchOutput.Kind.Name(batch_output.kind)}'"
    source = _source(what, batch_output.source_input, inputs)
    if len(batch_output.target_name) != 1 or batch_output.target_name[0] not in outputs:
        raise InvalidModel(f"{what} must name one config output as its target_name (the outputs are "
                           f"{sorted(outputs)}), got {list(batch_output.target_name)}")
    output = outputs[batch_output.target_name[0]]
    if output.HasField("reshape"):
        raise InvalidModel(f"output '{output.name}' is scattered by its source input's shape (batch_output): leave "
                           f"out its reshape")
    lead = (-1,) if max_batch_size else ()
    dims, source_dims = lead + tuple(output.dims), lead + tuple(inputs[source].dims)
    if any(d == -1 and i >= len(source_dims) for i, d in enumerate(dims)):
        raise InvalidModel(f"output '{output.name}' {list(dims)} takes each variable dimension from input "
                           f"'{source}' {list(source_dims)}, which has fewer dimensions")
    return BatchOutput(output.name, dims, source)


def _source(what: str, sources, inputs: dict) -> str:
    """The one config input a batch input or output is made from, in every request."""
    if len(sources) != 1:  # Triton's words
        raise InvalidModel(f"{what} expects 1 source input, got {len(sources)}")
    [source] = sources
    if source not in inputs:
        raise InvalidModel(f"{what}: unknown source input name '{source}'; the config's inputs are {sorted(inputs)}")
    if inputs[source].optional:
        raise InvalidModel(f"{what}: its source input '{source}' is optional; a batch needs it in every request")
    return source


def _scattered_shape(batch_output: BatchOutput, source: np.ndarray) -> tuple[int, ...]:
    return tuple(source.shape[i] if d == -1 else d for i, d in enumerate(batch_output.dims))

