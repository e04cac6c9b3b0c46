"""Where a model's files are: a url checked against the model root, an archive extracted safely, the
layout recognised, and the size estimated from the files before anything is loaded."""

import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from container.errors import InvalidModel, InvalidRequest, SourceNotFound
from container.models.config import (
    DEFAULT_MODEL_FILENAME,
    read_config,
    selected_versions,
)

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
SAGEMAKER_WEIGHTS = (".pt", ".pth")  # SageMaker's PyTorch toolkit loads the one such file at the top


@dataclass
class TritonLayout:
    config: object  # model_config_pb2.ModelConfig
    labels: dict[str, int]  # version label → version
    versions: dict[int, Path]  # version → model file
    output_labels: dict[str, list[str]]  # output → class labels from its label_filename


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


def check_name(name) -> str:
    """A model name clients may choose: a non-empty string without '/', '\\', '..' or control characters."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequest("a model name must be a non-empty string")
    if "/" in name or "\\" in name or ".." in name or any(ord(c) < 32 for c in name):
        raise InvalidRequest(f"model name {name!r} may not hold '/', '\\', '..' or control characters")
    return name


def resolve_url(root: str, url: str) -> Path:
    """The url as a path inside the model root (symlinks followed), or a 400/404 that says why."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidRequest("'url' must be a non-empty string naming a directory or archive under the model root")
    base = Path(root).resolve()
    path = (base / url).resolve()  # an absolute url replaces the base
    if path != base and base not in path.parents:
        raise InvalidRequest(f"url {url!r} resolves outside the model root {str(base)!r}")
    if not path.exists():
        raise SourceNotFound(f"url {url!r} does not exist")
    return path


def repository_entries(root: str) -> list[tuple[str, str]]:
    """(name, url) of every model directory or archive directly under the root."""
    entries = []
    for path in sorted(Path(root).iterdir()):
        if path.is_dir() or path.name.endswith(ARCHIVE_SUFFIXES):
            name = next((path.name.removesuffix(s) for s in ARCHIVE_SUFFIXES if path.name.endswith(s)), path.name)
            entries.append((name, path.name))
    return entries


def open_source(path: Path) -> ModelSource:
    """Blocking: extract an archive if need be and recognise the layout. Run it off the event loop."""
    scratch = None
    if path.is_dir():
        archives = [p for p in path.iterdir() if p.name.endswith(ARCHIVE_SUFFIXES)]
        if len(archives) == 1 and not _has_model_files(path):
            path = archives[0]  # SageMaker copies model.tar.gz into the model's directory
    if path.is_file():
        scratch = Path(tempfile.mkdtemp(prefix="model-"))
        try:
            directory = _extract(path, scratch)
            return ModelSource(directory, read_layout(directory), scratch)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    return ModelSource(path, read_layout(path))


def read_layout(directory: Path) -> TritonLayout | SageMakerLayout:
    """Triton's when there is a config.pbtxt, or a config.json and nothing of SageMaker's layout (weights
    at the top, code/): a SageMaker model may keep a config.json of its own beside its weights."""
    weights = _weights(directory)
    sagemaker = bool(weights) or (directory / "code").is_dir()
    if (directory / "config.pbtxt").is_file() or ((directory / "config.json").is_file() and not sagemaker):
        return _triton_layout(directory)
    if sagemaker:
        return SageMakerLayout(weights)
    raise InvalidModel(
        f"no model in {directory.name!r}: expected config.pbtxt/config.json with <version>/model.pt "
        f"(Triton layout), or a .pt/.pth file with optional code/inference.py (SageMaker layout)"
    )


def _weights(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix in SAGEMAKER_WEIGHTS and p.is_file())


def _triton_layout(directory: Path) -> TritonLayout:
    config, labels = read_config(directory)
    filename = config.default_model_filename or DEFAULT_MODEL_FILENAME
    available = {
        int(p.name): p / filename for p in directory.iterdir() if p.name.isdigit() and (p / filename).is_file()
    }
    versions = {v: available[v] for v in selected_versions(config, sorted(available))}
    unknown = {k: v for k, v in labels.items() if v not in versions}
    if unknown:
        raise InvalidModel(f"version_labels {unknown} name versions that are not served ({sorted(versions)})")
    return TritonLayout(config, labels, versions, _output_labels(directory, config))


def _output_labels(directory: Path, config) -> dict[str, list[str]]:
    labels = {}
    for output in config.output:
        if output.label_filename:
            path = inside(directory, output.label_filename, f"output '{output.name}': label_filename")
            if not path.is_file():
                raise InvalidModel(f"output '{output.name}': label_filename {output.label_filename!r} is not a file in the model")
            labels[output.name] = path.read_text().splitlines()
    return labels


def inside(directory: Path, relative: str, what: str) -> Path:
    """`directory/relative`, refusing paths that are absolute or climb out of the directory."""
    normal = os.path.normpath(relative)
    if not relative or os.path.isabs(relative) or normal == "." or normal.startswith("..") or "\0" in relative:
        raise InvalidModel(f"{what} {relative!r} must be a relative path inside the model directory")
    return directory / normal


def _has_model_files(path: Path) -> bool:
    return any((path / n).exists() for n in ("config.pbtxt", "config.json", "code")) or bool(_weights(path))


def _extract(archive: Path, into: Path) -> Path:
    """Extract with tarfile's `data` filter: no absolute paths, no `..`, no links or devices that escape."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
    except tarfile.FilterError as exc:
        raise InvalidModel(f"archive {archive.name!r} refused: {exc}") from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InvalidModel(f"archive {archive.name!r} cannot be read: {exc}") from None
    entries = list(into.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not _has_model_files(into):
        return entries[0]  # an archive of one top-level folder
    return into
