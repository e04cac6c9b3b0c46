"""PyTorch 2's own model files, `<version>/model.pt2`: AOTInductor packages, as Triton's
`platform: "torch_aoti"` serves them, and ExportedProgram archives made by `torch.export.save`, as
`platform: "torch_export"` (Triton has no platform for them; the name is this server's).

Either is called as its forward was exported: positional and keyword arguments, nested in tuples,
lists and dicts, flattened by the program's own call spec. The config's tensors bind to the flattened
leaves by position (`INPUT__0`, `OUTPUT__1`: flattening order) or by where each sits in the call
(`ARGS[0]`, `ARGS[1][scale]`, `KWARGS[mask]`; `RESULT`, `RESULT[1]`, `RESULT[logits][0]`).

A package runs compiled kernels, with no Python in the model; an ExportedProgram runs its graph
module op by op, in this process. A package records neither its inputs' types nor their shapes (its
compiled code checks them), so at load it is run once on the config's tensors, zeros, and twice as
many rows when it is to batch: a config that does not bind is refused then, with the package's words.
"""

import io
import json
import platform
import shutil
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils import _pytree as pytree

from container.backends import footprint
from container.backends.pytorch import reshaped, tensor_index, to_numpy, to_torch
from container.backends.torch_runtime import device_error, device_scope, forward_failed, guarded, last_line
from container.errors import InvalidModel, InvalidRequest, ServeError
from container.models.pt2_archive import AOTI_PLATFORM, archive_kind, is_program, members, read_member, where
from container.models.signature import Signature, TensorSpec
from container.models.statistics import Phases
from container.models.triton_schema import model_config_pb2 as pb
from container.tensors import zeros

Range = tuple[str, int, int | None]  # a dynamic dimension's symbol, its least and its most size (None: unbounded)
EXPORT_HINT = ("export it with a dynamic first dimension: torch.export.export(model, args, dynamic_shapes="
               "{name: {0: torch.export.Dim('batch')}}), and compile that")
_EXTRACTING = threading.Lock()  # one package extracted at a time (_loaded_package), by native threads
EXPORT_RUNTIME = "torch.export"  # its name where it is prepared: this process (footprint), the fork server


@dataclass(frozen=True)
class Leaf:
    """One tensor of the call: where it sits, and its type and shape where the file records them
    (an ExportedProgram does; -1 for a dynamic dimension), with each dynamic dimension's symbol and
    the sizes it may take, as the program was exported (None where it says none)."""

    path: str
    datatype: str | None = None
    shape: tuple[int, ...] | None = None
    ranges: tuple[Range | None, ...] = ()


class Pt2Model:
    """One version of a `.pt2` model: named numpy tensors in, named numpy tensors out, as
    TorchScriptModel takes and gives them."""

    def __init__(self, name: str, path: Path, platform: str, signature: Signature, device: str):
        self.name, self.device, self.signature = name, device, signature
        self._grown: dict[str, int] = {}
        self._peak: dict[str, int] = {}
        self._learning = footprint.LEARNING_RUNS
        self._doing = f"running model '{name}'"
        with footprint.load_growth(device, self._grown):
            self.program = load_program(path, platform, device)
        # a sequence model's control and state tensors are the program's too, named as its inputs and outputs are
        inputs = (*signature.inputs, *signature.made_inputs(), *(c.tensor for c in signature.controls),
                  *(s.input for s in signature.states))
        self._inputs = _bind(inputs, self.program.inputs, "INPUT", "input")
        self._outputs = _bind((*signature.outputs, *(s.output for s in signature.states)), self.program.outputs,
                              "OUTPUT", "output")
        self._output_names = [s.name for s in signature.outputs]
        # a ragged input, one the server makes, or a scattered output: its first dimension is no count of rows
        batching = signature.batching
        unrowed = {s.name for s in signature.made_inputs()} | set(batching.ragged) if batching else set()
        scattered = {b.target for b in batching.outputs} if batching else set()
        if signature.max_batch_size and any(leaf.shape and leaf.shape[0] != -1 for spec, leaf in
                                            zip(self._inputs, self.program.inputs, strict=True) if spec.name not in unrowed):
            raise self._unbatched()
        for specs, leaves, kind in ((self._inputs, self.program.inputs, "input"), (self._outputs, self.program.outputs, "output")):
            for spec, leaf in zip(specs, leaves, strict=True):
                if spec is not None and leaf.shape is not None and spec.name not in scattered:
                    rows = signature.max_batch_size if spec.name not in unrowed else 0
                    _check_config_shape(spec, signature.model_shape(spec), leaf, kind, rows)
        if any(leaf.datatype is None for leaf in self.program.inputs):  # a package: what it takes is unrecorded
            self._probe()

    def memory(self) -> dict[str, int]:
        return footprint.charged(self.program.constant_bytes, self._grown, self._peak)

    def measured(self) -> dict[str, dict[str, int]]:
        return {"weights": self.program.constant_bytes, "load": self._grown, "activation_peak": self._peak}

    def close(self) -> None:
        self.program = None

    def execute(self, inputs: dict[str, np.ndarray], outputs, phases: Phases) -> dict[str, np.ndarray]:
        if self._learning > 0:
            with footprint.execution_peak(self.device, self._peak):
                self._learning -= 1
                return self._guarded(inputs, outputs, phases)
        return self._guarded(inputs, outputs, phases)

    def _guarded(self, inputs, outputs, phases: Phases) -> dict[str, np.ndarray]:
        with device_scope(self.device):
            return guarded(self.device, self._doing, self._execute, inputs, outputs, phases)

    def _execute(self, inputs: dict[str, np.ndarray], outputs, phases: Phases) -> dict[str, np.ndarray]:
        start = time.perf_counter_ns()
        batched = self.signature.max_batch_size > 0
        arrays = [inputs[spec.name] if spec.reshape is None else reshaped(spec, inputs[spec.name], batched, True, self.name)
                  for spec in self._inputs]
        _check_request_shapes((spec.name, leaf, array.shape) for spec, leaf, array in zip(self._inputs, self.program.inputs,
                                                                                            arrays, strict=True))
        leaves = [to_torch(spec, array, self.device) for spec, array in zip(self._inputs, arrays, strict=True)]
        converted = time.perf_counter_ns()
        try:
            results = self.program.run(leaves)
        except Exception as exc:
            if device_error(exc, self.device, "") is not None:
                raise
            raise forward_failed(self.name, exc) from None
        inferred = time.perf_counter_ns()
        wanted = outputs or self._output_names
        produced = {spec.name: self._from_model(spec, results[i], batched) for i, spec in enumerate(self._outputs)
                    if spec is not None and spec.name in wanted}
        phases.input_ns, phases.infer_ns = converted - start, inferred - converted
        phases.output_ns = time.perf_counter_ns() - inferred
        return produced

    def _from_model(self, spec: TensorSpec, value, batched: bool) -> np.ndarray:
        array = to_numpy(spec, value, self.name, None)
        return array if spec.reshape is None else reshaped(spec, array, batched, False, self.name)

    def _probe(self) -> None:
        """Run once on zeros of the config's tensors (and on two rows where it batches): a package's
        compiled checks are the only record of its inputs' types and shapes, and what it returns the
        only record of its outputs' shapes."""
        signature = self.signature
        rows = [1, 2] if signature.max_batch_size >= 2 else [1] if signature.max_batch_size else [None]
        for count in rows:
            sample = {s.name: zeros(s.datatype, _sample_shape(s.shape, count))
                      for s in (*signature.inputs, *(c.tensor for c in signature.controls), *(s.input for s in signature.states))}
            if signature.batching is not None:
                sample = signature.batching.merge([sample])
            try:
                produced = self._guarded(sample, None, Phases())
            except ServeError as exc:
                expected = ", ".join(f"{_position('INPUT', i)} ({leaf.path})" for i, leaf in enumerate(self.program.inputs))
                if count == 2:
                    raise self._unbatched() from None
                raise InvalidModel(f"model '{self.name}' does not run on the config's tensors ({exc}); it takes "
                                   f"{expected}") from None
            scattered = {b.target for b in signature.batching.outputs} if signature.batching else set()
            shapes = {spec.name: spec.shape for spec in self._outputs if spec is not None}
            for name, array in produced.items():
                if name in scattered:  # its shape is the batch's, as the model lays its requests out
                    continue
                dims = shapes[name]
                if len(dims) != array.ndim or any(d not in (-1, size) for d, size in zip(dims, array.shape, strict=True)):
                    raise InvalidModel(f"output '{name}' is {list(dims)} in the config; on the config's tensors, zeros, the "
                                       f"package returned {list(array.shape)} there")

    def _unbatched(self) -> InvalidModel:
        return InvalidModel(f"model '{self.name}' was exported for a fixed number of rows, so max_batch_size "
                            f"{self.signature.max_batch_size} cannot batch it: {EXPORT_HINT}")


class Program:
    """A loaded `.pt2`: the leaves of its call, `run(leaves) -> leaves`, and `call` as its forward."""

    def __init__(self, in_spec, out_spec, inputs: list[Leaf], outputs: list[Leaf], run, constant_bytes: dict[str, int]):
        self.inputs, self.outputs, self.run = inputs, outputs, run
        self._in_spec, self._out_spec = in_spec, out_spec
        self.constant_bytes = constant_bytes

    def call(self, args: tuple, kwargs: dict):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec:
            raise InvalidRequest(f"the model takes {pytree.tree_unflatten([leaf.path for leaf in self.inputs], self._in_spec)}; "
                                 f"it was called with {len(leaves)} tensor(s) in another structure")
        _check_request_shapes((recorded.path, recorded, tuple(value.shape)) for value, recorded in zip(leaves, self.inputs, strict=True)
                              if isinstance(value, torch.Tensor))
        return pytree.tree_unflatten(self.run(leaves), self._out_spec)


def prepare_runtime(paths) -> None:
    """The first ExportedProgram a process loads imports about 100 MiB of torch's modules (its serializer,
    sympy, networkx): done once beforehand, outside any model's measurement, so that no model is
    charged them (footprint.prepared)."""
    if needs_export_runtime(paths):
        footprint.prepared(EXPORT_RUNTIME, prepare_export)


def needs_export_runtime(paths) -> bool:
    """Whether one of `paths` is an ExportedProgram: a package's loader imports nothing."""
    for path in paths:
        try:
            if archive_kind(path) != AOTI_PLATFORM:
                return True
        except InvalidModel:  # its load refuses it, in its own words
            continue
    return False


def prepare_export() -> None:
    """Export, save and load back a tiny program, with a dynamic batch dimension as served programs
    have (their symbolic shapes import more): every module a load needs, imported."""
    buffer = io.BytesIO()
    rows = {"input": {0: torch.export.Dim("batch")}}
    torch.export.save(torch.export.export(torch.nn.Linear(2, 2), (torch.ones(2, 2),), dynamic_shapes=rows), buffer)
    buffer.seek(0)
    with torch.inference_mode():
        torch.export.load(buffer).module()(torch.ones(1, 2))


def load_program(path: Path, platform: str, device: str) -> Program:
    kind = archive_kind(path)
    if platform and kind != platform:
        other = "an AOTInductor package" if kind == AOTI_PLATFORM else "an ExportedProgram without AOTInductor data"
        raise InvalidModel(f"{where(path)} is {other}: serve it with platform '{kind}', not '{platform}'")
    try:
        with device_scope(device):
            return guarded(device, f"loading {path.name}", _load_aoti if kind == AOTI_PLATFORM else _load_export, path, device)
    except ServeError:
        raise
    except Exception as exc:
        raise InvalidModel(f"{where(path)} cannot be loaded: {last_line(exc)}") from None


def _load_aoti(path: Path, device: str) -> Program:
    metadata = _aoti_metadata(path)
    built_for = metadata.get("AOTI_DEVICE_KEY", "cpu")
    if built_for != device.split(":")[0]:
        raise InvalidModel(f"{where(path)} was compiled for {built_for}; its instance group places it on {device}: "
                           f"compile it for {device.split(':')[0]}, or place it there")
    _check_cpu(path, metadata)
    index = torch.device(device).index if device.startswith("cuda") else -1
    # The loader itself, not aoti_load_package: that compares the package's CPU ISA with this machine's,
    # for a warning, and finds this machine's by compiling probes with a C++ compiler, which the image
    # has none of.
    listed = members(path)
    loader = _loaded_package(path, listed, device, -1 if index is None else index)
    in_spec, out_spec = (pytree.treespec_loads(spec) for spec in loader.get_call_spec())
    return Program(in_spec, out_spec, _leaves(in_spec, "ARGS", "KWARGS"), _leaves(out_spec, "RESULT"), loader.run,
                   {device: _compiled_bytes(listed)})


def _loaded_package(path: Path, listed: list[zipfile.ZipInfo], device: str, index: int):
    """torch's loader of the package at `path`, and nothing of it left on disk. The loader extracts the
    package into a directory of its own under the temporary directory (`aotinductor_…`), which it
    removes only when it is freed: a loaded package took its size twice on disk, and a process that
    died with packages loaded (a crash, SIGKILL) left theirs behind for good. Once loaded nothing reads
    those files (the library is mapped, the constants mapped or copied), so the directory goes at once;
    one package is extracted at a time, so that its directory is the one that appeared, and holds this
    package's library. A CUDA package reads its kernels' files at its first runs: they stay while it is
    loaded (its loader removes them when freed)."""
    def load():
        return torch._C._aoti.AOTIModelPackageLoader(str(path), _package_model(listed), False, 1, index)

    # extracted under its archive's own name, which is the name the package was written under (`model.pt2`
    # holds `model/…`), whatever the file is called now
    library = next((m.filename for m in listed if m.filename.endswith(".so")), None)
    if device != "cpu" or library is None:
        return load()
    with _EXTRACTING:
        before = set(_extractions())
        loader = load()
        for directory in set(_extractions()) - before:
            if (directory / library).is_file():
                shutil.rmtree(directory, ignore_errors=True)
    return loader


def _extractions() -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob("aotinductor_*"))


def _load_export(path: Path, device: str) -> Program:
    recorded = _export_torch_version(path)
    if recorded and recorded.split("+")[0] != torch.__version__.split("+")[0]:
        raise InvalidModel(f"{where(path)} was exported by torch {recorded}; this server runs torch "
                           f"{torch.__version__}: export it again with this version")
    program = torch.export.load(str(path))
    if device != "cpu":
        program = torch.export.passes.move_to_device_pass(program, device)
    module = program.module()
    in_spec, out_spec = program.call_spec.in_spec, program.call_spec.out_spec
    typed = _typed(program)
    inputs = [Leaf(leaf.path, *typed.get(name, ()))
              for leaf, name in zip(_leaves(in_spec, "ARGS", "KWARGS"), program.graph_signature.user_inputs, strict=True)]
    outputs = [Leaf(leaf.path, *typed.get(name, ()))
               for leaf, name in zip(_leaves(out_spec, "RESULT"), program.graph_signature.user_outputs, strict=True)]
    weights = sum(t.numel() * t.element_size() for t in (*program.state_dict.values(), *program.constants.values())
                  if isinstance(t, torch.Tensor))

    def run(leaves: list) -> list:
        args, kwargs = pytree.tree_unflatten(leaves, in_spec)
        with torch.inference_mode():
            return pytree.tree_leaves(module(*args, **kwargs))

    return Program(in_spec, out_spec, inputs, outputs, run, {device: weights})


def callable_program(path: Path, device: str):
    """A `.pt2` as the function its forward was, for SageMaker's default `model_fn`: tensors, lists,
    tuples and dicts in and out, as the program was exported."""
    program = load_program(path, "", device)
    return lambda *args, **kwargs: program.call(args, kwargs)


def completed(config, path: Path) -> object:
    """The config with what it leaves out taken from the ExportedProgram at `path`: inputs and outputs
    named by position (`INPUT__n`, `OUTPUT__n`), typed and shaped as the program records them (its
    batch dimension left out where the config batches). A package records no types: its config must
    declare its tensors."""
    if config.input and config.output:
        return config
    kind = archive_kind(path)
    if kind == AOTI_PLATFORM:
        raise InvalidModel(f"{where(path)} is an AOTInductor package, which records no tensor types: declare its "
                           f"input and output in config.pbtxt (INPUT__n and OUTPUT__n, or ARGS[…] and RESULT[…])")
    program = load_program(path, kind, "cpu")
    completed = type(config)()
    completed.CopyFrom(config)
    if not completed.platform:
        completed.platform = kind
    for field, leaves, stem in ((completed.input, program.inputs, "INPUT"), (completed.output, program.outputs, "OUTPUT")):
        if len(field):
            continue
        for i, leaf in enumerate(leaves):
            if leaf.datatype is None or leaf.shape is None:
                raise InvalidModel(f"{where(path)} does not record the type of {leaf.path}: declare it in the config")
            dims = list(leaf.shape[1:] if config.max_batch_size else leaf.shape) or [1]
            field.add(name=_position(stem, i), data_type=pb.DataType.Value(f"TYPE_{leaf.datatype}"), dims=dims)
    return completed


def _bind(specs: tuple[TensorSpec, ...], leaves: list[Leaf], stem: str, kind: str) -> list:
    """The config's `specs` in the order of the call's `leaves`: by position (every name `STEM__n`),
    else by path (every name a leaf's path). Inputs must cover every leaf; outputs may leave some out
    (None in their place). A recorded type that differs is refused here."""
    expected = ", ".join(f"{_position(stem, i)} ({leaf.path}{_described(leaf)})" for i, leaf in enumerate(leaves))
    paths = [leaf.path for leaf in leaves]
    if all(tensor_index(s.name) is not None and s.name.startswith(f"{stem}__") for s in specs):
        places = {s.name: tensor_index(s.name) for s in specs}
    elif all(s.name in paths for s in specs):
        places = {s.name: paths.index(s.name) for s in specs}
    else:
        raise InvalidModel(f"the config's {kind}s {[s.name for s in specs]} do not name the program's: {expected}")
    bound: list = [None] * len(leaves)
    for spec in specs:
        place = places[spec.name]
        if place >= len(leaves) or bound[place] is not None:
            raise InvalidModel(f"{kind} '{spec.name}' names no {kind} of the program, or one another {kind} names: "
                               f"it has {expected}")
        leaf = leaves[place]
        if leaf.datatype is not None and leaf.datatype != spec.datatype:
            raise InvalidModel(f"{kind} '{spec.name}' is {spec.datatype} in the config; the program's {leaf.path} is "
                               f"{leaf.datatype}. The program's {kind}s: {expected}")
        bound[place] = spec
    if kind == "input" and None in bound:
        missing = [_position(stem, i) for i, spec in enumerate(bound) if spec is None]
        raise InvalidModel(f"the config leaves out input(s) {missing} of the program's {expected}")
    return bound


def _check_config_shape(spec: TensorSpec, seen: tuple[int, ...], leaf: Leaf, kind: str, max_batch_size: int) -> None:
    """The config's shape for `spec`, `seen` as the model sees it (its batch dimension and `reshape`), is
    one the program takes: the same rank, its fixed sizes, sizes within its dynamic ones' ranges, and
    where the model batches (`max_batch_size`; 0 for a tensor whose first dimension counts no rows), a
    first dimension of 1 to max_batch_size rows."""
    fits = len(seen) == len(leaf.shape) and all(
        size == -1 or _takes(fixed, ranged, size) for size, fixed, ranged in zip(seen, leaf.shape, leaf.ranges, strict=True))
    rows = leaf.ranges[0] if max_batch_size and kind == "input" and leaf.ranges else None
    if fits and rows is not None and not _takes(-1, rows, 1):
        raise InvalidModel(f"{kind} '{spec.name}' ({leaf.path}) was exported for at least {rows[1]} rows, so a request "
                           f"of one row could not run: export it with Dim('batch', min=1)")
    if fits and rows is not None and not _takes(-1, rows, max_batch_size):
        raise InvalidModel(f"{kind} '{spec.name}' ({leaf.path}) was exported for at most {rows[2]} rows: set "
                           f"max_batch_size to {rows[2]} or less, or export it with a larger Dim('batch', max=…)")
    if not fits:
        raise InvalidModel(f"{kind} '{spec.name}' is {list(seen)} in the config (as the model sees it, its batch "
                           f"dimension first where it batches); the program's {leaf.path} is {_shape_text(leaf)}")


def _check_request_shapes(inputs) -> None:
    """Each input's sizes (name, leaf, shape as the model sees it) are ones the program takes, and sizes
    the program ties together (one symbol in several dimensions) agree: a request it would refuse with
    its guards is told what to send instead. A package records no shapes: its own checks are all there is."""
    tied: dict[str, tuple[str, int, int]] = {}
    for name, leaf, shape in inputs:
        if leaf.shape is None:
            continue
        if len(shape) != len(leaf.shape):
            raise InvalidRequest(f"input '{name}' has {len(shape)} dimensions; the model takes {_shape_text(leaf)}")
        for dimension, (size, fixed, ranged) in enumerate(zip(shape, leaf.shape, leaf.ranges, strict=True)):
            if not _takes(fixed, ranged, size):
                raise InvalidRequest(f"input '{name}' has {size} in dimension {dimension}; the model takes "
                                     f"{_size_text(fixed, ranged)} there ({_shape_text(leaf)})")
            if ranged is None:
                continue
            first = tied.setdefault(ranged[0], (name, dimension, size))
            if first[2] != size:
                raise InvalidRequest(f"input '{name}' has {size} in dimension {dimension} and input '{first[0]}' has "
                                     f"{first[2]} in dimension {first[1]}; the model takes the same size in both")


def _takes(fixed: int, ranged: Range | None, size: int) -> bool:
    if fixed != -1:
        return size == fixed
    return ranged is None or (ranged[1] <= size and (ranged[2] is None or size <= ranged[2]))


def _size_text(fixed: int, ranged: Range | None) -> str:
    if fixed != -1 or ranged is None:
        return str(fixed) if fixed != -1 else "any size"
    return f"{ranged[1]} to {ranged[2]}" if ranged[2] is not None else f"at least {ranged[1]}"


def _shape_text(leaf: Leaf) -> str:
    return "[" + ", ".join(_size_text(fixed, ranged) for fixed, ranged in zip(leaf.shape, leaf.ranges, strict=True)) + "]"


def _typed(program) -> dict[str, tuple]:
    """Each user input's and output's (datatype, shape, ranges) as the exported graph records them."""
    bounds = {str(symbol): (int(r.lower), int(r.upper) if r.upper.is_Integer else None)  # not torch's int_oo
              for symbol, r in program.range_constraints.items()}
    found = {}
    for node in program.graph.nodes:
        values = [node] if node.op == "placeholder" else list(node.args[0]) if node.op == "output" else []
        for value in values:
            fake = getattr(value, "meta", {}).get("val")
            if isinstance(fake, torch.Tensor):
                ranges = tuple(None if isinstance(d, int) or str(d.node.expr) not in bounds
                               else (str(d.node.expr), *bounds[str(d.node.expr)]) for d in fake.shape)
                found[value.name] = (_datatype(fake.dtype), tuple(d if isinstance(d, int) else -1 for d in fake.shape), ranges)
    return found


def _leaves(spec, *roots: str) -> list[Leaf]:
    """The paths of a call spec's leaves, in flattening order. An input spec is (args, kwargs): its
    roots are ARGS and KWARGS; an output spec has one root, RESULT."""
    numbered = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    paths = []
    for keys, _ in pytree.tree_flatten_with_path(numbered)[0]:
        keys = list(keys)
        root = roots[keys.pop(0).idx] if len(roots) > 1 else roots[0]
        paths.append(Leaf(root + "".join(f"[{_key(k)}]" for k in keys)))
    return paths


def _key(key) -> str:
    for attribute in ("idx", "key", "name"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def _position(stem: str, index: int) -> str:
    return f"{stem}__{index}"


def _described(leaf: Leaf) -> str:
    if leaf.datatype is None:
        return ""
    return f": {leaf.datatype} {list(leaf.shape)}"


def _sample_shape(shape: tuple[int, ...], rows: int | None) -> tuple[int, ...]:
    dims = tuple(1 if d < 0 else d for d in shape)
    return dims if rows is None else (rows, *dims[1:])


_TORCH_TYPES = {torch.bool: "BOOL", torch.uint8: "UINT8", torch.int8: "INT8", torch.int16: "INT16",
                torch.int32: "INT32", torch.int64: "INT64", torch.float16: "FP16", torch.float32: "FP32",
                torch.float64: "FP64", torch.bfloat16: "BF16"}


def _datatype(dtype: torch.dtype) -> str | None:
    return _TORCH_TYPES.get(dtype)


def _package_model(listed: list[zipfile.ZipInfo]) -> str:
    """The name the package keeps its model under (`<archive>/data/aotinductor/<name>/`)."""
    for member in listed:
        parts = member.filename.split("/")
        if len(parts) > 4 and parts[1:3] == ["data", "aotinductor"]:
            return parts[3]
    return "model"


def _compiled_bytes(listed: list[zipfile.ZipInfo]) -> int:
    """What a package's compiled model holds: its shared libraries, its constants inside them (as
    packages are compiled by default) or beside them."""
    return sum(member.file_size for member in listed if member.filename.endswith(".so")
               or "/data/constants/" in member.filename or "/data/weights/" in member.filename)


def _aoti_metadata(path: Path) -> dict[str, str]:
    """What the package records of its build: the device it was compiled for, among others."""
    found = read_member(path, lambda name: name.endswith("_metadata.json") and "/data/aotinductor/" in f"/{name}")
    try:
        return json.loads(found) if found else {}
    except ValueError:
        return {}


def _check_cpu(path: Path, metadata: dict[str, str]) -> None:
    """Refuse a package whose kernels this CPU cannot run: one compiled on another architecture, or with
    vector instructions this CPU lacks. Run, they would end this process with SIGILL, every model with it."""
    machine = metadata.get("AOTI_MACHINE")
    if machine and machine != platform.machine():
        raise InvalidModel(f"{where(path)} was compiled on {machine}; this server runs on {platform.machine()}: "
                           f"compile it on (or for) a machine like this one")
    if platform.machine() != "x86_64":
        return
    has = _x86_extensions()
    missing = sorted(set(metadata.get("AOTI_CPU_ISA", "").lower().split()) - {"invalid_vec_isa"} - has)
    if missing:
        raise InvalidModel(f"{where(path)} was compiled for a CPU with {', '.join(missing)}, which this server's CPU "
                           f"lacks (it has {', '.join(sorted(has)) or 'none of them'}): compile it on (or for) a "
                           f"machine like this one")


def _x86_extensions() -> set[str]:
    """The vector extensions Inductor compiles for that this CPU has, named as a package records them
    (asked of torch's own CPU probes, not by compiling, as Inductor does: the image has no compiler)."""
    avx512 = torch.cpu._is_avx512_supported()
    found = {"avx2": torch.cpu._is_avx2_supported(), "avx512": avx512,
             "avx512_vnni": avx512 and torch.cpu._is_vnni_supported(), "amx_tile": torch.cpu._is_amx_tile_supported()}
    return {name for name, present in found.items() if present}


def _export_torch_version(path: Path) -> str | None:
    found = read_member(path, is_program)
    try:
        return json.loads(found).get("torch_version") if found else None
    except ValueError:
        return None
