"""Which models exist and in what state; loading, reloading, unloading, eviction and the requests in
flight, with their statistics.

All state changes happen on the event loop (greenlets), without yielding between a check and its
update, so no lock is needed; the blocking parts (extraction, loading, freeing) run on a thread pool.
"""

import enum
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gevent
from gevent.event import AsyncResult, Event
from gevent.threadpool import ThreadPool

from container.errors import (
    DeviceFault,
    Forbidden,
    InsufficientMemory,
    InvalidModel,
    InvalidRequest,
    ModelConflict,
    ModelNotFound,
    ServeError,
    Unavailable,
)
from container.limits import Limits
from container.models.cache import MemoryCache, total_by_device
from container.models.config import instance_count
from container.models.downloads import DownloadCache
from container.models.overrides import build_override
from container.models.recovery import execute
from container.models.s3 import S3Url, is_s3
from container.models.signature import Signature
from container.models.source import ModelSource, TritonLayout, locate, open_source, repository_entries, resolve_url
from container.models.statistics import Statistics

log = logging.getLogger(__name__)
# A model's first requests are charged again afterwards: backends measure the activation peak of their
# first executions (backends/footprint.py), so what a model costs settles only then.
_REMEASURED_REQUESTS = 8


class State(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"


# Why a load of a name that is taken is refused, and what the caller can do about it
_CONFLICT = {State.LOADING: "still loading; its load answers once it is done",
             State.READY: "already loaded; DELETE /models/{name} first to replace it"}  # an unload under way is waited for


@dataclass(eq=False)
class Model:
    name: str
    url: str
    state: State = State.LOADING
    source: ModelSource | None = None
    versions: dict = field(default_factory=dict)  # version → backend object
    pools: list = field(default_factory=list)  # its backends that are handler worker pools (grow, shed, resize)
    config: object = None  # the Triton ModelConfig; None for SageMaker handler models
    signature: Signature | None = None  # None for SageMaker handler models (bytes in, bytes out)
    version_labels: dict[str, int] = field(default_factory=dict)  # from config.json's version_labels
    output_labels: dict[str, list[str]] = field(default_factory=dict)  # output → class labels
    statistics: dict[int, Statistics] = field(default_factory=dict)  # version → its statistics
    scheduler: object = None  # the core's: made once the model loads, closed once it is gone
    view: object = None  # the core's read-only description of it (core.ModelView), made as it starts to serve
    in_flight: int = 0
    sequences: int = 0  # sequences holding state in its scheduler: their clients' state, lost if it were evicted
    idle: Event = field(default_factory=Event)
    loaded: AsyncResult = field(default_factory=AsyncResult)
    gone: Event = field(default_factory=Event)  # set once an unloaded or evicted model is freed
    placement: str = ""  # why the model runs where it runs, when not where its config asks
    remeasures: int = _REMEASURED_REQUESTS  # requests left after which its memory is charged again
    measuring: Event | None = None  # while its memory is measured again (Registry.remeasure); set when done
    download: object = None  # its hold on the download cache entry it loaded from (an S3 model)
    uploaded: bool = False  # built from a client's files, not from the model root
    overridden: bool = False  # loaded with a client's config or files, not as the model root holds it
    replaces: "Model | None" = None  # while a reload loads: the copy serving the name meanwhile
    started: float = 0.0  # when its load started (monotonic)
    loader: object = None  # the greenlet its load runs in, until it is served or abandoned

    def __str__(self) -> str:
        return self.name

    def version(self, version: int | None = None) -> int:
        """The version a request names, or the latest served one."""
        if version is None:
            return max(self.versions)
        if version not in self.versions:
            raise ModelNotFound(f"model '{self.name}' has no version {version}; it serves {sorted(self.versions)}")
        return version


@dataclass(frozen=True)
class Runtime:
    """The framework pieces the registry drives, injected so `models/` imports no backend."""

    load_backends: Callable[[str, ModelSource, str], dict]  # (name, source, device) → {version: backend}
    release_memory: Callable[[], None]
    free_memory: Callable[[str], int]  # device → bytes free on it now
    server_memory: Callable[[], dict[str, dict[str, int]]]  # part → device → bytes the server took since its start


@dataclass
class Counters:
    """Cumulative lifecycle events, for metrics."""

    loads: int = 0
    load_failures: int = 0
    load_seconds: float = 0.0
    evictions: int = 0
    hits: int = 0  # /invocations found its target model loaded
    misses: int = 0  # … or had to load it
    insufficient_memory: int = 0  # 507s: a load or execution that did not fit
    recoveries: int = 0  # device out-of-memory errors recovered from by freeing room


class Registry:
    def __init__(self, model_root: str, cache: MemoryCache, runtime: Runtime, limits: Limits | None = None,
                 load_threads: int = 4, downloads: DownloadCache | None = None, s3_roots: tuple[str, ...] = (),
                 scratch: str | None = None):
        self.model_root = model_root
        self.scratch = scratch  # where archives are extracted and overrides written (None: the temporary directory)
        self.s3_roots = s3_roots  # each ends with '/'; absolute s3:// urls must fall under one
        self.downloads = downloads
        self.limits = limits or Limits()
        self.cache = cache
        self.runtime = runtime
        self.models: dict[str, Model] = {}
        self.failures: dict[str, str] = {}  # name → why its last load failed
        self.last_versions: dict[str, tuple[int, ...]] = {}  # name → what it served (or was to) until it went
        self.counters = Counters()
        self._loading: dict[str, Model] = {}  # name → the model its load under way loads (a first load or a reload)
        self._measured: dict[str, dict[str, int]] = {}  # path → sizes of its last load: the best estimate
        self.fault: str | None = None  # a sticky device error: this process can no longer serve
        self.on_fault: Callable[[str], None] = lambda why: None  # the server replaces the process
        self.stopping: str | None = None  # why loads end: the process is stopping (`stop_loading`)
        self.load_threads = load_threads  # loads that run at once; more wait for a thread
        self._pool = ThreadPool(load_threads)

    # -- lifecycle ---------------------------------------------------------------------------------

    def load(self, name: str, url: str, *, reload: bool = False, directory: Path | None = None,
             uploaded: bool = False) -> Model:
        """Load `url` (or `directory`, which then belongs to the registry, and is removed whatever
        happens) as `name`, its memory reserved; returns it still LOADING: `serve(model)` makes it
        ready, `abandon(model, exc)` drops it. A loaded name is a 409 unless `reload`: then the old
        model serves until the new one is served, and a failed reload leaves it serving."""
        try:
            return self._load_named(name, url, reload, directory, uploaded)
        except BaseException:
            if directory is not None:
                self._pool.apply(shutil.rmtree, (directory, True))
            raise

    def _load_named(self, name: str, url: str, reload: bool, directory: Path | None, uploaded: bool) -> Model:
        current = self.current(name)  # after an unload of the name: the stop may have come meanwhile
        if self.stopping is not None:
            raise Unavailable(self.stopping)
        remote = directory is None and self._remote(url)
        path = directory or (None if remote else resolve_url(self.model_root, url))
        if current is not None and not (reload and current.state is State.READY and name not in self._loading):
            state = State.LOADING if name in self._loading else current.state
            raise ModelConflict(f"model '{name}' is " + _CONFLICT[state].format(name=name))
        model = Model(name, url, uploaded=uploaded, overridden=directory is not None, replaces=current)
        if current is None:
            self.models[name] = model  # visible as loading: a concurrent load of the name is a 409
        self._loading[name] = model
        model.started, model.loader = time.monotonic(), gevent.getcurrent()
        try:
            if remote:
                model.download = self.downloads.fetch(remote)
                path = model.download.path
            self._load(model, path, owned=directory is not None)
        except BaseException as exc:
            self.abandon(model, exc)
            raise
        return model

    def serve(self, model: Model) -> None:
        """The loaded `model` serves its name from now; the copy a reload replaces retires."""
        name, current = model.name, model.replaces
        refused = self._refusal(model)
        if refused is not None:
            self.abandon(model, refused)
            raise refused
        self._loading.pop(name, None)
        model.loader = None
        self.counters.load_seconds += time.monotonic() - model.started
        self.failures.pop(name, None)
        self.counters.loads += 1
        model.state, model.replaces = State.READY, None
        self.models[name] = model
        model.loaded.set(model)
        self._allow_growth()
        log.info("loaded model", extra={"fields": {"model": name, "url": model.url, "bytes": self.cache.size_of(model),
                                                   "seconds": round(time.monotonic() - model.started, 3)}})
        if current is not None:
            self._retire(current)

    def _refusal(self, model: Model) -> ServeError | None:
        """Why a load that has ended may not serve: the stop came as it ended, before its greenlet was told
        (it would serve nobody), or the copy a reload was to replace was unloaded meanwhile."""
        if self.stopping is not None:
            return Unavailable(self.stopping)
        if model.replaces is not None and self.models.get(model.name) is not model.replaces:
            return ModelConflict(f"model '{model.name}' was unloaded while it reloaded")
        return None

    def abandon(self, model: Model, exc: BaseException) -> None:
        """A load that failed with `exc`: recorded as the name's failure, and what it held freed."""
        self.note_fault(exc)
        self._loading.pop(model.name, None)
        model.loader = None
        self.counters.load_seconds += time.monotonic() - model.started
        self.failures[model.name] = str(exc)
        self.counters.load_failures += 1
        self.counters.insufficient_memory += isinstance(exc, InsufficientMemory)
        model.replaces = None
        self._discard(model)
        model.loaded.set_exception(exc)

    def stop_loading(self, why: str) -> None:
        """The process is about to exit: each load under way ends now, its callers (and those that share it)
        told `why` as a 503, and a load that comes later is refused so. A load left to finish would hold the
        stop as long as it took, past the few seconds a platform allows a stop, and then serve nobody. Its
        thread runs on, as nothing can end it, and goes with the process; what runs on the load threads
        from now (freeing what an ended load held, an index of an S3 root) runs on fresh ones, as the old
        ones may all be stuck in those loads."""
        self.stopping = why
        if self._loading:
            self._pool = ThreadPool(self.load_threads)
            log.info("stopping: the loads under way end", extra={"fields": {"models": sorted(self._loading)}})
        for loader in {model.loader for model in self._loading.values()}:  # one for an ensemble's and its steps' loads
            gevent.get_hub().loop.run_callback(self._end_loads_of, loader, why)

    def _end_loads_of(self, loader, why: str) -> None:
        if any(model.loader is loader for model in self._loading.values()):  # not served or abandoned meanwhile
            loader.throw(Unavailable(why))

    def under_way(self, name: str) -> Model | None:
        """The model a load of `name` under way loads (its first load, or a reload beside the copy serving)."""
        return self._loading.get(name)

    def current(self, name: str) -> Model | None:
        """The model under `name` once any unload or eviction of it has finished: a load racing one
        waits for it instead of answering 409."""
        model = self.models.get(name)
        while model is not None and model.state is State.UNLOADING:
            model.gone.wait()
            model = self.models.get(name)
        return model

    def unload(self, name: str) -> None:
        """Refuse new requests, let the ones in flight finish, then free the memory before returning."""
        model = self.models.get(name)
        if model is None or model.state is not State.READY:
            raise ModelNotFound(f"model '{name}' is not loaded")
        started, sizes = time.monotonic(), self.cache.size_of(model)
        self._retire(model)
        log.info("unloaded model", extra={"fields": {"model": name, "bytes": sizes, "seconds": round(time.monotonic() - started, 3)}})

    def entries(self) -> list[tuple[str, str]]:
        """(name, url) of every model in the repository under the model root."""
        if is_s3(self.model_root):
            return self._pool.apply(self.downloads.s3.entries, (S3Url.parse(self.model_root),))
        return repository_entries(self.model_root)

    def override(self, name: str, config: str, files: dict[str, bytes]) -> Path:
        """A scratch copy of the repository's model `name` with `config` (Triton's JSON) as its config, or
        a directory of `files` alone when given any; `load(directory=…)` takes it over."""
        if not files and is_s3(self.model_root):
            raise InvalidRequest("a config override of a model in S3 needs the model's files as 'file:' parameters")
        base = None if files else resolve_url(self.model_root, self.locate(name))
        return self._pool.apply(build_override, (config, files, base, self.scratch))

    def predicted_bytes(self, url: str) -> int:
        """What a load of `url` would be charged, found at once: its last load's measure, else the size
        of its files (never less than its weights)."""
        path = resolve_url(self.model_root, url)
        if measured := self._measured.get(str(path)):
            return sum(measured.values())
        files = (f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        return sum(f.stat().st_size for f in files)

    def locate(self, name: str) -> str:
        """The url of the repository entry `name` (an S3 root finds its archive when it fetches it)."""
        return name if is_s3(self.model_root) else locate(self.model_root, name)

    def _remote(self, url: str) -> str | None:
        """The S3 url a load url stands for, absolute (under an allowed S3 root) or under an S3 model
        root; None for a local one."""
        if is_s3(url):
            parsed = str(S3Url.parse(url))
            if not any(parsed.startswith(root) and parsed != root for root in self.s3_roots):
                raise Forbidden(f"url {url[:200]!r} is not under an S3 root this server may read (SERVE_S3_ROOTS)")
            return parsed
        if is_s3(self.model_root):
            return str(S3Url.parse(self.model_root).child(url))
        return None

    def ready(self) -> list[Model]:
        return sorted((m for m in self.models.values() if m.state is State.READY), key=lambda m: m.name)

    # -- requests ----------------------------------------------------------------------------------

    def hold(self, model: Model) -> None:
        """Hold a ready model for one request: it is neither evicted nor unloaded until `release(model)`."""
        model.in_flight += 1
        model.idle.clear()
        self.cache.touch(model)

    def release(self, model: Model) -> None:
        model.in_flight -= 1
        if not model.in_flight:
            model.idle.set()

    def check_health(self) -> None:
        """Raise Unavailable once a sticky device error has made this process unable to serve."""
        if self.fault is not None:
            raise Unavailable(f"{self.fault}; the server is restarting its worker")

    def note_fault(self, exc: BaseException) -> None:
        if isinstance(exc, DeviceFault) and self.fault is None:
            self.fault = str(exc)
            log.error("sticky device error: restarting the worker process", extra={"fields": {"error": self.fault}})
            self.on_fault(self.fault)

    # -- internals ---------------------------------------------------------------------------------

    def _load(self, model: Model, path: Path, owned: bool) -> None:
        self.settle()  # a model being measured is held: once measured, it may be idle, and evicted to make room
        model.source = source = self._pool.apply(open_source, (path, self.limits, self.scratch))
        if owned:
            source.scratch = path
        config = source.layout.config if isinstance(source.layout, TritonLayout) else None
        running = sum(instance_count(m.config) if m.config is not None else 1 for m in self.models.values() if m is not model)
        self.limits.check_total_instances(running, instance_count(config) if config is not None else 1)
        device, model.placement = place(config, self.cache)
        if model.placement:
            log.warning("model placed on CPU", extra={"fields": {"model": model.name, "reason": model.placement}})
        self._make_room(model, self._measured.get(str(path)) or {device: source.estimated_bytes()})
        [(_, backends, ok)] = execute(lambda _: self._pool.apply(self.runtime.load_backends, (model.name, source, device)),
                                      [model], lambda device, requested: self.recover(model, device, requested),
                                      divisible=False)
        if not ok:
            raise backends
        model.versions = backends
        model.pools = [backend for backend in backends.values() if hasattr(backend, "shed")]
        measured = self._pool.apply(_memory, (list(backends.values()),)) or {device: source.estimated_bytes()}
        self._make_room(model, measured)
        self._measured[str(path)] = measured
        if isinstance(source.layout, TritonLayout):
            model.config = source.layout.config
            model.signature = source.layout.signature
            model.version_labels = source.layout.labels
            model.output_labels = source.layout.output_labels
        model.statistics = {version: Statistics() for version in backends}

    def remeasure(self, model: Model) -> None:
        """While the model's cost settles, or after its worker pool grew or shrank, charge what its
        backends measure now, in a greenlet of its own that holds the model (an unload waits for it, so
        a model is never measured after it was freed): the request that asked is answered meanwhile. A
        handler model's workers are measured through /proc, ~5 ms that the first eight requests after each
        load paid before. Called under a request's lease; one measurement of a model at a time."""
        resized = any(pool.resized for pool in model.pools)  # per request: no backend but a pool is looked at
        if (model.remeasures <= 0 and not resized) or model.state is not State.READY or model.measuring is not None:
            return
        model.remeasures = max(model.remeasures - 1, 0)
        model.measuring = Event()
        self.hold(model)
        gevent.spawn(self._measure_held, model)

    def _measure_held(self, model: Model) -> None:
        try:
            # on a thread, the hub's (not the loads', which may be busy for seconds): the hub must not wait for /proc
            sizes = gevent.get_hub().threadpool.apply(_memory, (list(model.versions.values()),))
            if sizes == self.cache.size_of(model):
                return
            try:
                self._make_room(model, sizes)
            except InsufficientMemory as exc:
                self.cache.charge(model, sizes)
                log.warning("model is over the memory budget", extra={"fields": {"model": model.name, "error": str(exc)}})
        except Exception:  # noqa: BLE001 — no request to fail: its charge stays as it was
            log.exception("measuring a model's memory failed", extra={"fields": {"model": model.name}})
        finally:
            measuring, model.measuring = model.measuring, None
            measuring.set()
            self.release(model)

    def settle(self) -> None:
        """Wait for the measurements under way (milliseconds each): what the cache charges is then what
        the requests answered so far have measured."""
        for model in list(self.models.values()):
            if model.measuring is not None:
                model.measuring.wait()

    def _retire(self, model: Model) -> None:
        """Refuse the model's new requests, wait for those in flight, then free it."""
        model.state = State.UNLOADING
        while model.in_flight:
            model.idle.wait()
        self._discard(model)

    def _make_room(self, model: Model, sizes: dict[str, int]) -> None:
        """Charge `sizes` to `model`: idle extra workers of handler pools end first where the budget
        lacks room, then idle models are evicted, least recently used first. The pools then learn how
        many more workers the room left allows."""
        self.cache.server_holds(total_by_device(self.runtime.server_memory().values()))
        if not self.cache.fits(model, sizes):
            sizes = self._shed_extra_workers(model, sizes)
        victims = self.cache.reserve(model, sizes, idle=self._evictable)
        self._evict(victims, f"to make room for '{model.name}'")
        self._allow_growth()

    def _shed_extra_workers(self, model: Model, sizes: dict[str, int]) -> dict[str, int]:
        """Ends the idle workers beyond their pool's least, each pool charged again; returns `model`'s
        own sizes, measured again if its pool shed some."""
        for pool_model in [m for m in self.ready() if m.pools]:
            if sum(self._pool.apply(pool.shed) for pool in pool_model.pools):
                measured = self._pool.apply(_memory, (list(pool_model.versions.values()),))
                if pool_model is model:
                    sizes = measured
                else:
                    self.cache.charge(pool_model, measured)
        return sizes

    def _allow_growth(self) -> None:
        """Tell each handler pool how many more workers the budget's room holds now, at what one of its
        workers costs."""
        room = {device: budget - self.cache.used(device) for device, budget in self.cache.budgets.items()}
        for model in self.ready():
            for pool in model.pools:
                each = {d: n // max(pool.workers, 1) for d, n in self.cache.size_of(model).items() if n}
                pool.allow(min((room[d] // n for d, n in each.items() if d in room), default=pool.instances))

    def recover(self, model: Model, device: str, requested: int) -> None:
        """After `model` ran out of memory on `device` asking for `requested` bytes: drop cached blocks,
        then evict idle models, least recently used first, until the allocation fits both what the
        device has free and the budget's room (every idle model when the size is unknown). An allocation
        that evicting every idle model could not satisfy evicts none: one hostile request must not
        empty the cache."""
        self.counters.recoveries += 1
        self.settle()
        self._pool.apply(self.runtime.release_memory)
        room = min(self._pool.apply(self.runtime.free_memory, (device,)),
                   self.cache.budgets.get(device, 0) - self.cache.used(device))
        need = requested - room if requested else float("inf")
        idle = self.cache.idle_on(device, self._evictable, keep=model)
        victims = {}
        if requested == 0 or need <= sum(sizes[device] for sizes in idle.values()):
            for victim, sizes in idle.items():
                if need <= 0:
                    break
                victims[victim] = sizes
                need -= sizes[device]
        log.warning("device out of memory", extra={"fields": {
            "model": model.name, "device": device, "requested": requested, "evicting": [v.name for v in victims]}})
        if victims:
            self._evict(victims, f"after {device} ran out of memory")
            self._pool.apply(self.runtime.release_memory)

    def _evict(self, victims: dict[Model, dict[str, int]], why: str) -> None:
        """Free the victims (each with the sizes it held). Every one is marked before the first
        yield: none may be leased while another is being freed."""
        for model in victims:
            model.state = State.UNLOADING
        for model, sizes in victims.items():
            started = time.monotonic()
            self.counters.evictions += 1
            self._discard(model)
            log.info("evicted idle model", extra={"fields": {"model": model.name, "why": why, "bytes": sizes,
                                                             "seconds": round(time.monotonic() - started, 3)}})

    def _discard(self, model: Model) -> None:
        """Forget the model and free what it holds; safe on a half-loaded model."""
        if self.models.get(model.name) is model:  # the name's own: unloaded, evicted, or its first load failed
            del self.models[model.name]
            self.last_versions[model.name] = versions_of(model)
        self.cache.release(model)
        backends, model.versions = list(model.versions.values()), {}
        try:
            self._pool.apply(_close, (backends, model.source, self.runtime.release_memory))
        finally:
            if model.download is not None:
                model.download.release()
            model.gone.set()

    def _evictable(self, model: Model) -> bool:
        """Idle, holding no sequence's state, and not the serving copy of a model being reloaded: a reload never
        evicts what it replaces. A live sequence ends within its model's max_sequence_idle_microseconds."""
        return (model.state is State.READY and not model.in_flight and not model.sequences
                and model.name not in self._loading)

def place(config, cache: MemoryCache) -> tuple[str, str]:
    """The device to load a model on — the GPU with the most room among those its instance groups
    allow (`config`: its Triton config, None for handler models) — and, when the config asks for GPUs
    this server lacks, why the model runs on CPU instead."""
    gpus = [d for d in cache.budgets if d.startswith("cuda")]
    groups = config.instance_group if config is not None else []
    kinds = {group.kind for group in groups}
    if kinds == {2}:  # KIND_CPU
        return "cpu", ""
    named = sorted({f"cuda:{index}" for group in groups for index in group.gpus})
    if not gpus:
        if 1 in kinds or named:  # KIND_GPU
            return "cpu", f"instance_group asks for GPU(s) {named or 'of any kind'}; this server has no GPU, so the model runs on CPU"
        return "cpu", ""
    absent = [d for d in named if d not in gpus]
    if absent:
        raise InvalidModel(f"instance_group names {absent}; this server has {gpus}")
    return max(named or gpus, key=lambda d: cache.budgets[d] - cache.used(d)), ""


def versions_of(model: Model) -> tuple[int, ...]:
    """The versions `model` serves; before it serves, those its layout names (none for a handler model,
    or for files that could not be read)."""
    if model.versions:
        return tuple(sorted(model.versions))
    layout = model.source.layout if model.source is not None else None
    return tuple(sorted(layout.versions)) if isinstance(layout, TritonLayout) else ()


def _memory(backends: list) -> dict[str, int]:
    return total_by_device(b.memory() for b in backends)


def _close(backends: list, source: ModelSource | None, release_memory: Callable[[], None]) -> None:
    for backend in backends:
        backend.close()
    del backends[:]
    if source is not None:
        source.remove_scratch()
    release_memory()


