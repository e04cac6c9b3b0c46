"""Triton's `model_warmup`: before a TorchScript model serves, each sample its config lists runs `count`
times (at least once) on every copy of each version, so the first clients do not pay for torch's lazy
initialisation, and a sample the model cannot run fails the load, saying which. A sample's inputs are
zeros (`zero_data`), seeded random values (`random_data`; zeros for strings, as Triton makes them), or
a raw row-major file in the model's `warmup/` directory (`input_data_file`), each `batch_size` times
over for a batching model."""

from dataclasses import dataclass

import numpy as np

from container.errors import DeviceFault, InvalidModel, InvalidRequest, ModelError
from container.models.signature import Signature
from container.models.source import read_tensor, warmup_file
from container.models.statistics import Phases
from container.models.triton_schema import model_config_pb2 as pb
from container.tensors import from_config, numpy_dtype, zeros


@dataclass(frozen=True)
class Sample:
    name: str
    inputs: dict[str, np.ndarray]  # batch dimension included when the model batches
    count: int


def warmup_samples(directory, config) -> list[Sample]:
    """The config's warmup samples, their data made or read."""
    made = []
    for warmup in config.model_warmup:
        what = f"model_warmup '{warmup.name}'"
        batch = warmup.batch_size or 1
        if config.max_batch_size == 0 and batch != 1:
            raise InvalidModel(f"{what}: batch_size must be 1 for a model that does not batch")
        if config.max_batch_size and batch > config.max_batch_size:
            raise InvalidModel(f"{what}: batch_size {batch} is past max_batch_size {config.max_batch_size}")
        inputs = {}
        for name, sample in warmup.inputs.items():
            item = _item(directory, f"{what} input '{name}'", sample)
            inputs[name] = np.repeat(item[np.newaxis], batch, axis=0) if config.max_batch_size else item
        made.append(Sample(warmup.name, inputs, max(warmup.count, 1)))
    return made


def _item(directory, what: str, sample) -> np.ndarray:
    if sample.data_type == pb.TYPE_INVALID:
        raise InvalidModel(f"{what} has no data_type")
    if any(d < 0 for d in sample.dims):
        raise InvalidModel(f"{what}: dims must be fixed, got {list(sample.dims)}")
    datatype, shape = from_config(pb.DataType.Name(sample.data_type)), tuple(sample.dims)
    choice = sample.WhichOneof("input_data_type")
    if choice == "input_data_file":
        path = warmup_file(directory, what, sample.input_data_file)
        if not path.is_file():
            raise InvalidModel(f"{what}: input_data_file {sample.input_data_file!r} is not a file in the model's warmup/")
        return read_tensor(what, path.read_bytes(), datatype, shape)
    if choice == "random_data" and datatype not in ("BYTES", "BF16"):
        random = np.random.default_rng(0)
        if datatype == "BOOL":
            return random.integers(0, 2, shape).astype(bool)
        dtype = numpy_dtype(datatype)
        return random.random(shape).astype(dtype) if dtype.kind == "f" else random.integers(0, 100, shape).astype(dtype)
    return zeros(datatype, shape)


def warm(backend, samples: list[Sample], signature: Signature) -> None:
    """Each sample on each copy of a loaded version; a sample that fails, fails the load."""
    for sample in samples:
        try:
            signature.check_inputs(sample.inputs)
            inputs = sample.inputs if signature.batching is None else signature.batching.merge([sample.inputs])
            for copy in getattr(backend, "copies", [backend]):
                for _ in range(sample.count):
                    copy.execute(inputs, None, Phases())
        except DeviceFault:
            raise  # a broken device context: the worker must be replaced, whatever ran
        except (InvalidRequest, ModelError) as exc:  # out of memory keeps its 507
            raise InvalidModel(f"model_warmup '{sample.name}' failed: {exc}") from None
