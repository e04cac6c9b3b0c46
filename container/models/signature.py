"""A model's tensors as clients see them, and the check every request passes before it runs."""

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from container.errors import InvalidInput, InvalidModel
from container.limits import Limits
from container.models.batch_io import BatchIO
from container.models.triton_schema import model_config_pb2 as pb
from container.tensors import datatype_of, decoded_size, from_config


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # with a leading -1 when the model batches
    reshape: tuple[int, ...] | None = None  # the shape the model itself sees or makes (config `reshape`), batch excluded
    optional: bool = False  # an input a request may leave out (config `optional`)

    def summary(self) -> str:
        return f"{self.datatype}{list(self.shape)}{' (optional)' if self.optional else ''}"


@dataclass(frozen=True)
class ControlSpec:
    """A tensor the sequence batcher makes for each request (CONTROL_SEQUENCE_START, …)."""

    tensor: TensorSpec
    kind: str  # START, END, READY or CORRID
    false_true: tuple = (0, 1)  # the values for false and true (CORRID carries the id itself)


@dataclass(frozen=True)
class StateSpec:
    """Implicit state: fed back from `output` to `input` across a sequence; never shown to clients."""

    input: TensorSpec
    output: TensorSpec
    initial: np.ndarray | None = field(default=None, compare=False)  # a new sequence's value; None: zeros


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 0
    controls: tuple[ControlSpec, ...] = ()  # sequence models: after the inputs, in control_input order
    states: tuple[StateSpec, ...] = ()  # sequence models: after the controls (inputs) and the outputs
    batching: BatchIO | None = None  # ragged inputs, batch inputs and batch outputs (batch_io.py)

    @functools.cached_property
    def output_types(self) -> dict[str, str]:
        """Each output's datatype by its name, which every answer's encoding looks up."""
        return {spec.name: spec.datatype for spec in self.outputs}

    @classmethod
    def from_config(cls, config, initial_states: dict[str, np.ndarray] | None = None) -> "Signature":
        """`initial_states`: state input name → the value its initial_state's data_file holds."""
        lead = (-1,) if config.max_batch_size > 0 else ()

        def spec(name, data_type, dims, reshape=None, optional=False):
            return TensorSpec(name, from_config(pb.DataType.Name(data_type)), lead + tuple(dims), reshape, optional)

        def tensor(t, optional=False):
            return spec(t.name, t.data_type, t.dims, _reshape(t) if t.HasField("reshape") else None, optional)

        controls, states = [], []
        if config.HasField("sequence_batching"):
            for control_input in config.sequence_batching.control_input:
                for control in control_input.control:
                    controls.append(_control(control_input.name, control, lambda t, n=control_input.name: spec(n, t, [1])))
            for state in config.sequence_batching.state:
                states.append(StateSpec(spec(state.input_name, state.data_type, state.dims),
                                        spec(state.output_name, state.data_type, state.dims),
                                        (initial_states or {}).get(state.input_name)))
        return cls(
            tuple(tensor(t, t.optional) for t in config.input), tuple(tensor(t) for t in config.output),
            config.max_batch_size, tuple(controls), tuple(states), BatchIO.from_config(config),
        )

    def made_inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs the server makes for each batch (`batch_input`), as the model receives them."""
        if self.batching is None:
            return ()
        return tuple(TensorSpec(target, b.datatype, b.shape()) for b in self.batching.inputs for target in b.targets)

    def model_shape(self, spec: TensorSpec) -> tuple[int, ...]:
        """`spec`'s shape as the model receives it: one flat dimension for a ragged input, else its shape
        (a config `reshape`, with the batch dimension, where it has one)."""
        if self.batching is not None and spec.name in self.batching.ragged:
            return (-1,)
        return spec.shape if spec.reshape is None else ((-1,) if self.max_batch_size else ()) + spec.reshape

    def sole_input(self) -> TensorSpec | None:
        """The input a request that names none is for: the model's one input, or its one required input."""
        required = [s for s in self.inputs if not s.optional] if len(self.inputs) > 1 else self.inputs
        return required[0] if len(required) == 1 else None

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise InvalidInput(f"unknown input '{name}'; the model takes {self._names(self.inputs)}")

    def check(self, inputs: dict[str, np.ndarray], outputs: list[str] | None, limits: Limits) -> None:
        """What a request passes before the model runs it: its tensors within the decoded-size limit, its
        inputs and the outputs it asks for (None: all) the model's."""
        limits.check_decoded(decoded_size(inputs.values()))
        self.check_inputs(inputs)
        if outputs:
            self.check_outputs(outputs)

    def check_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        """Names, datatypes, shapes and batch size, with a message that says what to send instead."""
        if len(inputs) != len(self.inputs) or not all(s.name in inputs for s in self.inputs):
            missing = [s.name for s in self.inputs if s.name not in inputs and not s.optional]
            if missing:
                raise InvalidInput(f"missing input(s) {missing}; the model takes {self._names(self.inputs)}")
            if not inputs:  # every input optional, and none given
                raise InvalidInput(f"the request has no inputs; the model takes {self._names(self.inputs)}")
            extra = sorted(set(inputs) - {s.name for s in self.inputs})
            if extra:
                raise InvalidInput(f"unexpected input(s) {extra}; the model takes {self._names(self.inputs)}")
        batch = None
        for spec in self.inputs:
            array = inputs.get(spec.name)
            if array is None:  # an optional input the request leaves out
                continue
            if datatype_of(array) != _wire_type(spec.datatype):
                raise InvalidInput(f"input '{spec.name}' must be {spec.datatype}, got {datatype_of(array)}")
            if not _shape_matches(array.shape, spec.shape):
                raise InvalidInput(f"input '{spec.name}' must have shape {list(spec.shape)}, got {list(array.shape)}")
            if self.max_batch_size:
                if batch is not None and array.shape[0] != batch:
                    raise InvalidInput(f"inputs disagree on the batch size: {batch} and {array.shape[0]} ('{spec.name}')")
                batch = array.shape[0]
        if batch is not None and not 1 <= batch <= self.max_batch_size:
            raise InvalidInput(f"batch size {batch} is outside 1..{self.max_batch_size} (max_batch_size)")

    def check_outputs(self, names) -> None:
        known = {s.name for s in self.outputs}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InvalidInput(f"unknown output(s) {unknown}; the model produces {self._names(self.outputs)}")

    @staticmethod
    def _names(specs) -> str:
        return ", ".join(f"'{s.name}' {s.summary()}" for s in specs) or "none"


def _control(name: str, control, spec) -> ControlSpec:
    kind = pb.ModelSequenceBatching.Control.Kind.Name(control.kind).removeprefix("CONTROL_SEQUENCE_")
    if kind == "CORRID":
        if control.data_type not in (pb.TYPE_UINT64, pb.TYPE_INT64, pb.TYPE_UINT32, pb.TYPE_INT32, pb.TYPE_STRING):
            raise InvalidModel(f"control input '{name}' (CORRID) must be TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
                               f"TYPE_INT32 or TYPE_STRING, as in Triton")
        return ControlSpec(spec(control.data_type), kind, ())
    for values_field, data_type in (("int32_false_true", pb.TYPE_INT32), ("fp32_false_true", pb.TYPE_FP32),
                                    ("bool_false_true", pb.TYPE_BOOL)):
        values = tuple(getattr(control, values_field))
        if values:
            if len(values) != 2:
                raise InvalidModel(f"control input '{name}': {values_field} needs [false, true]")
            return ControlSpec(spec(data_type), kind, values)
    raise InvalidModel(f"control input '{name}' ({kind}) gives no int32_false_true, fp32_false_true or bool_false_true")


def _reshape(tensor) -> tuple[int, ...]:
    """The model-side shape of a tensor with `reshape`; it must hold as many elements as `dims`."""
    shape, dims = tuple(tensor.reshape.shape), tuple(tensor.dims)
    if -1 not in shape + dims and math.prod(shape) != math.prod(dims):
        raise InvalidModel(f"'{tensor.name}': reshape {list(shape)} does not hold the {math.prod(dims)} elements of dims {list(dims)}")
    if shape.count(-1) > 1:
        raise InvalidModel(f"'{tensor.name}': reshape {list(shape)} may leave at most one dimension variable")
    return shape


def _shape_matches(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    if len(shape) != len(expected):
        return False
    for size, wanted in zip(shape, expected, strict=True):  # a loop, not all(): on every request's path
        if wanted != -1 and wanted != size:
            return False
    return True


def _wire_type(datatype: str) -> str:
    return "FP32" if datatype == "BF16" else datatype
