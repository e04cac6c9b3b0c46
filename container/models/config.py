"""Triton `ModelConfig` from `config.pbtxt` or `config.json`, parsed with Triton's published schema."""

import os
from pathlib import Path

import orjson
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor

from container.errors import InvalidModel
from container.models.pt2_archive import AOTI_PLATFORM, EXPORT_PLATFORM, archive_kind
from container.models.triton_schema import model_config_pb2 as pb

PYTORCH_PLATFORMS = ("pytorch_libtorch",)
PT2_PLATFORMS = (AOTI_PLATFORM, EXPORT_PLATFORM)
PYTORCH_BACKENDS = ("pytorch",)
PYTHON_BACKEND = "python"
PT2 = "pt2"
ENSEMBLE_PLATFORM = "ensemble"
DEFAULT_MODEL_FILENAME = "model.pt"
DEFAULT_FILENAMES = {"pytorch": DEFAULT_MODEL_FILENAME, PT2: "model.pt2", PYTHON_BACKEND: "model.py", ENSEMBLE_PLATFORM: ""}
DEFAULT_SEQUENCE_IDLE_US = 1_000_000  # Triton's max_sequence_idle_microseconds when a config gives none
MAX_PATH_BYTES = 1024  # well under PATH_MAX with the model root in front


def read_config(directory: Path) -> tuple[pb.ModelConfig, dict[str, int]]:
    """The model's config and its version labels (our `config.json` extension `version_labels`). A
    python model may have no config at all, as on Triton: its `model.py` completes it at load."""
    labels: dict[str, int] = {}
    if (directory / "config.pbtxt").is_file():
        config = _parse_pbtxt(read_text(directory / "config.pbtxt", "config"))
    elif (directory / "config.json").is_file():
        config, labels = parse_json_config((directory / "config.json").read_bytes())
    elif has_python_versions(directory):
        config = pb.ModelConfig(name=directory.name, backend=PYTHON_BACKEND)
    elif has_versions(directory, DEFAULT_FILENAMES[PT2]):
        config = pb.ModelConfig(name=directory.name, backend="pytorch")
    else:
        raise InvalidModel(f"{directory.name}: no config.pbtxt or config.json")
    if not config.backend and not config.platform and has_python_versions(directory):
        config.backend = PYTHON_BACKEND  # a config that names no backend (an override, say): the files say which
    if not config.platform and kind_of(config) == "pytorch":
        config.platform = pt2_platform(directory, config) or ""
    check_config(config, complete=not completes_at_load(config))
    return config, labels


def has_python_versions(directory: Path) -> bool:
    """Whether the directory holds `<version>/model.py`: a python model, with or without a config."""
    return has_versions(directory, DEFAULT_FILENAMES[PYTHON_BACKEND])


def has_versions(directory: Path, filename: str) -> bool:
    return any(p.name.isdigit() and (p / filename).is_file() for p in directory.iterdir())


def pt2_platform(directory: Path, config: pb.ModelConfig) -> str | None:
    """The platform a pytorch config without one means, from its files: the kind of `.pt2` its latest
    version holds, or None (TorchScript)."""
    filename = config.default_model_filename or DEFAULT_FILENAMES[PT2]
    if not filename.endswith(".pt2"):
        return None
    versions = sorted((int(p.name), p / filename) for p in directory.iterdir() if p.name.isdigit() and (p / filename).is_file())
    return archive_kind(versions[-1][1]) if versions else None


def kind_of(config: pb.ModelConfig) -> str:
    """What runs the model: "pytorch" (TorchScript here), "pt2" (a `.pt2` file: an AOTInductor package
    or an ExportedProgram), "python" (a `model.py` in a worker process of its own) or "ensemble" (steps
    through other models). A pytorch config without a platform is TorchScript unless its directory
    holds `.pt2` files (`source.py` decides, and sets the platform)."""
    if config.platform == ENSEMBLE_PLATFORM:
        return ENSEMBLE_PLATFORM
    if config.platform in PT2_PLATFORMS:
        return PT2
    return PYTHON_BACKEND if config.backend == PYTHON_BACKEND else "pytorch"


def completes_at_load(config: pb.ModelConfig) -> bool:
    """Whether the model itself completes the config when it loads: a python model (its
    `auto_complete_config`), and a `.pt2` whose config leaves out its inputs or outputs."""
    return kind_of(config) == PYTHON_BACKEND or (kind_of(config) == PT2 and not (config.input and config.output))


def config_document(config: pb.ModelConfig) -> dict:
    """A ModelConfig as Triton prints it: proto field names, fields at their default value included (a
    control's `kind` of CONTROL_SEQUENCE_START is the enum's zero), 64-bit integers as numbers."""
    return _int64_as_numbers(json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True), config.DESCRIPTOR)


def normalize(config: pb.ModelConfig, name: str, device: str) -> None:
    """Fill in what Triton fills in a loaded model's config, so that the model's `initialize` and
    /config over HTTP and gRPC read what Triton's do: the backend's platform and file name, the latest
    version, a dynamic batch's preferred size (its largest), a sequence's idle time, pinned memory, and
    each instance group's name, kind and count. A group's kind says where the model runs here: on
    `device` (a GPU's index its `gpus`), KIND_AUTO resolved, and a GPU group on CPU where this server
    has no GPU (the model's placement says why). `name`: the name it serves under."""
    config.name = name
    kind = kind_of(config)
    if kind in ("pytorch", PT2):
        config.backend = config.backend or "pytorch"
    if kind == "pytorch" and not config.platform:  # TorchScript, as Triton names it
        config.platform = PYTORCH_PLATFORMS[0]
        config.default_model_filename = config.default_model_filename or DEFAULT_FILENAMES["pytorch"]
    elif kind in (PT2, PYTHON_BACKEND):
        config.default_model_filename = config.default_model_filename or DEFAULT_FILENAMES[kind]
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.max_batch_size > 0:
        if config.HasField("dynamic_batching") and not config.dynamic_batching.preferred_batch_size:
            config.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
        if config.sequence_batching.HasField("oldest") and not config.sequence_batching.oldest.preferred_batch_size:
            config.sequence_batching.oldest.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching") and not config.sequence_batching.max_sequence_idle_microseconds:
        config.sequence_batching.max_sequence_idle_microseconds = DEFAULT_SEQUENCE_IDLE_US
    if config.platform == ENSEMBLE_PLATFORM:
        config.model_transaction_policy.SetInParent()  # shown, as Triton shows an ensemble's
        return
    for pinned in ("input_pinned_memory", "output_pinned_memory"):
        if not config.optimization.HasField(pinned):
            getattr(config.optimization, pinned).enable = True
    _normalize_groups(config, device)


def _normalize_groups(config: pb.ModelConfig, device: str) -> None:
    on_gpu = device.startswith("cuda")
    if not config.instance_group:
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        group.name = group.name or f"{config.name}_{index}"
        group.count = max(group.count, 1)  # Triton's default for every count below one
        if group.kind == pb.ModelInstanceGroup.KIND_AUTO or (group.kind == pb.ModelInstanceGroup.KIND_GPU and not on_gpu):
            group.kind = pb.ModelInstanceGroup.KIND_GPU if on_gpu else pb.ModelInstanceGroup.KIND_CPU
        if group.kind == pb.ModelInstanceGroup.KIND_CPU:
            del group.gpus[:]
        elif group.kind == pb.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.append(int(device.partition(":")[2] or 0))


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64,
          FieldDescriptor.TYPE_SFIXED64, FieldDescriptor.TYPE_SINT64}


def _int64_as_numbers(value, descriptor):
    """protobuf's JSON writes 64-bit integers as strings; Triton's /config writes numbers."""
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                entry = field.message_type.fields_by_name["value"]
                if entry.message_type is not None:
                    value[key] = {k: _int64_as_numbers(v, entry.message_type) for k, v in item.items()}
            elif isinstance(item, list):
                value[key] = [_int64_as_numbers(v, field.message_type) for v in item]
            else:
                value[key] = _int64_as_numbers(item, field.message_type)
        elif field.type in _INT64:
            value[key] = [int(v) for v in item] if isinstance(item, list) else int(item)
    return value


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_bytes().decode()
    except UnicodeDecodeError as exc:
        raise InvalidModel(f"{what} {path.name!r} is not UTF-8 text: {exc}") from None


def parse_json_config(text: bytes) -> tuple[pb.ModelConfig, dict[str, int]]:
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidModel(f"config.json is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidModel("config.json must hold a JSON object")
    labels = document.pop("version_labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, int) and v > 0 for v in labels.values()):
        raise InvalidModel('version_labels must map label names to version numbers, e.g. {"stable": 1}')
    try:
        return json_format.ParseDict(document, pb.ModelConfig()), labels
    except json_format.ParseError as exc:
        raise InvalidModel(f"config.json does not match Triton's ModelConfig: {exc}") from None


def _parse_pbtxt(text: str) -> pb.ModelConfig:
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise InvalidModel(f"config.pbtxt does not match Triton's ModelConfig: {exc}") from None


def relative_path(relative: str, what: str) -> str:
    """`relative` normalised, refusing paths that are absolute, climb out, or no file system takes."""
    normal = os.path.normpath(relative) if relative else ""
    if (not relative or os.path.isabs(relative) or normal == "." or normal.split(os.sep)[0] == ".."
            or "\0" in relative or len(relative.encode()) > MAX_PATH_BYTES):
        raise InvalidModel(f"{what} {relative[:200]!r} must be a relative path inside the model directory")
    return normal


def check_config(config: pb.ModelConfig, complete: bool = True) -> None:
    """What the schema cannot say: a backend we run, named tensors with types and sane dims, and file
    names that stay inside the model's directory. A python model's config is `complete` once its
    `auto_complete_config` has run."""
    for what, path in _file_fields(config):
        relative_path(path, what)
    if config.platform and config.platform not in (*PYTORCH_PLATFORMS, *PT2_PLATFORMS, ENSEMBLE_PLATFORM):
        raise InvalidModel(f"platform {config.platform!r} is not served here; use 'pytorch_libtorch', 'torch_aoti', "
                           f"'torch_export' or 'ensemble'")
    if config.backend and config.backend not in (*PYTORCH_BACKENDS, PYTHON_BACKEND):
        raise InvalidModel(f"backend {config.backend!r} is not served here; use 'pytorch' or 'python'")
    if config.max_batch_size < 0:
        raise InvalidModel("max_batch_size must be 0 (no batching) or positive")
    _check_groups(config)
    if (config.batch_input or config.batch_output) and kind_of(config) in (PYTHON_BACKEND, ENSEMBLE_PLATFORM):
        raise InvalidModel(f"batch_input and batch_output are for TorchScript and PyTorch 2 models, which run a batch as "
                           f"one call; {'an ensemble' if kind_of(config) == ENSEMBLE_PLATFORM else 'a python model'} "
                           f"gets each request's own tensors")
    if not complete:
        return
    _check_preferred_sizes(config)
    if kind_of(config) == PYTHON_BACKEND:  # its code may take no tensors, or answer none, as on Triton
        if config.max_batch_size and not config.input:
            raise InvalidModel("a batching model takes each request's batch size from its inputs: declare one, or "
                               "set max_batch_size 0")
    elif not config.input or not config.output:
        missing = "inputs" if not config.input else "outputs"
        raise InvalidModel(f"the config declares no {missing}: declare them (a TorchScript model records no tensor "
                           f"types to complete them from, and a load's config override replaces the whole config)")
    if config.response_cache.enable and config.HasField("sequence_batching"):  # Triton's words
        raise InvalidModel(f"Response Cache does not currently support model{_named(config)} with sequence batching "
                           f"scheduler. Please disable the response cache.")
    if config.response_cache.enable and config.model_transaction_policy.decoupled:
        raise InvalidModel(f"Response Cache does not currently support model{_named(config)} with 'decoupled' "
                           f"transaction policy. Please disable the response cache.")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        names = [t.name for t in tensors]
        if len(set(names)) != len(names):
            raise InvalidModel(f"duplicate {kind} names in {names}")
        for tensor in tensors:
            if not tensor.name:
                raise InvalidModel(f"an {kind} has no name")
            if tensor.data_type == pb.TYPE_INVALID:
                raise InvalidModel(f"{kind} '{tensor.name}' has no data_type")
            if not tensor.dims:  # Triton's rule: a scalar is dims [1]
                raise InvalidModel(f"{kind} '{tensor.name}' has no dims; a single value is dims [1]")
            if any(d < -1 or d == 0 for d in tensor.dims):
                raise InvalidModel(f"{kind} '{tensor.name}': dims must be positive or -1, got {list(tensor.dims)}")


def _check_preferred_sizes(config: pb.ModelConfig) -> None:
    """A preferred batch size the batcher could never make, refused as Triton refuses it."""
    for what, sizes in (("dynamic_batching", config.dynamic_batching.preferred_batch_size),
                        ("sequence_batching oldest", config.sequence_batching.oldest.preferred_batch_size)):
        for size in sizes:
            if not 0 < size <= config.max_batch_size:
                raise InvalidModel(f"{what}: preferred_batch_size {size} must be within 1..{config.max_batch_size} "
                                   f"(max_batch_size)")


def _check_groups(config: pb.ModelConfig) -> None:
    for index, group in enumerate(config.instance_group):
        if group.kind == pb.ModelInstanceGroup.KIND_CPU and group.gpus:  # Triton's words
            raise InvalidModel(f"instance group {group.name or index} of model{_named(config)} has kind KIND_CPU but "
                               f"specifies one or more GPUs")


def _named(config: pb.ModelConfig) -> str:
    """The model's name for a message, a space before it, where the config gives one (a load names the rest)."""
    return f" {config.name}" if config.name else ""


def instance_count(config: pb.ModelConfig) -> int:
    """The execution instances (threads) a config asks for: every group's count (1 where unset), on
    each GPU the group lists, as Triton counts them."""
    return max(sum((group.count or 1) * max(len(group.gpus), 1) for group in config.instance_group), 1)


def instance_gpus(config: pb.ModelConfig) -> list[str]:
    """The GPU of each execution instance the config's groups place on named GPUs, `cuda:<index>`, in
    Triton's order: group by group, `count` instances on each GPU the group lists."""
    return [f"cuda:{index}" for group in config.instance_group for index in group.gpus for _ in range(group.count or 1)]


def _file_fields(config: pb.ModelConfig):
    """(field, path) of every file name a config may give — those we read and those we ignore alike."""
    if config.default_model_filename:
        yield "default_model_filename", config.default_model_filename
    for key, path in config.cc_model_filenames.items():
        yield f"cc_model_filenames[{key!r}]", path
    for output in config.output:
        if output.label_filename:
            yield f"output '{output.name}': label_filename", output.label_filename
    for warmup in config.model_warmup:
        for name, data in warmup.inputs.items():
            if data.HasField("input_data_file"):
                yield f"model_warmup '{warmup.name}' input '{name}': input_data_file", data.input_data_file
    for state in config.sequence_batching.state:
        for initial in state.initial_state:
            if initial.HasField("data_file"):
                yield f"sequence_batching state '{state.input_name}': data_file", initial.data_file
    for library in config.model_operations.op_library_filename:
        yield "model_operations.op_library_filename", library


def selected_versions(config: pb.ModelConfig, available: list[int], filename: str = DEFAULT_MODEL_FILENAME) -> list[int]:
    """Versions to serve under the config's version_policy (default: the latest one)."""
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        chosen = sorted(available)
    elif choice == "specific":
        missing = sorted(set(policy.specific.versions) - set(available))
        if missing:
            raise InvalidModel(f"version_policy names versions {missing} that have no model file")
        chosen = sorted(policy.specific.versions)
    else:
        count = policy.latest.num_versions if choice == "latest" else 1
        if count < 1:
            raise InvalidModel("version_policy latest num_versions must be at least 1: no version would serve")
        chosen = sorted(available)[-count:]
    if not chosen:
        raise InvalidModel(f"no version directory holds a model file (looked for <version>/{filename})")
    return chosen
