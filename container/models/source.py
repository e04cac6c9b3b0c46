"""Where a model's files are: a url checked against the model root, an archive extracted safely, the
layout recognised, and the size estimated from the files before anything is loaded."""

import math
import os
import posixpath
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from container.errors import InvalidInput, InvalidModel, InvalidRequest, SourceNotFound, no_room
from container.limits import Limits, whole_number
from container.models import checksums
from container.models.config import (
    DEFAULT_FILENAMES,
    ENSEMBLE_PLATFORM,
    PT2,
    check_config,
    completes_at_load,
    has_python_versions,
    has_versions,
    instance_count,
    kind_of,
    read_config,
    read_text,
    relative_path,
    selected_versions,
)
from container.models.pt2_archive import check_members
from container.models.signature import Signature
from container.models.triton_schema import model_config_pb2 as pb
from container.tensors import from_config, little_endian, numpy_dtype, unpack_strings, zeros

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
# SageMaker's PyTorch toolkit loads the one .pt/.pth file at the top; a .pt2 there is PyTorch 2's (pt2.py)
SAGEMAKER_WEIGHTS = (".pt", ".pth", ".pt2")


@dataclass
class TritonLayout:
    config: object  # model_config_pb2.ModelConfig
    labels: dict[str, int]  # version label → version
    versions: dict[int, Path]  # version → model file (an ensemble's: its version directory)
    output_labels: dict[str, list[str]]  # output → class labels from its label_filename
    signature: Signature | None  # the tensors, with implicit state's initial values from their data files;
    # None until the model has completed its config at load (complete(): python models, some .pt2)

    @property
    def kind(self) -> str:
        return kind_of(self.config)

    def complete(self, config) -> None:
        """The config as the model completed it at load (a python model's `auto_complete_config`, a
        `.pt2`'s recorded tensors), checked as any config is."""
        check_config(config)
        self.config, self.signature = config, Signature.from_config(config)


@dataclass
class SageMakerLayout:
    weights: list[Path]  # the *.pt / *.pth files at the top; the handler code decides what to load


@dataclass
class ModelSource:
    directory: Path
    layout: TritonLayout | SageMakerLayout
    scratch: Path | None = None  # an extraction directory of ours, removed on unload

    def estimated_bytes(self) -> int:
        if isinstance(self.layout, TritonLayout):
            files = list(self.layout.versions.values())
        else:
            files = self.layout.weights
        return sum(f.stat().st_size for f in files)

    def remove_scratch(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def resolve_url(root: str, url: str) -> Path:
    """The url as a path inside the model root, or a 400/404 that says why. The url is judged by its
    text before the file system is asked anything, so no answer tells what exists outside the root;
    then symlinks are followed and judged again."""
    if not isinstance(url, str) or not url.strip() or "\0" in url:
        raise InvalidRequest("'url' must be a non-empty string naming a directory or archive under the model root")
    base = Path(root).resolve()
    outside = InvalidRequest(f"url {url[:200]!r} is not a path inside the model root {str(base)!r}")
    if not _within(base, Path(os.path.normpath(base / url))):  # an absolute url replaces the base
        raise outside
    try:
        path = (base / url).resolve()
        exists = path.exists()
    except OSError as exc:  # a name longer than the file system allows
        raise InvalidRequest(f"url {url[:200]!r} cannot name a file here: {exc.strerror}") from None
    if not _within(base, path):
        raise outside
    if not exists:
        raise SourceNotFound(f"url {url[:200]!r} does not exist under the model root")
    return path


def locate(root: str, name: str) -> str:
    """The url of the repository entry `name`: its directory, or its archive (`name.tar.gz`)."""
    base = Path(root)
    if not (base / name).exists():
        for suffix in ARCHIVE_SUFFIXES:
            try:
                if (base / (name + suffix)).is_file():
                    return name + suffix
            except OSError:  # a name of up to 255 bytes, its suffix making it longer than a file name may be
                continue
    return name


def _within(base: Path, path: Path) -> bool:
    return path == base or base in path.parents


def repository_entries(root: str) -> list[tuple[str, str]]:
    """(name, url) of every model directory or archive directly under the root."""
    entries = []
    for path in sorted(Path(root).iterdir()):
        if path.is_dir() or path.name.endswith(ARCHIVE_SUFFIXES):
            name = next((path.name.removesuffix(s) for s in ARCHIVE_SUFFIXES if path.name.endswith(s)), path.name)
            entries.append((name, path.name))
    return entries


def open_source(path: Path, limits: Limits, scratch_root: str | None = None) -> ModelSource:
    """Blocking: extract an archive (into a new directory under `scratch_root`, default the temporary
    directory) if need be and recognise the layout. Run it off the event loop."""
    scratch = None
    if path.is_dir():
        archives = [p for p in path.iterdir() if p.name.endswith(ARCHIVE_SUFFIXES)]
        if len(archives) == 1 and not _has_model_files(path):
            path = archives[0]  # SageMaker copies model.tar.gz into the model's directory
    if path.is_file():
        scratch = Path(tempfile.mkdtemp(prefix="model-", dir=scratch_root))
        try:
            directory = _extract(path, scratch, limits)
            return ModelSource(directory, read_layout(directory, limits), scratch)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    return ModelSource(path, read_layout(path, limits))


def read_layout(directory: Path, limits: Limits) -> TritonLayout | SageMakerLayout:
    """Triton's when there is a config.pbtxt, or a config.json and nothing of SageMaker's layout (weights
    at the top, code/): a SageMaker model may keep a config.json of its own beside its weights."""
    weights = _weights(directory)
    sagemaker = bool(weights) or (directory / "code").is_dir()
    triton_config = (directory / "config.pbtxt").is_file() or (directory / "config.json").is_file()
    if ((directory / "config.pbtxt").is_file() or (triton_config and not sagemaker) or has_python_versions(directory)
            or has_versions(directory, DEFAULT_FILENAMES[PT2])):
        return _triton_layout(directory, limits)
    if sagemaker:
        return SageMakerLayout(weights)
    raise InvalidModel(
        f"no model in {directory.name!r}: expected config.pbtxt/config.json with <version>/model.pt, <version>/model.pt2 "
        f"or <version>/model.py (Triton layout), or a .pt/.pth/.pt2 file with optional code/inference.py (SageMaker layout)"
    )


def _weights(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix in SAGEMAKER_WEIGHTS and p.is_file())


MOST_WARMUP_RUNS = 100  # model_warmup executions one load may run (counts summed)


def _triton_layout(directory: Path, limits: Limits) -> TritonLayout:
    config, labels = read_config(directory)
    limits.check_model(instance_count(config), config.dynamic_batching.priority_levels)
    _check_state_sizes(config, limits)
    _check_warmup_sizes(directory, config, limits)
    checksums.verify(directory, config)
    kind = kind_of(config)
    filename = config.default_model_filename or DEFAULT_FILENAMES[kind]
    if filename:
        inside(directory, filename, "default_model_filename")
    versions = {(whole_number(p.name), p / filename if filename else p) for p in directory.iterdir()}
    available = {version: path for version, path in versions
                 if version is not None and (path.is_dir() if kind == ENSEMBLE_PLATFORM else path.is_file())}
    versions = {v: available[v] for v in selected_versions(config, sorted(available), filename or "(a directory)")}
    unknown = {k: v for k, v in labels.items() if v not in versions}
    if unknown:
        raise InvalidModel(f"version_labels {unknown} name versions that are not served ({sorted(versions)})")
    if kind == PT2:
        for path in versions.values():
            check_members(path, limits)
    signature = None
    if not completes_at_load(config):
        signature = Signature.from_config(config, _initial_states(directory, config, limits))
    return TritonLayout(config, labels, versions, _output_labels(directory, config), signature)


def _check_warmup_sizes(directory: Path, config, limits: Limits) -> None:
    """A config may come from a client (a load's override): its warmup samples are sized before a tensor
    of them is allocated or a data file of theirs is read, so each may take no more than a request's
    decoded tensors may, and the load runs at most MOST_WARMUP_RUNS executions of them. A data file
    counts at its size on disk (a string's size is not in the config)."""
    runs = sum(max(warmup.count, 1) for warmup in config.model_warmup)
    if runs > MOST_WARMUP_RUNS:
        raise InvalidModel(f"model_warmup asks for {runs} executions; at most {MOST_WARMUP_RUNS}")
    for warmup in config.model_warmup:
        size = 0
        for name, sample in warmup.inputs.items():
            if sample.data_type == pb.TYPE_INVALID:
                continue  # no type: the sample is refused, saying so
            itemsize = numpy_dtype(from_config(pb.DataType.Name(sample.data_type))).itemsize
            each = math.prod(1 if d < 0 else d for d in sample.dims) * itemsize
            if sample.WhichOneof("input_data_type") == "input_data_file":
                path = warmup_file(directory, f"model_warmup '{warmup.name}' input '{name}'", sample.input_data_file)
                each = max(each, path.stat().st_size if path.is_file() else 0)  # a missing file is refused when read
            size += max(warmup.batch_size, 1) * each
        if size > limits.decoded_bytes:
            raise InvalidModel(f"model_warmup '{warmup.name}' takes {size} bytes; at most {limits.decoded_bytes} "
                               f"(SERVE_MAX_DECODED_SIZE)")


def _check_state_sizes(config, limits: Limits) -> None:
    """Each sequence's implicit state is allocated at every start: it may take no more than a request's
    decoded tensors may (a BYTES element counts as the object pointer it is at least)."""
    for state in config.sequence_batching.state:
        if state.data_type == pb.TYPE_INVALID:
            continue  # no type: the signature refuses it, saying so
        itemsize = numpy_dtype(from_config(pb.DataType.Name(state.data_type))).itemsize
        for shaped in (state, *state.initial_state):
            size = math.prod(1 if d < 0 else d for d in shaped.dims) * itemsize
            if size > limits.decoded_bytes:
                raise InvalidModel(f"state '{state.input_name}' takes {size} bytes for each sequence; at most "
                                   f"{limits.decoded_bytes} (SERVE_MAX_DECODED_SIZE)")


def _initial_states(directory: Path, config, limits: Limits) -> dict[str, np.ndarray]:
    """Each implicit state's initial value: its initial_state's zero_data or data_file (read from the
    model's `initial_state/` directory, raw and row-major as Triton reads it), batch dimension added."""
    states = {}
    lead = (1,) if config.max_batch_size > 0 else ()
    for state in config.sequence_batching.state:
        for initial in state.initial_state[:1]:
            what = f"state '{state.input_name}': initial_state"
            datatype = from_config(pb.DataType.Name(initial.data_type or state.data_type))
            if initial.data_type and initial.data_type != state.data_type:
                raise InvalidModel(f"{what} data_type must be the state's own")
            if any(d < 0 for d in initial.dims):
                raise InvalidModel(f"{what} dims must be fixed, got {list(initial.dims)}")
            shape = lead + tuple(initial.dims)
            if initial.HasField("data_file"):
                path = inside(directory / "initial_state", initial.data_file, f"{what} data_file")
                if not path.is_file():
                    raise InvalidModel(f"{what} data_file {initial.data_file!r} is not a file in the model's initial_state/")
                limits.check_decoded(path.stat().st_size)
                states[state.input_name] = read_tensor(what, path.read_bytes(), datatype, shape)
            else:
                states[state.input_name] = zeros(datatype, shape)
    return states


def read_tensor(what: str, data: bytes, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Raw row-major data, as Triton reads its data files (a BYTES element: 4-byte length, then the bytes)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        try:
            return unpack_strings(what, data, count).reshape(shape)
        except InvalidInput as exc:
            raise InvalidModel(str(exc)) from None
    if datatype == "BF16":
        raise InvalidModel(f"{what}: a BF16 state cannot start from a data file; use zero_data")
    dtype = little_endian(datatype)
    if len(data) != count * dtype.itemsize:
        raise InvalidModel(f"{what}: the data file holds {len(data)} bytes; {datatype}{list(shape)} takes "
                           f"{count * dtype.itemsize}")
    return np.frombuffer(data, dtype).reshape(shape).astype(numpy_dtype(datatype))


def _output_labels(directory: Path, config) -> dict[str, list[str]]:
    labels = {}
    for output in config.output:
        if output.label_filename:
            path = inside(directory, output.label_filename, f"output '{output.name}': label_filename")
            if not path.is_file():
                raise InvalidModel(f"output '{output.name}': label_filename {output.label_filename!r} is not a file in the model")
            labels[output.name] = read_text(path, f"output '{output.name}': label_filename").splitlines()
    return labels


def warmup_file(directory: Path, what: str, relative: str) -> Path:
    """A warmup sample's `input_data_file`, inside the model's `warmup/` directory."""
    return inside(directory / "warmup", relative, f"{what}: input_data_file")


def inside(directory: Path, relative: str, what: str) -> Path:
    """`directory/relative`, refusing paths that are absolute or climb out of the directory."""
    return directory / relative_path(relative, what)


def _check_link(archive: Path, member: tarfile.TarInfo, files: set[str]) -> None:
    """A symbolic link must point, as written, to a place inside the archive's tree; a hard link must
    name a regular file the archive has already extracted. Anything else is refused."""
    if not (member.issym() or member.islnk()):
        return
    target = member.linkname
    if member.issym():
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(posixpath.normpath(member.name)), target))
        escapes = not target or target.startswith("/") or resolved == ".." or resolved.startswith("../")
    else:
        escapes = posixpath.normpath(target) not in files
    if escapes or "\0" in target:
        kind = "symbolic" if member.issym() else "hard"
        raise InvalidModel(f"archive {archive.name!r} refused: {kind} link {member.name[:100]!r} → {target[:100]!r} "
                           f"leads outside the model's own files; links must stay inside the archive")


def _has_model_files(path: Path) -> bool:
    return any((path / n).exists() for n in ("config.pbtxt", "config.json", "code")) or bool(_weights(path))


def _extract(archive: Path, into: Path, limits: Limits) -> Path:
    """Extract member by member as the archive streams in, with tarfile's `data` filter (no absolute
    paths, no `..`, no devices) and the limits checked before each member is written: a small archive
    that expands without bound stops at the limit, not at a full disk. Links are judged by our own
    rule first (`_check_link`): the filter's link checks had escapes fixed only in CPython 3.11.13."""
    try:
        with tarfile.open(archive, mode="r|*") as tar:
            members = written = 0
            files: set[str] = set()  # regular files extracted so far: what a hard link may name
            for member in tar:
                _check_link(archive, member, files)
                members += 1
                written += member.size
                depth = len(Path(member.name).parts)
                if members > limits.archive_members:
                    raise InvalidModel(f"archive {archive.name!r} holds more than {limits.archive_members} members (SERVE_MAX_ARCHIVE_MEMBERS)")
                if depth > limits.archive_depth:
                    raise InvalidModel(f"archive {archive.name!r}: member {member.name[:100]!r}… is {depth} levels deep; "
                                       f"the limit is {limits.archive_depth} (SERVE_MAX_ARCHIVE_DEPTH)")
                if written > limits.archive_bytes:
                    raise InvalidModel(f"archive {archive.name!r} expands to more than {limits.archive_bytes} bytes (SERVE_MAX_ARCHIVE_SIZE)")
                tar.extract(member, into, filter="data")
                if member.isreg():
                    files.add(posixpath.normpath(member.name))
    except tarfile.FilterError as exc:
        raise InvalidModel(f"archive {archive.name!r} refused: {exc}") from None
    except OSError as exc:  # its words, not its path: the path is the server's
        raise (no_room(exc, f"archive {archive.name!r}'s files")
               or InvalidModel(f"archive {archive.name!r} cannot be extracted: {exc.strerror or exc}")) from None
    except (tarfile.TarError, EOFError, zlib.error, RecursionError) as exc:  # deep paths recurse in mkdir
        raise InvalidModel(f"archive {archive.name!r} cannot be read: {exc}") from None
    entries = list(into.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not _has_model_files(into):
        return entries[0]  # an archive of one top-level folder
    return into
