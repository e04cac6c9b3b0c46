"""Every environment variable the server reads, typed, with its default, in one frozen object."""

import os
import re
import shutil
from dataclasses import dataclass, field, fields
from typing import Mapping

from container import content, resources
from container.limits import Limits, whole_number

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)?\s*$")
_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingsError(ValueError):
    """An environment variable holds a value the server cannot use; raised at start-up."""


def parse_size(text: str, total: int) -> int:
    """Bytes from `1073741824`, `512MiB`, `1.5GiB` or `75%` (of `total`)."""
    text = text.strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            percent = -1.0
        if not 0 < percent <= 100:
            raise SettingsError(f"{text!r}: a percentage must be in (0, 100]")
        return int(total * percent / 100)
    match = _SIZE.match(text)
    if not match:
        raise SettingsError(f"{text!r}: expected bytes with an optional KiB/MiB/GiB/TiB suffix, or a percentage")
    return int(float(match[1]) * _UNITS[match[2]])


def _env(name: str, default: str, doc: str):
    return field(metadata={"env": name, "default": default, "doc": doc})


@dataclass(frozen=True)
class Settings:
    port: int = _env("SAGEMAKER_BIND_TO_PORT", "8080", "TCP port the server listens on (all interfaces).")
    multi_model: bool = _env(
        "SAGEMAKER_MULTI_MODEL", "",
        "`true`: serve many models loaded through `/models` (SageMaker sets it on multi-model endpoints); `false`: serve the one model under the model root; unset: single-model when `SERVE_MODEL_ROOT` is unset and `/opt/ml/model` holds files (a single-model endpoint), multi-model otherwise.",
    )
    base_dir: str = _env(
        "SAGEMAKER_BASE_DIR", "/opt/ml", "Where SageMaker puts `model/` (single-model) and `models/` (multi-model), as its toolkits read it."
    )
    model_root: str = _env(
        "SERVE_MODEL_ROOT", "", "Directory (or `s3://bucket/prefix`) that load urls must resolve into; unset: `/opt/ml/models`, or `/opt/ml/model` when single-model."
    )
    download_cache: str = _env(
        "SERVE_DOWNLOAD_CACHE", "/tmp/serve-downloads", "Directory that keeps models downloaded from S3, across restarts."
    )
    download_cache_size: int = _env(
        "SERVE_DOWNLOAD_CACHE_SIZE", "50%", "Most bytes the download cache keeps: bytes with optional KiB/MiB/GiB suffix, or a percentage of its file system; least recently used models leave first."
    )
    memory_limit: int = _env(
        "SERVE_MEMORY_LIMIT", "70%", "Host RAM budget for loaded models: bytes with optional KiB/MiB/GiB suffix, or a percentage of the container's RAM."
    )
    gpu_memory_limit: str = _env(
        "SERVE_GPU_MEMORY_LIMIT", "90%", "Budget for loaded models on each GPU, same syntax; a percentage is of that GPU's memory."
    )
    eviction: str = _env(
        "SERVE_EVICTION", "lru", "`lru`: evict least-recently-used idle models to make room; `none`: answer 507 and let SageMaker evict."
    )
    max_payload_mb: float = _env("SAGEMAKER_MAX_PAYLOAD_IN_MB", "6", "Largest request body in MiB; larger bodies get 413.")
    load_models: tuple[str, ...] = _env(
        "SERVE_LOAD_MODELS", "", "Comma-separated model names under the model root to load at start; `*` loads every one."
    )
    log_level: str = _env("SERVE_LOG_LEVEL", "info", "Log level: debug, info, warning, error.")
    model_server_timeout: int = _env(
        "SAGEMAKER_MODEL_SERVER_TIMEOUT", "60", "Seconds a worker may stay silent before gunicorn restarts it."
    )
    default_accept: str = _env(
        "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", "application/json", "Answer type of invoke when `Accept` is missing or `*/*`."
    )
    program: str = _env(
        "SAGEMAKER_PROGRAM", "inference.py", "The handler script in a SageMaker-layout model's `code/` (the SDK's `entry_point`)."
    )
    install_requirements: bool = _env(
        "SERVE_INSTALL_REQUIREMENTS", "true", "`true`: pip-install a handler model's `code/requirements.txt` at load; `false` for air-gapped endpoints."
    )
    requirements_cache: str = _env(
        "SERVE_REQUIREMENTS_CACHE", "/tmp/serve-requirements", "Where installed `requirements.txt` packages are kept, one directory per distinct file."
    )
    max_decoded_size: int = _env(
        "SERVE_MAX_DECODED_SIZE", "256MiB", "Largest decoded size of one request's tensors (elements × item size, BYTES lengths included), checked before allocating; larger requests get 413."
    )
    max_archive_size: int = _env(
        "SERVE_MAX_ARCHIVE_SIZE", "100%", "Most bytes one model archive may expand to, checked while extracting; a percentage is of `SERVE_MEMORY_LIMIT` (a larger model could not load anyway)."
    )
    max_archive_members: int = _env("SERVE_MAX_ARCHIVE_MEMBERS", "10000", "Most files and directories one model archive may hold.")
    max_archive_depth: int = _env("SERVE_MAX_ARCHIVE_DEPTH", "32", "Most path components of one archive member (`a/b/c` has 3).")
    max_instances: int = _env("SERVE_MAX_INSTANCES", "64", "Most instances (threads) one model's `instance_group` may ask for.")
    max_priority_levels: int = _env("SERVE_MAX_PRIORITY_LEVELS", "64", "Most `priority_levels` one model's dynamic batcher may declare.")
    max_connections: int = _env(
        "SERVE_MAX_CONNECTIONS", "1000", "Most client connections served at once; more wait in the listen queue."
    )
    allow_client_shm: bool = _env(
        "SERVE_ALLOW_CLIENT_SHM", "true", "`true`: clients may register system and CUDA shared memory regions for inputs and outputs; `false` refuses them, as Triton does by default."
    )
    first_request_timeout: int = _env(
        "SERVE_FIRST_REQUEST_TIMEOUT", "10", "Seconds a new connection may stay silent before its first request; then it is closed."
    )
    inline_below_us: int = _env(
        "SERVE_INLINE_BELOW_US", "300", "Microseconds the event loop may spend on one execution: a request runs there, without a thread hand-off, when its model's latest executions, per item, times its items come to less (with a dynamic batcher, only a request that arrives alone); `0` never does."
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "Settings":
        raw = {f.name: environ.get(f.metadata["env"], "").strip() or f.metadata["default"] for f in fields(cls)}
        multi_model = _mode(raw)
        raw["model_root"] = raw["model_root"] or os.path.join(raw["base_dir"], "models" if multi_model else "model")
        eviction = raw["eviction"].lower()
        if eviction not in ("lru", "none"):
            raise SettingsError(f"SERVE_EVICTION={raw['eviction']!r}: expected 'lru' or 'none'")
        memory_limit = _size("SERVE_MEMORY_LIMIT", raw["memory_limit"], resources.memory_limit())
        _size("SERVE_GPU_MEMORY_LIMIT", raw["gpu_memory_limit"], 1)  # fail at start-up, not at the first GPU load
        return cls(
            port=_integer("SAGEMAKER_BIND_TO_PORT", raw["port"]),
            multi_model=multi_model,
            base_dir=raw["base_dir"],
            model_root=raw["model_root"],
            download_cache=raw["download_cache"],
            download_cache_size=_size("SERVE_DOWNLOAD_CACHE_SIZE", raw["download_cache_size"], _disk(raw["download_cache"])),
            memory_limit=memory_limit,
            gpu_memory_limit=raw["gpu_memory_limit"],
            eviction=eviction,
            max_payload_mb=_number("SAGEMAKER_MAX_PAYLOAD_IN_MB", raw["max_payload_mb"]),
            load_models=tuple(n.strip() for n in raw["load_models"].split(",") if n.strip()),
            log_level=raw["log_level"].upper(),
            model_server_timeout=_integer("SAGEMAKER_MODEL_SERVER_TIMEOUT", raw["model_server_timeout"]),
            default_accept=content.media_type(raw["default_accept"]),
            program=_program(raw["program"]),
            install_requirements=_boolean("SERVE_INSTALL_REQUIREMENTS", raw["install_requirements"]),
            requirements_cache=raw["requirements_cache"],
            max_decoded_size=_size("SERVE_MAX_DECODED_SIZE", raw["max_decoded_size"], 1),
            max_archive_size=_size("SERVE_MAX_ARCHIVE_SIZE", raw["max_archive_size"], memory_limit),
            max_archive_members=_positive("SERVE_MAX_ARCHIVE_MEMBERS", raw["max_archive_members"]),
            max_archive_depth=_positive("SERVE_MAX_ARCHIVE_DEPTH", raw["max_archive_depth"]),
            max_instances=_positive("SERVE_MAX_INSTANCES", raw["max_instances"]),
            max_priority_levels=_positive("SERVE_MAX_PRIORITY_LEVELS", raw["max_priority_levels"]),
            max_connections=_positive("SERVE_MAX_CONNECTIONS", raw["max_connections"]),
            allow_client_shm=_boolean("SERVE_ALLOW_CLIENT_SHM", raw["allow_client_shm"]),
            first_request_timeout=_positive("SERVE_FIRST_REQUEST_TIMEOUT", raw["first_request_timeout"]),
            inline_below_us=_integer("SERVE_INLINE_BELOW_US", raw["inline_below_us"]),
        )

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * (1 << 20))

    @property
    def limits(self) -> Limits:
        return Limits(self.max_decoded_size, self.max_archive_size, self.max_archive_members, self.max_archive_depth,
                      self.max_instances, self.max_priority_levels)

    def gpu_budget(self, total: int) -> int:
        return parse_size(self.gpu_memory_limit, total)


def _size(name: str, text: str, total: int) -> int:
    try:
        return parse_size(text, total)
    except SettingsError as exc:
        raise SettingsError(f"{name}={exc}") from None


def _disk(directory: str) -> int:
    """The size of the file system that holds `directory` (or would, once created)."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).total


def _boolean(name: str, text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise SettingsError(f"{name}={text!r}: expected true or false")


def _mode(raw: dict[str, str]) -> bool:
    """Multi-model or not. SageMaker sets SAGEMAKER_MULTI_MODEL=true on multi-model endpoints and nothing on
    single-model ones, where it extracts the model into /opt/ml/model; its toolkits default to single-model.
    Without the variable, a filled /opt/ml/model is that single-model endpoint; anything else (a local
    `docker run -v models:/opt/ml/models`, a SERVE_MODEL_ROOT) is multi-model."""
    if raw["multi_model"]:
        return _boolean("SAGEMAKER_MULTI_MODEL", raw["multi_model"])
    if raw["model_root"]:
        return True
    try:
        with os.scandir(os.path.join(raw["base_dir"], "model")) as entries:
            return not any(entries)
    except OSError:  # absent, or not a directory
        return True


def _program(text: str) -> str:
    """The script's file name; the SDK may pass a module name (`inference`) or a file (`inference.py`)."""
    name = text if text.endswith(".py") else text + ".py"
    if "/" in name or name.startswith("."):
        raise SettingsError(f"SAGEMAKER_PROGRAM={text!r}: expected a script name in code/, like inference.py")
    return name


def _integer(name: str, text: str) -> int:
    value = whole_number(text)
    if value is None:
        raise SettingsError(f"{name}={text!r}: expected a whole number")
    return value


def _positive(name: str, text: str) -> int:
    value = _integer(name, text)
    if value < 1:
        raise SettingsError(f"{name}={text!r}: expected a positive whole number")
    return value


def _number(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise SettingsError(f"{name}={text!r}: expected a positive number")
    return value
