"""Every environment variable the server reads, typed, with its default, in one frozen object."""

import difflib
import hmac
import os
import re
import shutil
from dataclasses import dataclass, field, fields
from typing import Mapping

from container import content, resources
from container.errors import Forbidden
from container.frontends import grpc_workers
from container.limits import Limits, boolean, whole_number

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)?\s*$")
_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
MAX_HTTP_WORKERS = 64
_AUTO_HTTP_WORKERS = 16  # `auto` on a larger machine: past it, the one model process is the limit
# `auto` inline thresholds (scheduling/inline.py). With a second core, a thread runs the model while the
# loop serves on. On one core they take turns either way, in Linux's time slices of about a millisecond
# (0.75 ms and up), and the hand-off only costs CPU: an MLP of ~600 µs cost 7% more CPU a request on its
# thread than inline (8 and 64 clients), and a tiny model served beside it waited as long (p50 2.2 ms)
# whichever way it ran.
_AUTO_INLINE_BELOW_US = 300
_AUTO_INLINE_BELOW_US_ONE_CORE = 1000


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
        "SERVE_MEMORY_LIMIT", "70%", "Host RAM budget for loaded models: bytes with optional KiB/MiB/GiB suffix, or a percentage of the container's RAM (its cgroup limit)."
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
        "SAGEMAKER_MODEL_SERVER_TIMEOUT", "60", "Seconds the model process may stay silent before gunicorn restarts it, a request may wait for room among the requests a process holds or for a sequence slot, and (unless `SAGEMAKER_TS_RESPONSE_TIMEOUT` says otherwise) a handler model's worker may take over one request, as in SageMaker's PyTorch container. `0` turns off gunicorn's bound and a handler worker's."
    )
    model_server_workers: int | None = _env(
        "SAGEMAKER_MODEL_SERVER_WORKERS", "", "Worker processes of each SageMaker handler model, each with the model loaded, serving one request at a time. Unset: one on a multi-model endpoint; on a single-model endpoint `SAGEMAKER_TS_MIN_WORKERS`, else one per CPU of the container's quota (one per GPU where there are GPUs), as SageMaker's PyTorch container sizes TorchServe's workers. Each worker's torch gets its share of the cores."
    )
    ts_min_workers: int | None = _env(
        "SAGEMAKER_TS_MIN_WORKERS", "", "On a single-model endpoint, the handler model's worker processes where `SAGEMAKER_MODEL_SERVER_WORKERS` is unset (the SageMaker PyTorch toolkit's name; ignored on a multi-model endpoint, as there)."
    )
    ts_max_workers: int | None = _env(
        "SAGEMAKER_TS_MAX_WORKERS", "", "The most worker processes a handler model's pool grows to while requests wait for one, on either kind of endpoint, as far as the memory budget has room (the SageMaker PyTorch toolkit's name; TorchServe itself never grows a pool). Unset, or below the starting count: the pool keeps its starting count."
    )
    handler_idle_seconds: int = _env(
        "SERVE_HANDLER_IDLE_SECONDS", "60", "Seconds a handler model's worker beyond its starting count may stay idle before it ends. Idle extra workers also end at once when another model needs their memory, before any model is evicted."
    )
    ts_response_timeout: int | None = _env(
        "SAGEMAKER_TS_RESPONSE_TIMEOUT", "", "Seconds a handler model's worker may take over one request; then the worker is killed, the request fails with 500, and the next request that takes the worker starts it again. Unset: `SAGEMAKER_MODEL_SERVER_TIMEOUT` (none where that is 0), which SageMaker's toolkit makes TorchServe's default_response_timeout."
    )
    load_timeout: int = _env(
        "SERVE_LOAD_TIMEOUT", "300", "Seconds a model's worker process may take to start and load: a handler model's `model_fn` (with its `requirements.txt` install), a python-backend model's `auto_complete_config` and each instance's `initialize`; then the process is killed and the load fails."
    )
    python_response_timeout: int = _env(
        "SERVE_PYTHON_RESPONSE_TIMEOUT", "300", "Seconds a python-backend model's `execute` may take for one batch; then the instance's process is killed, the batch fails with 500, and the next batch starts the instance again."
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
        "SERVE_REQUIREMENTS_CACHE", "/tmp/serve-requirements", "Where installed `requirements.txt` packages are kept, one directory per distinct file; what an install its worker did not finish left is removed by the next install."
    )
    requirements_cache_size: int = _env(
        "SERVE_REQUIREMENTS_CACHE_SIZE", "25%", "Most bytes the requirements cache keeps after an install: bytes with optional KiB/MiB/GiB suffix, or a percentage of its file system; installs no worker uses leave, least recently used first."
    )
    repository_poll_seconds: float = _env(
        "SERVE_REPOSITORY_POLL_SECONDS", "off", "Triton's `--model-control-mode=poll` for a local model root, in multi-model mode: every so many seconds a loaded model whose files changed is loaded again, one whose files are gone is unloaded, and with `SERVE_LOAD_MODELS=*` a model that appears is loaded; `off`: the repository changes only through the load and unload APIs."
    )
    response_cache_size: int = _env(
        "SERVE_RESPONSE_CACHE_SIZE", "0", "Most bytes of responses kept for the models whose config enables `response_cache` (Triton's `--cache-config local,size=…`): bytes with optional KiB/MiB/GiB suffix, or a percentage of `SERVE_MEMORY_LIMIT`; `0`: no cache. Least recently used responses leave first."
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
    max_total_instances: int = _env(
        "SERVE_MAX_TOTAL_INSTANCES", "1024", "Most instances (threads, or a handler model's worker process) of all loaded models together; a load past it gets 507."
    )
    max_priority_levels: int = _env("SERVE_MAX_PRIORITY_LEVELS", "64", "Most `priority_levels` one model's dynamic batcher may declare.")
    max_connections: int = _env(
        "SERVE_MAX_CONNECTIONS", "", "Most client connections each HTTP process (each front-end, or the model process when it serves HTTP) serves at once; unset: as many as its open-file limit allows (its soft limit is raised to the hard one at start). When all are taken, the connection idle the longest is closed to make room for a new one."
    )
    max_header_bytes: int = _env(
        "SERVE_MAX_HEADER_BYTES", "64KiB", "Most bytes of one request's head (request line and headers), counted while it arrives; more get 431."
    )
    request_head_timeout: int = _env(
        "SERVE_REQUEST_HEAD_TIMEOUT", "10", "Seconds from a request's first byte to the end of its head; a slower head gets 408."
    )
    max_bodies_size: int = _env(
        "SERVE_MAX_BODIES_SIZE", "1%", "Most bytes of arrived requests the front-end processes hold at once, HTTP and gRPC, each process an equal share (the model process's, when it serves HTTP itself): a request counts from when it has arrived whole until its answer is made, and the server holds a few copies of it meanwhile. One past it waits until earlier ones are answered, first come first served, and gets 503 (`UNAVAILABLE`) if it waited `SAGEMAKER_MODEL_SERVER_TIMEOUT` seconds; one larger than a share goes alone. Small requests (at most 1/128 of a share) take turns in a line of their own, an eighth of the share, and never wait behind a large one; a request without a body (a health check) never waits. Bytes with optional KiB/MiB/GiB suffix, or a percentage of the container's RAM (its cgroup limit)."
    )
    min_body_rate: int = _env(
        "SERVE_MIN_BODY_RATE", "16KiB", "Bytes per second a request body must average, after a 5-second grace, while it arrives; a slower body gets 408. A client must take an answer (each piece of a streamed one) at this rate too, after the same grace, else its connection is closed."
    )
    allow_client_shm: bool = _env(
        "SERVE_ALLOW_CLIENT_SHM", "false", "A relaxation. `true`: clients may register system and CUDA shared memory regions for inputs and outputs (Triton's `--allow-client-shm`); `false` refuses them, as Triton does by default."
    )
    max_shm_regions: int = _env(
        "SERVE_MAX_SHM_REGIONS", "256", "Most shared memory regions registered at once (each holds a descriptor or a device mapping)."
    )
    allow_model_files: bool = _env(
        "SERVE_ALLOW_MODEL_FILES", "false", "A relaxation. `true`: a V2 repository `load` may carry a model's files (`file:` parameters), which then run in the server; such a model never replaces one from the model root. `false` refuses them (403)."
    )
    s3_roots: tuple[str, ...] = _env(
        "SERVE_S3_ROOTS", "", "A relaxation. Comma-separated `s3://bucket/prefix/` roots under which an absolute `s3://` load url (in `POST /models` or `X-Amzn-SageMaker-Target-Model`) is fetched; an S3 `SERVE_MODEL_ROOT` is always one. Empty: no absolute S3 url is fetched (403)."
    )
    restricted_api: tuple = _env(
        "SERVE_RESTRICTED_API", "", "API groups that answer only requests carrying a header: `<group>[,<group>…]:<header>=<value>`, several such separated by `;`, as Triton's `--http-restricted-api`. Groups: `health`, `metadata`, `inference`, `shared-memory`, `model-config`, `model-repository` (SageMaker's `/models` writes too), `statistics` (with `/metrics`), `trace`, `logging`: Triton's nine. A request without the header gets 403."
    )
    first_request_timeout: int = _env(
        "SERVE_FIRST_REQUEST_TIMEOUT", "10", "Seconds a new connection may stay silent before its first request; then it is closed."
    )
    http_workers: int = _env(
        "SERVE_HTTP_WORKERS", "auto", "HTTP front-end processes: they parse HTTP and hand each request to the one process that owns the models, over a local socket, so HTTP uses more than one core. `auto`: the CPU quota, at most 16, and none on a single core, where the hop costs more than it spreads. `0`: the model process serves HTTP itself."
    )
    grpc_port: int | None = _env(
        "SERVE_GRPC_PORT", "8001", "TCP port of the gRPC front-ends, processes of their own beside the HTTP ones and as many (one at least), sharing the port: Triton's `GRPCInferenceService`, KServe ModelMesh's `mmesh.ModelRuntime` and `grpc.health.v1`. `off`: no gRPC, the default where `SAGEMAKER_SAFE_PORT_RANGE` is set (on SageMaker, which sends a container nothing but HTTP)."
    )
    safe_port_range: tuple[int, int] | None = _env(
        "SAGEMAKER_SAFE_PORT_RANGE", "", "The ports SageMaker lets a container listen on beside `SAGEMAKER_BIND_TO_PORT`, `<first>-<last>`; the platform sets it (the containers of an inference pipeline share the host's ports). Set, `SERVE_GRPC_PORT` and `SERVE_METRICS_PORT` must lie within it, as Triton requires on SageMaker."
    )
    metrics_port: int | None = _env(
        "SERVE_METRICS_PORT", "off", "TCP port that serves `GET /metrics` alone, as Triton's metrics port (8002) does, for scrapers set up for Triton; `off`: metrics are on the HTTP port only (they always are there too)."
    )
    grpc_keepalive_time: int = _env(
        "SERVE_GRPC_KEEPALIVE_TIME", "7200", "Seconds a gRPC connection may stay silent before the server pings it (Triton's default)."
    )
    grpc_keepalive_timeout: int = _env(
        "SERVE_GRPC_KEEPALIVE_TIMEOUT", "20", "Seconds the server waits for a ping's answer before it closes the gRPC connection."
    )
    grpc_max_pending: int = _env(
        "SERVE_GRPC_MAX_PENDING", "65536", "Most gRPC calls and streams that have arrived and wait for a gRPC front-end to take them up; past it, gRPC cancels the newest (its own defaults, 1,000 and 3,000, cancelled half of a burst of 3,000 clients here)."
    )
    grpc_compression: str = _env(
        "SERVE_GRPC_COMPRESSION", "none", "Compression of gRPC answers: `none`, `gzip` or `deflate`. Requests may come compressed either way; their size limit is `SAGEMAKER_MAX_PAYLOAD_IN_MB`, as over HTTP."
    )
    inline_below_us: int = _env(
        "SERVE_INLINE_BELOW_US", "auto", "Microseconds the event loop may spend on one execution: a request runs there, without a thread hand-off, when its model's latest executions, per item, times its items come to less (with a dynamic batcher, a request that arrives alone, judged on such requests, or a batch as it is cut, judged on its batches); `0` never does. `auto`: 300 where the CPU quota has two cores or more, 1000 on one core, where a thread overlaps nothing with the loop and only adds its hand-off. A model on its threads whose executions there cost under four times this tries the loop now and then, ever more rarely while it does not fit (a thread's CPU time grows with a busy loop on another core)."
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
        safe_ports = _port_range("SAGEMAKER_SAFE_PORT_RANGE", raw["safe_port_range"])
        if safe_ports is not None and not environ.get("SERVE_GRPC_PORT", "").strip():
            raw["grpc_port"] = "off"
        settings = cls(
            port=_port("SAGEMAKER_BIND_TO_PORT", raw["port"]),
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
            model_server_workers=_optional_positive("SAGEMAKER_MODEL_SERVER_WORKERS", raw["model_server_workers"]),
            ts_min_workers=_optional_positive("SAGEMAKER_TS_MIN_WORKERS", raw["ts_min_workers"]),
            ts_max_workers=_optional_positive("SAGEMAKER_TS_MAX_WORKERS", raw["ts_max_workers"]),
            handler_idle_seconds=_positive("SERVE_HANDLER_IDLE_SECONDS", raw["handler_idle_seconds"]),
            ts_response_timeout=_optional_positive("SAGEMAKER_TS_RESPONSE_TIMEOUT", raw["ts_response_timeout"]),
            load_timeout=_positive("SERVE_LOAD_TIMEOUT", raw["load_timeout"]),
            python_response_timeout=_positive("SERVE_PYTHON_RESPONSE_TIMEOUT", raw["python_response_timeout"]),
            default_accept=content.media_type(raw["default_accept"]),
            program=_program(raw["program"]),
            install_requirements=_boolean("SERVE_INSTALL_REQUIREMENTS", raw["install_requirements"]),
            requirements_cache=raw["requirements_cache"],
            requirements_cache_size=_size("SERVE_REQUIREMENTS_CACHE_SIZE", raw["requirements_cache_size"],
                                          _disk(raw["requirements_cache"])),
            repository_poll_seconds=_poll_seconds(raw, multi_model),
            response_cache_size=_size("SERVE_RESPONSE_CACHE_SIZE", raw["response_cache_size"], memory_limit),
            max_decoded_size=_size("SERVE_MAX_DECODED_SIZE", raw["max_decoded_size"], 1),
            max_archive_size=_size("SERVE_MAX_ARCHIVE_SIZE", raw["max_archive_size"], memory_limit),
            max_archive_members=_positive("SERVE_MAX_ARCHIVE_MEMBERS", raw["max_archive_members"]),
            max_archive_depth=_positive("SERVE_MAX_ARCHIVE_DEPTH", raw["max_archive_depth"]),
            max_instances=_positive("SERVE_MAX_INSTANCES", raw["max_instances"]),
            max_total_instances=_positive("SERVE_MAX_TOTAL_INSTANCES", raw["max_total_instances"]),
            max_priority_levels=_positive("SERVE_MAX_PRIORITY_LEVELS", raw["max_priority_levels"]),
            max_connections=resources.connection_limit(
                _positive("SERVE_MAX_CONNECTIONS", raw["max_connections"]) if raw["max_connections"] else None),
            max_header_bytes=_size("SERVE_MAX_HEADER_BYTES", raw["max_header_bytes"], 1),
            request_head_timeout=_positive("SERVE_REQUEST_HEAD_TIMEOUT", raw["request_head_timeout"]),
            max_bodies_size=_size("SERVE_MAX_BODIES_SIZE", raw["max_bodies_size"], resources.memory_limit()),
            min_body_rate=_size("SERVE_MIN_BODY_RATE", raw["min_body_rate"], 1),
            allow_client_shm=_boolean("SERVE_ALLOW_CLIENT_SHM", raw["allow_client_shm"]),
            max_shm_regions=_positive("SERVE_MAX_SHM_REGIONS", raw["max_shm_regions"]),
            allow_model_files=_boolean("SERVE_ALLOW_MODEL_FILES", raw["allow_model_files"]),
            s3_roots=_s3_roots(raw["s3_roots"], raw["model_root"]),
            restricted_api=restricted_api(raw["restricted_api"]),
            first_request_timeout=_positive("SERVE_FIRST_REQUEST_TIMEOUT", raw["first_request_timeout"]),
            http_workers=_http_workers(raw["http_workers"]),
            grpc_port=_listening_port("SERVE_GRPC_PORT", raw["grpc_port"], safe_ports),
            safe_port_range=safe_ports,
            metrics_port=_listening_port("SERVE_METRICS_PORT", raw["metrics_port"], safe_ports),
            grpc_keepalive_time=_positive("SERVE_GRPC_KEEPALIVE_TIME", raw["grpc_keepalive_time"]),
            grpc_keepalive_timeout=_positive("SERVE_GRPC_KEEPALIVE_TIMEOUT", raw["grpc_keepalive_timeout"]),
            grpc_max_pending=_positive("SERVE_GRPC_MAX_PENDING", raw["grpc_max_pending"]),
            grpc_compression=_choice("SERVE_GRPC_COMPRESSION", raw["grpc_compression"], ("none", "gzip", "deflate")),
            inline_below_us=_inline_below(raw["inline_below_us"]),
        )
        _check_distinct_ports(settings)
        return settings

    @property
    def bodies_per_process(self) -> int:
        """Each front-end process's share of SERVE_MAX_BODIES_SIZE: the HTTP ones' (or the model process's, when
        it serves HTTP itself) and, with gRPC on, the gRPC ones'."""
        http = max(self.http_workers, 1)
        return self.max_bodies_size // (http + (grpc_workers(self.http_workers) if self.grpc_port is not None else 0))

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * (1 << 20))

    @property
    def limits(self) -> Limits:
        return Limits(self.max_decoded_size, self.max_archive_size, self.max_archive_members, self.max_archive_depth,
                      self.max_instances, self.max_priority_levels, self.max_total_instances)

    def relaxations(self) -> dict[str, object]:
        """The trust relaxations switched on (docs/security.md, "Threat model"), by variable: logged at start."""
        switched = {"SERVE_ALLOW_CLIENT_SHM": self.allow_client_shm, "SERVE_ALLOW_MODEL_FILES": self.allow_model_files,
                    "SERVE_S3_ROOTS": ",".join(r for r in self.s3_roots if r != self.model_root.rstrip("/") + "/"),
                    "SERVE_RESPONSE_CACHE_SIZE": self.response_cache_size}
        return {name: value for name, value in switched.items() if value}

    def gpu_budget(self, total: int) -> int:
        return parse_size(self.gpu_memory_limit, total)

    def handler_workers(self, gpus: int) -> int:
        """Worker processes of each handler model (SAGEMAKER_MODEL_SERVER_WORKERS says how it is chosen)."""
        if self.model_server_workers:
            return self.model_server_workers
        if self.multi_model:
            return 1
        return self.ts_min_workers or gpus or resources.cpu_quota()

    def handler_max_workers(self, gpus: int) -> int:
        """The most worker processes each handler model's pool grows to (SAGEMAKER_TS_MAX_WORKERS)."""
        return max(self.ts_max_workers or 0, self.handler_workers(gpus))

    @property
    def handler_timeout(self) -> int | None:
        """Seconds a handler model's worker may take over one request (None: no bound)."""
        return self.ts_response_timeout or (self.model_server_timeout if self.model_server_timeout > 0 else None)


def _size(name: str, text: str, total: int) -> int:
    try:
        return parse_size(text, total)
    except SettingsError as exc:
        raise SettingsError(f"{name}={exc}") from None


def _poll_seconds(raw: dict, multi_model: bool) -> float:
    text = raw["repository_poll_seconds"]
    if text.lower() == "off":
        return 0.0
    seconds = _number("SERVE_REPOSITORY_POLL_SECONDS", text)
    if not multi_model or raw["model_root"].startswith("s3://"):
        raise SettingsError(f"SERVE_REPOSITORY_POLL_SECONDS={text!r}: the repository is polled on a local model root of "
                            f"a multi-model server only")
    return seconds


def _http_workers(text: str) -> int:
    if text.lower() == "auto":
        cores = min(resources.cpu_quota(), _AUTO_HTTP_WORKERS)
        return cores if cores > 1 else 0
    count = _integer("SERVE_HTTP_WORKERS", text)
    if not 0 <= count <= MAX_HTTP_WORKERS:
        raise SettingsError(f"SERVE_HTTP_WORKERS={text!r}: expected auto, or 0 to {MAX_HTTP_WORKERS}")
    return count


def _inline_below(text: str) -> int:
    if text.lower() == "auto":
        return _AUTO_INLINE_BELOW_US if resources.cpu_quota() > 1 else _AUTO_INLINE_BELOW_US_ONE_CORE
    return _integer("SERVE_INLINE_BELOW_US", text)


def _disk(directory: str) -> int:
    """The size of the file system that holds `directory` (or would, once created)."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).total


def _boolean(name: str, text: str) -> bool:
    value = boolean(text)
    if value is None:
        raise SettingsError(f"{name}={text!r}: expected true or false")
    return value


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


API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace",
              "logging")


@dataclass(frozen=True)
class Restriction:
    """API groups that answer only requests whose `header` holds `value`."""

    groups: frozenset[str]
    header: str  # lower-case, as requests carry header names (and gRPC its metadata keys)
    value: str

    def check(self, sent: str | None) -> None:
        """Refuse a request whose header (or gRPC metadata) carried `sent`, unless it is the value."""
        if sent is None or not hmac.compare_digest(sent.encode("latin-1", "replace"), self.value.encode("latin-1", "replace")):
            raise Forbidden(f"This API is restricted, expecting header '{self.header}'")  # Triton's words


def restricted_api(text: str) -> tuple[Restriction, ...]:
    """Triton's `--http-restricted-api` grammar, `;` between specs: `model-repository,statistics:key=value`."""
    restrictions, seen = [], set()
    for spec in filter(None, (part.strip() for part in text.split(";"))):
        groups_text, _, header_spec = spec.partition(":")
        header, _, value = header_spec.partition("=")
        groups = frozenset(g.strip() for g in groups_text.split(",") if g.strip())
        unknown = sorted(groups - set(API_GROUPS))
        if not groups or unknown or not header.strip() or not value:
            shown = f"{groups_text}:{header}=…" if value else spec  # the value is a secret: never in a message
            raise SettingsError(f"SERVE_RESTRICTED_API={shown!r}: expected <group>[,<group>...]:<header>=<value> with "
                                f"groups among {', '.join(API_GROUPS)}" + (f"; unknown: {unknown}" if unknown else ""))
        if groups & seen:
            raise SettingsError(f"SERVE_RESTRICTED_API: {sorted(groups & seen)} restricted twice")
        seen |= groups
        restrictions.append(Restriction(groups, header.strip().lower(), value))
    return tuple(restrictions)


def _s3_roots(text: str, model_root: str) -> tuple[str, ...]:
    """Each root as `s3://bucket/prefix/` (a prefix ends with '/', so `s3://b/m` does not admit `s3://b/models2`)."""
    roots = [r.strip() for r in text.split(",") if r.strip()] + ([model_root] if model_root.startswith("s3://") else [])
    for root in roots:
        bucket, _, key = root.removeprefix("s3://").partition("/")
        if not root.startswith("s3://") or not bucket or ".." in key.split("/"):
            raise SettingsError(f"SERVE_S3_ROOTS: {root!r} is not an s3://bucket/prefix url")
    return tuple(dict.fromkeys(r.rstrip("/") + "/" for r in roots))


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


def _port(name: str, text: str, optional: bool = False) -> int:
    """`optional`: the setting may be `off` instead."""
    value = whole_number(text)
    if value is None or not 0 < value < 65536:
        raise SettingsError(f"{name}={text!r}: expected a TCP port (1-65535){', or off' if optional else ''}")
    return value


def _port_range(name: str, text: str) -> tuple[int, int] | None:
    if not text:
        return None
    first, _, last = text.partition("-")
    try:
        ports = int(first), int(last)
    except ValueError:
        ports = (0, 0)
    if not 0 < ports[0] <= ports[1] < 65536:
        raise SettingsError(f"{name}={text!r}: expected a range of TCP ports, <first>-<last>, such as 23000-23999")
    return ports


def _listening_port(name: str, text: str, safe_ports: tuple[int, int] | None) -> int | None:
    """The port `name` sets (None: off), which must be one of `safe_ports` where they are given."""
    if text.lower() == "off":
        return None
    port = _port(name, text, optional=True)
    if safe_ports is not None and not safe_ports[0] <= port <= safe_ports[1]:
        raise SettingsError(f"{name}={text!r} is outside SAGEMAKER_SAFE_PORT_RANGE ({safe_ports[0]}-{safe_ports[1]}), the "
                            f"ports SageMaker lets this container listen on: choose one of them, or off")
    return port


def _check_distinct_ports(settings: Settings) -> None:
    """HTTP, gRPC and metrics each on a port of its own: two on one port would leave one of them never
    listening (the metrics port on the HTTP one restarted the model process for ever)."""
    ports = {"SAGEMAKER_BIND_TO_PORT": settings.port, "SERVE_GRPC_PORT": settings.grpc_port,
             "SERVE_METRICS_PORT": settings.metrics_port}
    named: dict[int, str] = {}
    for name, port in ports.items():
        if port and port in named:
            raise SettingsError(f"{name}={port} is {named[port]}'s port too: HTTP, gRPC and metrics each need a port "
                                f"of their own")
        named[port] = name


def _choice(name: str, text: str, choices: tuple[str, ...]) -> str:
    if text.lower() not in choices:
        raise SettingsError(f"{name}={text!r}: expected one of {', '.join(choices)}")
    return text.lower()


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


def _optional_positive(name: str, text: str) -> int | None:
    return _positive(name, text) if text.strip() else None


# What Kubernetes sets in every container of a namespace that has a Service named `serve`
_KUBERNETES_SERVICE = re.compile(r"SERVE_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?)")
# SageMaker PyTorch toolkit variables an operator sets to change what TorchServe does, which change nothing
# here; docs/models.md says why of the batch
_UNBATCHED = ("SageMaker's toolkit hands a batch to the handler's functions one request at a time; here each request "
              "goes to a worker at once, without waiting for a batch to fill")
_TORCHSERVE_ONLY = {"SAGEMAKER_TS_BATCH_SIZE": _UNBATCHED, "SAGEMAKER_TS_MAX_BATCH_DELAY": _UNBATCHED,
                    "SAGEMAKER_MODEL_SERVER_VMARGS": "the options of TorchServe's JVM; this server runs no JVM"}


def unused_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables set that this server does not read, each with why: a `SERVE_` name that is no setting
    (a misspelt one would otherwise leave the setting it meant at its default without a word), and
    SageMaker's toolkit's that only TorchServe heeds. Names only: a value may be a secret."""
    known = [f.metadata["env"] for f in fields(Settings)]
    own = [k.removeprefix("SERVE_") for k in known if k.startswith("SERVE_")]  # compared past the shared prefix
    unused = {}
    for name in sorted(environ):
        if name.startswith("SERVE_") and name not in known and not _KUBERNETES_SERVICE.fullmatch(name):
            close = difflib.get_close_matches(name.removeprefix("SERVE_"), own, 1)
            unused[name] = f"no setting has this name{f'; did you mean SERVE_{close[0]}?' if close else ''} " \
                           f"(docs/configuration.md lists them)"
        elif name in _TORCHSERVE_ONLY:
            unused[name] = _TORCHSERVE_ONLY[name]
    return unused


def configuration_table() -> str:
    """docs/configuration.md's table, from the declarations above: `python -m container.settings`
    prints it, and a test holds the page to it."""
    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for declared in fields(Settings):
        env, default, doc = (declared.metadata[key] for key in ("env", "default", "doc"))
        rows.append(f"| `{env}` | {f'`{default}`' if default else '—'} | {doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(configuration_table())
