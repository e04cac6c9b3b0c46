"""The core facade: all the front-ends may ask of the models, above the registry, the schedulers and
the backends. A request resolves and leases its model and version once (`lease`) and runs through that
lease (`infer`, `transform`); a request's success or failure is recorded here and nowhere else (its
executions, by the scheduler that batches them). The core makes each model's scheduler once the
registry has loaded it, and closes it once the registry has freed it. Front-ends read a `ModelView`,
never the registry's records."""

import contextlib
import functools
import itertools
import logging
import time
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable, Iterator, Mapping

import gevent
import gevent.queue
from gevent.event import Event

from container import ensembles
from container.backends.ensemble import Ensemble, Step
from container.errors import (
    Cancelled,
    Forbidden,
    InsufficientMemory,
    InvalidModel,
    InvalidRequest,
    ModelNotFound,
    QueueFull,
    ServeError,
    Unavailable,
    forget_frames,
)
from container.inference import Client, InferRequest, InferResponse, Ticket, TransformRequest
from container.models.cache import total_by_device
from container.models.config import instance_count
from container.models.downloads import DownloadCounters
from container.models.registry import Model, Registry, State, versions_of
from container.models.response_cache import ResponseCache
from container.models.signature import Signature
from container.models.statistics import Phases, Statistics
from container.scheduling import new_job, scheduler_for
from container.scheduling.base import as_done, outcome
from container.scheduling.job import Job

__all__ = ["Core", "IndexEntry", "Lease", "ModelView", "State"]
log = logging.getLogger(__name__)
_generations = itertools.count(1)


@dataclass(frozen=True)
class ModelView:
    """What a front-end reads of a ready model: made once when it starts to serve, and never changed,
    so a front-end never holds the registry's own record. `config` is Triton's ModelConfig message: read
    it, never change it."""

    name: str
    url: str
    versions: tuple[int, ...]  # served, ascending
    config: object  # None for a SageMaker handler model
    signature: Signature | None  # None for a SageMaker handler model (bytes in, bytes out)
    version_labels: Mapping[str, int]  # TF Serving's labels, from config.json's version_labels
    output_labels: Mapping[str, tuple[str, ...]]  # output → class labels
    placement: str  # why the model runs where it runs, when not where its config asks
    decoupled: bool  # it answers a request with any number of responses (its transaction policy)
    generation: int  # this load's number, never given to another: what a front-end's copy of the signature names
    caches: bool  # its config enables the response cache (`response_cache`)
    instances: int  # requests it runs at once: its execution instances, or a handler model's most workers

    @classmethod
    def of(cls, model: Model) -> "ModelView":
        config = model.config
        return cls(model.name, model.url, tuple(sorted(model.versions)), config, model.signature,
                   MappingProxyType(dict(model.version_labels)),
                   MappingProxyType({k: tuple(v) for k, v in model.output_labels.items()}), model.placement,
                   config is not None and config.model_transaction_policy.decoupled, next(_generations),
                   config is not None and config.response_cache.enable,
                   _instances(model))

    @property
    def latest(self) -> int:
        return self.versions[-1]


@dataclass(frozen=True)
class DownloadCacheState:
    """The S3 download cache as metrics read it: its bytes, budget and downloads under way, and its
    counters so far (hits, misses, downloads, bytes, seconds, evictions)."""

    used: int
    budget: int
    in_progress: int
    counters: DownloadCounters


@dataclass(frozen=True)
class IndexEntry:
    """A model of the repository, loaded or not: its versions (served, or last served), and why it is not
    ready."""

    name: str
    state: str = ""  # READY, LOADING, UNLOADING or UNAVAILABLE; none for a model never loaded
    versions: tuple[int, ...] = ()
    reason: str = ""


class Lease:
    """A model held for one request and resolved once: the model, the version the request names (the
    latest when it names none), counted with its scheduler (a batcher waits for requests on their way),
    neither evicted nor unloaded until the request ends. `with core.lease(…) as lease`. A class, not a
    generator: it is on every request's path."""

    __slots__ = ("registry", "model", "version", "client")

    def __init__(self, registry: Registry, model: Model, version: int, client: Client | None):
        self.registry, self.model, self.version, self.client = registry, model, version, client

    def __enter__(self) -> "Lease":
        self.registry.hold(self.model)
        self.model.scheduler.request_arrived(self.client)
        return self

    def __exit__(self, *exc) -> None:
        self.model.scheduler.request_left(self.client)
        self.registry.release(self.model)

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def view(self) -> ModelView:
        return self.model.view

    @property
    def takes_tensors(self) -> bool:
        """A model with a Triton signature; else a SageMaker handler model, which takes a request body."""
        return self.model.signature is not None

    @property
    def signature(self) -> Signature:
        """The tensors the model takes and gives; a handler model has none, and a tensor request to one
        is refused here, for every protocol."""
        if self.model.signature is None:
            raise InvalidRequest(f"model '{self.model.name}' is a SageMaker handler model: it takes a request body "
                                 f"(POST /models/{self.model.name}/invoke), not tensors")
        return self.model.signature


class Core:
    def __init__(self, registry: Registry, schedulers: Callable = scheduler_for, allow_model_files: bool = False,
                 response_cache: ResponseCache | None = None):
        """`schedulers`: scheduler_for with the server's options; `allow_model_files`: a load may carry the
        model's own files (SERVE_ALLOW_MODEL_FILES), which then run in the server; every front-end's load
        comes through `reload`, so the rule holds once; `response_cache`: None where the server keeps none."""
        self._registry = registry
        self.response_cache = response_cache
        self._schedulers = schedulers
        self._allow_model_files = allow_model_files
        self.limits = registry.limits
        self.model_root = registry.model_root
        self.counters = registry.counters
        self._downloads = registry.downloads
        self._dependents: dict[str, list[str]] = {}  # ensemble → the composing models its load loaded
        self.started = Event()  # set once the models named at start have loaded, or failed to
        self._awaited: set[str] = set()  # names at start whose load has not ended yet

    # -- requests ----------------------------------------------------------------------------------

    def lease(self, name: str, version: int | None = None, *, not_found: Callable[..., Exception] | None = None,
              client: Client | None = None) -> Lease:
        """The ready model `name` at `version` (None: its latest), to hold for one request. A miss raises
        `not_found(name)`, or `not_found(name, version)` for a version it does not serve: a front-end's own
        words for it (default: ModelNotFound). `client`: the connection the request came on, so that a
        batcher may wait for that client's next request."""
        model = self._registry.models.get(name)
        if model is None or model.state is not State.READY:
            raise self._miss(name, not_found)
        if version is None:
            version = max(model.versions)
        elif version not in model.versions:
            raise (not_found or _not_loaded)(name, version)
        return Lease(self._registry, model, version, client)

    def lease_loading(self, name: str, url: str, client: Client | None = None) -> Lease:
        """`lease(name)`, loading `url` as `name` first when it is not loaded (concurrent first uses share
        one load). A request that waits for a load under way is in flight from then on: the model it
        waits for is neither evicted nor unloaded before it is served (an unload sent meanwhile waits for
        it, as for any request it found in flight)."""
        model = self._registry.current(name)
        if model is None:
            self.counters.misses += 1
            model = self._load(name, url)
        else:
            self.counters.hits += 1
            if model.state is State.LOADING:  # not logged, as a load's wait is: a burst of requests may wait so
                self._registry.hold(model)
                try:
                    model.loaded.get()
                finally:
                    self._registry.release(model)  # the lease holds it again before anything yields
        return Lease(self._registry, model, max(model.versions), client)

    def leases(self, name: str, version: int | None, clients: list[Client | None], *,
               not_found: Callable[..., Exception] | None = None, loading: str | None = None) -> list[Lease]:
        """`lease` for requests to one model and version that arrived together, one from each of `clients`:
        the model resolved once; `loading`: the url loaded as `name` first when it is not loaded
        (`lease_loading`)."""
        if loading is None:
            first = self.lease(name, version, not_found=not_found, client=clients[0])
        else:
            first = self.lease_loading(name, loading, clients[0])
        return [first, *(Lease(self._registry, first.model, first.version, client) for client in clients[1:])]

    def infer(self, lease: Lease, request: InferRequest) -> InferResponse:
        """Tensors in, tensors out, through the leased model's scheduler: the inputs checked against its
        signature here, for every protocol. A request alone takes this way rather than a group of one
        (`infer_all`), whose generators cost a lone request ~6 µs of the hub's CPU (measured)."""
        start = time.perf_counter_ns()
        admitted = self._admitted(lease, request, start)
        if isinstance(admitted, InferResponse):
            return admitted
        job, key = admitted
        statistics, client = job.statistics, lease.client
        if client is not None:  # a client that hangs up cancels its job (inference.Client)
            client.under_way(job)
        try:
            result = self._runner(lease)(job)
        except Exception as exc:
            self._failed(statistics, start, exc)
            raise
        except BaseException as exc:  # the caller went away (its client did), or the process is stopping
            job.cancel()
            self._failed(statistics, start, exc)
            raise
        finally:
            _done(job, client)
        return self._succeeded(lease, job, key, start, result)

    def infer_all(self, leases: list[Lease], requests: list[InferRequest]) -> Iterator[tuple[int, object]]:
        """`infer` for requests to one model and version that arrived together, each under its own lease
        (`leases`): (position, its InferResponse or the exception it failed with), as each finishes. The
        scheduler takes them together, so a batcher sees them all at once. A request's lease must hold
        until its item is taken."""
        lease, start = leases[0], time.perf_counter_ns()
        jobs, positions, keys = [], [], []
        for position, request in enumerate(requests):
            try:
                admitted = self._admitted(lease, request, start)
            except Exception as exc:  # refused before its scheduler saw it: not a failed inference, as Triton counts
                yield position, exc
                continue
            if isinstance(admitted, InferResponse):
                yield position, admitted
                continue
            jobs.append(admitted[0])
            keys.append(admitted[1])
            positions.append(position)
        if not jobs:
            return
        clients = [leases[position].client for position in positions]
        for job, client in zip(jobs, clients, strict=True):
            if client is not None:  # a client that hangs up cancels its job (inference.Client)
                client.under_way(job)
        pending = set(range(len(jobs)))
        run = lease.model.scheduler.infer_all if not isinstance(jobs[0].backend, Ensemble) else \
            (lambda batch: as_done(self._runner(lease), batch))
        try:
            for index, result in run(jobs):
                pending.discard(index)
                _done(jobs[index], clients[index])
                if isinstance(result, Exception):
                    self._failed(jobs[index].statistics, start, result)
                    yield positions[index], result
                else:
                    yield positions[index], self._succeeded(lease, jobs[index], keys[index], start, result)
        except BaseException as exc:  # the caller went away (its client did), or the process is stopping
            for index in pending:
                jobs[index].cancel()
                self._failed(jobs[index].statistics, start, exc)
            raise
        finally:
            for index in pending:
                _done(jobs[index], clients[index])

    def _admitted(self, lease: Lease, request: InferRequest, start: int) -> tuple[Job, tuple | None] | InferResponse:
        """A request as its scheduler takes it, once its inputs pass the model's signature and the limits,
        with its response cache key and the ns its look-up took (None: the model caches none); or its
        response, when the cache holds it. Raises what refuses it."""
        model, version = lease.model, lease.version
        backend, statistics = model.versions[version], model.statistics[version]
        job = self._job(lease.signature, backend, statistics, request)
        if request.ticket is not None:
            request.ticket.when_cancelled(job.cancel)
        if not model.view.caches or self.response_cache is None:
            return job, None
        key, outputs, looked_up = self._look_up(self.response_cache, model, version, backend, request)
        if outputs is not None:
            statistics.record_cache_hit(job.items, time.perf_counter_ns() - start, looked_up)
            return InferResponse(model.name, version, outputs)
        return job, (key, looked_up)

    def _runner(self, lease: Lease) -> Callable[[Job], tuple[dict, Phases]]:
        """What runs one of the leased model's jobs: its scheduler, or an ensemble's steps."""
        backend = lease.model.versions[lease.version]
        if isinstance(backend, Ensemble):
            return functools.partial(self._run_ensemble, backend, lease.model.statistics[lease.version])
        return lease.model.scheduler.infer

    def _succeeded(self, lease: Lease, job: Job, key: tuple | None, start: int, result: tuple) -> InferResponse:
        """The (outputs, phases) of a job that succeeded, counted in its statistics (and kept in the response
        cache under `key`, when the model caches them), made its InferResponse."""
        statistics = job.statistics
        outputs, phases = result
        if key is not None:
            kept = time.perf_counter_ns()
            self.response_cache.put(key[0], outputs)
            statistics.cache_miss.add(key[1] + time.perf_counter_ns() - kept)
        statistics.record_success(job.items, time.perf_counter_ns() - start, phases)
        self._registry.remeasure(lease.model)  # while the request's lease holds the model
        return InferResponse(lease.model.name, lease.version, outputs)

    @staticmethod
    def _look_up(cache: ResponseCache, model: Model, version: int, backend, request: InferRequest):
        """(key, the cached outputs or None, ns it took) of a request to a model that caches responses;
        its parameters count for the models that read them (a python model's, an ensemble's steps)."""
        started = time.perf_counter_ns()
        reads = isinstance(backend, Ensemble) or getattr(backend, "takes_request_lists", False)
        key = cache.key(model.view.generation, version, request.inputs, request.outputs,
                        request.parameters if reads else None)
        return key, cache.get(key), time.perf_counter_ns() - started

    def _job(self, signature: Signature, backend, statistics: Statistics, request: InferRequest):
        """A request as its scheduler takes it, once its inputs pass the model's signature and the limits."""
        if not request.checked:
            signature.check(request.inputs, request.outputs, self.limits)
        items = next(iter(request.inputs.values())).shape[0] if signature.max_batch_size else 1
        return new_job(backend, statistics, request, items, signature.batching)

    def responses(self, lease: Lease, request: InferRequest):
        """`infer` as its responses, each as it is sent: (outputs, or the error it carries, or None for a
        final flag alone; final). Any model but a decoupled one sends one, final. A batch that fails as
        a whole (its worker died, say) raises after the responses sent before it."""
        if not lease.view.decoupled:
            yield self.infer(lease, request).outputs, True
            return
        statistics = lease.model.statistics[lease.version]
        sent = gevent.queue.Queue()
        place, since = 0, time.perf_counter_ns()

        def respond(outcome, final: bool) -> None:  # counted as sent, whether or not the caller is still there
            nonlocal place, since
            came = time.perf_counter_ns()
            statistics.record_response(place, outcome, came - since)
            place, since = place + 1, came
            sent.put((outcome, final))

        request.respond = respond
        running = gevent.spawn(outcome, self.infer, lease, request)  # its error is the caller's to raise, not the hub's to log
        running.link(lambda _: sent.put(None))  # after every response: infer returns once all were final
        try:
            while (item := sent.get()) is not None:
                yield item
        finally:  # the caller went away (its client did): the request is cancelled
            running.kill(block=False)
        if isinstance(ended := running.get(), Exception):
            raise ended

    def _run_ensemble(self, ensemble: Ensemble, statistics: Statistics, job: Job) -> tuple[dict, Phases]:
        """An ensemble's request through its steps: one execution of the ensemble, of the request's batch
        size, as Triton counts it (its steps count their own)."""
        outputs = ensembles.run(ensemble, job.inputs, job.outputs, functools.partial(self._infer_step, job))
        statistics.record_execution(job.items, Phases())
        return outputs, Phases()

    def _infer_step(self, job: Job, step: Step, inputs: dict) -> dict:
        """One step of an ensemble's request (`job`): a request to its model, loaded again first if it was
        evicted; none once the request is cancelled (as Triton checks between steps). It carries what the
        ensemble's request carries, as Triton's steps do: its id and its parameters (a sequence's id and
        flags, its priority and timeout, and the rest for a python model to read)."""
        if job.cancelled:
            raise Cancelled()
        try:
            lease = self.lease(step.model, step.version)
        except ModelNotFound:
            if step.version is not None or not any(name == step.model for name, _ in self.entries()):
                raise
            lease = self.lease_loading(step.model, self.locate(step.model))
        with lease:
            return self.infer(lease, InferRequest(inputs, list(step.outputs), job.parameters, request_id=job.request_id)).outputs

    def transform(self, lease: Lease, request: TransformRequest):
        """A request body through the leased SageMaker handler model; returns its backend's response."""
        [(_, result)] = self.transform_all([lease], [request])
        if not isinstance(result, Exception):
            return result
        try:
            raise result
        finally:  # the raise puts this frame in the error's traceback: holding the error, it would be a cycle
            del result

    def transform_all(self, leases: list[Lease], requests: list[TransformRequest]) -> Iterator[tuple[int, object]]:
        """`transform` for requests to one handler model that arrived together, each under its own lease:
        (position, its response or the exception it failed with), as each finishes. Its scheduler hands
        them to the model's workers together (a message to a worker for all it takes)."""
        model, version = leases[0].model, leases[0].version
        transform_all, statistics = model.versions[version].transform_all, model.statistics[version]
        tickets, clients = [Ticket() for _ in requests], [lease.client for lease in leases]
        calls = [(ticket, (r.body, r.content_type, r.accept, r.headers, r.request_id)) for ticket, r in zip(tickets, requests, strict=True)]
        for ticket, client in zip(tickets, clients, strict=True):
            if client is not None:  # a client that hangs up cancels its request (inference.Client)
                client.under_way(ticket)
        start, pending = time.perf_counter_ns(), len(calls)
        try:
            for position, outcome in model.scheduler.run_all(transform_all, calls, statistics, cancellable=tickets):
                pending -= 1
                _done(tickets[position], clients[position])
                if isinstance(outcome, Exception):
                    self._failed(statistics, start, outcome)
                    yield position, outcome
                    continue
                result, phases = outcome
                statistics.record_success(1, time.perf_counter_ns() - start, phases)
                self._registry.remeasure(model)
                yield position, result
        except BaseException as exc:  # the caller went away, or the process is stopping
            for _ in range(pending):
                self._failed(statistics, start, exc)
            raise
        finally:
            for ticket, client in zip(tickets, clients, strict=True):
                _done(ticket, client)

    def _failed(self, statistics: Statistics, start: int, exc: BaseException) -> None:
        """A request that started at `start` failed with `exc`: in its version's statistics, and in the
        counters (a 507) or as the process's fault (a sticky device error). One refused by a full queue as it
        came was never taken: no failed inference, as Triton counts it (its stats and metrics, measured)."""
        if isinstance(exc, ServeError):
            forget_frames(exc)
        if isinstance(exc, QueueFull):
            return
        statistics.record_failure(time.perf_counter_ns() - start, exc)
        self.counters.insufficient_memory += isinstance(exc, InsufficientMemory)
        self._registry.note_fault(exc)

    # -- descriptions ------------------------------------------------------------------------------

    def ready_model(self, name: str, not_found: Callable[[str], Exception] | None = None) -> ModelView:
        """The ready model `name`, to read; a miss raises `not_found(name)` (default: ModelNotFound)."""
        model = self._registry.models.get(name)
        if model is None or model.state is not State.READY:
            raise self._miss(name, not_found)
        return model.view

    def _miss(self, name: str, not_found: Callable[[str], Exception] | None) -> Exception:
        """What a request for `name`, which does not serve, is told: to retry while it is named at start
        and its load has not ended (Triton and TF Serving listen only after those loads; this server
        listens at once, for SageMaker's `/ping`), else the front-end's `not_found(name)`."""
        if name in self._awaited:
            return Unavailable(f"model '{name}' is still loading at start")
        return (not_found or _not_loaded)(name)

    def known(self, name: str) -> bool:
        """Whether `name` was ever asked for: loaded, loading, or failed to load."""
        return name in self._registry.models or name in self._registry.failures

    def state(self, name: str) -> State | None:
        model = self._registry.models.get(name)
        return model.state if model is not None else None

    def after_loading(self, name: str) -> ModelView | None:
        """The model `name` once a load or unload of it under way has ended: None when it is not loaded,
        or its load failed."""
        model = self._registry.current(name)
        try:
            return _joined(model).view if model is not None else None
        except Exception:  # the load's own answer says why
            return None

    def failure(self, name: str) -> str | None:
        """Why the last load of `name` failed, if it did."""
        return self._registry.failures.get(name)

    def ready(self) -> list[ModelView]:
        """The models ready to serve, by name."""
        return [model.view for model in self._registry.ready()]

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model of the repository and every model loaded, by name."""
        names = sorted({name for name, _ in self._registry.entries()} | set(self._registry.models))
        entries = []
        for name in names:
            model = self._registry.models.get(name)
            if model is not None and model.state is State.READY:
                entries.append(IndexEntry(name, "READY", tuple(sorted(model.versions)), model.placement))
            elif ready_only:
                continue
            elif model is not None:
                entries.append(IndexEntry(name, model.state.value, versions_of(model)))
            elif name in self._registry.last_versions:  # unloaded, evicted, or its load failed
                entries.append(IndexEntry(name, "UNAVAILABLE", self._registry.last_versions[name],
                                          self._registry.failures.get(name, "unloaded")))
            else:  # never loaded: its name alone, as Triton writes it
                entries.append(IndexEntry(name))
        return entries

    def stats(self, model: ModelView | None = None, version: int | None = None) -> list[tuple[ModelView, int, Statistics]]:
        """(model, version, statistics) of one model's versions (or one version), or of every ready model's."""
        if model is None:
            models = self._registry.ready()
        else:
            models = [record] if (record := self._record(model)) is not None else []
        return [(m.view, v, m.statistics[v]) for m in models for v in ([version] if version is not None else sorted(m.versions))]

    def memory(self) -> dict[str, tuple[int, int]]:
        """Device → (budget, bytes accounted to models)."""
        self._registry.settle()
        cache = self._registry.cache
        return {device: (budget, cache.used(device)) for device, budget in cache.budgets.items()}

    def predicted_memory(self, url: str) -> int:
        """Bytes a load of `url` (under the model root) would be charged, found without loading it."""
        return self._registry.predicted_bytes(url)

    @property
    def load_concurrency(self) -> int:
        """Loads that run at once; more wait."""
        return self._registry.load_threads

    def model_memory(self, model: ModelView) -> dict[str, int]:
        """Device → bytes accounted to `model`; an ensemble's are its composing models' (each is charged
        once, in the cache, as a model of its own)."""
        self._registry.settle()
        record = self._record(model)
        if record is None:
            return {}
        composing = {name for backend in record.versions.values() if isinstance(backend, Ensemble) for name in backend.models}
        parts = [self.model_memory(m.view) for name in composing if (m := self._registry.models.get(name)) is not None
                 and m.state is State.READY]
        return total_by_device([self._registry.cache.size_of(record), *parts])

    def version_memory(self, model: ModelView, version: int) -> dict[str, int]:
        """Device → bytes one version of `model` is charged (an ensemble's steps are charged to their own models)."""
        record = self._record(model)
        backend = record.versions.get(version) if record is not None else None
        return {} if backend is None or isinstance(backend, Ensemble) else backend.memory()

    def measured(self, model: ModelView) -> dict[str, dict[str, int]]:
        """What `model`'s accounting rests on, kind (weights, load, activations) → device → bytes, over its versions."""
        record = self._record(model)
        kinds: dict[str, list[dict[str, int]]] = {}
        for backend in record.versions.values() if record is not None else ():
            for kind, sizes in backend.measured().items():
                kinds.setdefault(kind, []).append(sizes)
        return {kind: total_by_device(sizes) for kind, sizes in kinds.items()}

    def server_memory(self) -> dict[str, dict[str, int]]:
        """Part → device → what the server's own parts took after its idle start (no model is charged it)."""
        return self._registry.runtime.server_memory()

    def held_memory(self, in_process: dict[str, int]) -> dict[str, int]:
        """Device → what the models really hold: `in_process` (this process's own measure) plus what the
        handler models' worker processes hold, which is not in this process's pages."""
        workers = [b.measured()["load"] for m in self._registry.ready() for b in m.versions.values()
                   if getattr(b, "own_process", False)]
        return total_by_device([in_process, *workers])

    def custom_metrics(self) -> list[list]:
        """The custom metric families each python model's instance reported last (`pb_utils.MetricFamily`):
        one list of (name, description, kind, [(labels, value, buckets, counts)]) per instance."""
        return [families for m in self._registry.ready() for backend in m.versions.values()
                for families in getattr(backend, "metrics", list)()]

    def download_cache(self) -> DownloadCacheState | None:
        """The S3 download cache now (None: this server has none)."""
        cache = self._downloads
        if cache is None:
            return None
        return DownloadCacheState(cache.used(), cache.budget, cache.in_progress(), replace(cache.counters))

    def queue(self, model: ModelView) -> tuple[int, int]:
        """(requests waiting in `model`'s scheduler, sequences holding state)."""
        record = self._record(model)
        if record is None:
            return 0, 0
        return record.scheduler.queue_depth(), record.scheduler.sequences_active()

    def _record(self, view: ModelView) -> Model | None:
        """The registry's record behind `view`, while it still serves."""
        model = self._registry.models.get(view.name)
        return model if model is not None and model.view is view and model.state is State.READY else None

    # -- lifecycle ---------------------------------------------------------------------------------

    def check_health(self) -> None:
        self._registry.check_health()

    def stop_loading(self, why: str) -> None:
        """The process is stopping: the loads under way end, told `why` (a 503), and so do later ones."""
        self._registry.stop_loading(why)

    def load(self, name: str, url: str, **options) -> ModelView:
        """Load `url` as `name` (the registry's options: reload, directory, uploaded) and serve it through
        a scheduler of its own, which closes once the registry has freed the model."""
        return self._load(name, url, **options).view

    def _load(self, name: str, url: str, **options) -> Model:
        model = self._registry.load(name, url, **options)
        try:
            self._compose(model)
            model.scheduler = self._schedulers(model.name, model.config, model.signature,
                                               lambda device, requested: self._registry.recover(model, device, requested),
                                               instances=_instances(model), holding=functools.partial(_holding, model))
        except BaseException as exc:  # a config the scheduler refuses (a queue policy, say)
            self._registry.abandon(model, exc)
            raise
        gevent.spawn(_close_when_gone, model, model.scheduler)
        model.view = ModelView.of(model)
        self._registry.serve(model)
        return model

    def _compose(self, model: Model) -> None:
        """An ensemble's composing models, loaded with it when they are not (and remembered, for
        `unload_dependents`); each step's tensors checked against the model its load loaded or joined, which
        a client may have unloaded since (a step's request loads it again)."""
        graphs = [backend for backend in model.versions.values() if isinstance(backend, Ensemble)]
        steps = [step for graph in graphs for step in graph.steps]
        composing, loaded = {}, []
        try:
            for name in dict.fromkeys(step.model for step in steps):
                if name == model.name:
                    raise InvalidModel(f"ensemble '{name}' names itself as a step")
                present = self._registry.current(name)
                if present is not None and present.state is State.LOADING and _composes(present):
                    raise InvalidModel(f"ensemble '{model.name}': composing model '{name}' is an ensemble whose own load "
                                       f"is under way, which may be waiting for this one (ensembles that name each other "
                                       f"never load); load it again once that load is done")
                try:
                    composing[name] = self._load_or_join(name, self.locate(name))
                except Unavailable:  # a retry may load it: the ensemble's load is told to retry too
                    raise
                except ServeError as exc:
                    raise InvalidModel(f"ensemble '{model.name}': composing model '{name}' did not load: {exc}") from None
                if present is None:  # this load loaded it
                    loaded.append(composing[name])
            for step in steps:
                _check_step(model.name, step, composing[step.model])
            for graph in graphs:
                graph.check_tensors(model.signature, {name: record.signature for name, record in composing.items()})
        except BaseException:
            for record in loaded:  # the ones this load loaded and nobody has unloaded or replaced since
                if self._registry.models.get(record.name) is record and record.state is State.READY:
                    self.unload(record.name)
            raise
        self._dependents[model.name] = [record.name for record in loaded]

    def _load_or_join(self, name: str, url: str) -> Model:
        """`name` loaded from `url`, unless it is loaded or loading already (a client's load, an ensemble's,
        the start's): then that load is waited for and its outcome shared, where a second load of the name
        would be refused."""
        present = self._registry.current(name)
        return self._load(name, url) if present is None else _joined(present)

    def reload(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> ModelView:
        """Load or reload the repository's model `name`; with `config` (Triton's JSON), from a copy of its
        directory with that config and `files` (path → content; all of its files when given any). A plain
        load of a name whose load (or reload) is under way shares that load, as Triton answers concurrent
        loads of a model with one outcome, where a second load of it would be refused; a load with a config
        or files waits for it to end, whatever its outcome, then replaces what it loaded."""
        if files:
            self._check_upload(name)
        while (under_way := self._registry.under_way(name)) is not None:
            if config is None and not files:
                return _joined(under_way).view
            with contextlib.suppress(Exception):
                _joined(under_way)
        directory = None
        if config is not None:
            try:
                directory = self._registry.override(name, config, files or {})
            except InvalidRequest as exc:  # a client's mistake: one line, in Triton's words, no traceback
                log.warning("Invalid config override", extra={"fields": {"model": name, "error": str(exc)}})
                raise
        return self.load(name, self.locate(name), reload=True, directory=directory, uploaded=bool(files))

    def _check_upload(self, name: str) -> None:
        """Model files from a client are refused unless allowed; allowed, they never take a name the model
        root serves: the operator's model stays the operator's."""
        if not self._allow_model_files:
            raise Forbidden("a load may not carry model files ('file:' parameters): they would run in the server. "
                            "Put the model under the model root, or start the server with SERVE_ALLOW_MODEL_FILES=true")
        current = self._registry.models.get(name)
        if (current is not None and not current.uploaded) or any(n == name for n, _ in self._registry.entries()):
            raise Forbidden(f"model '{name}' comes from the model root; uploaded files may not replace it")

    def unload(self, name: str, dependents: bool = False) -> None:
        """Unload `name`; with `dependents`, the models an ensemble's load loaded along with it too. A load
        or unload of it under way is waited for first: an unload sent while the model loads (a client that
        gave up waiting for the load) must not leave it loaded once that load ends."""
        self.after_loading(name)
        self._registry.unload(name)
        for composing in self._dependents.pop(name, []) if dependents else ():
            if self.state(composing) is State.READY:
                self.unload(composing, dependents=True)

    def locate(self, name: str) -> str:
        return self._registry.locate(name)

    def entries(self) -> list[tuple[str, str]]:
        return self._registry.entries()

    def from_root(self) -> dict[str, str]:
        """Name → url of the ready models loaded as the model root holds them (no client's config or files)."""
        return {model.name: model.url for model in self._registry.ready() if not model.overridden}

    def start(self, entries: list[tuple[str, str]]) -> None:
        """Load the models named at start, (name, url) pairs, one after another, then set `started`; a
        failure is logged and the rest still load. Until its load ends, a request for one of them is told
        to retry (`_miss`). A model loaded already (by an ensemble's load, say) is left as it is, and one
        loading (a client's load) is waited for."""
        self._awaited.update(name for name, _ in entries)
        try:
            for name, url in entries:
                if self._registry.stopping is not None:  # the rest would be refused, each an error in the log
                    break
                try:
                    self._load_or_join(name, url)
                except ServeError as exc:
                    log.error("model did not load", extra={"fields": {"model": name, "error": str(exc)}})
                except Exception as exc:  # a server bug, or the system failing: the other models still load
                    log.exception("model did not load", extra={"fields": {"model": name, "error": repr(exc)}})
                finally:
                    self._awaited.discard(name)
        finally:
            self._awaited.clear()
            self.started.set()

    def model_is_current(self, model: ModelView) -> bool:
        """Whether `model` still serves its name (not replaced, evicted or unloaded)."""
        return self._record(model) is not None


def _instances(model: Model) -> int:
    """Requests a model runs at once: its config's execution instances, or a handler model's (it has no
    config) worker processes."""
    if model.config is not None:
        return instance_count(model.config)
    return max(getattr(backend, "instances", 1) for backend in model.versions.values())


def _holding(model: Model, sequences: int) -> None:
    """What `model`'s sequence batcher says it holds: the cache does not evict a model holding a sequence's state."""
    model.sequences = sequences


def _composes(model: Model) -> bool:
    """Whether `model` is an ensemble: its load waits for its steps' loads, so a step's load must not wait for it."""
    return any(isinstance(backend, Ensemble) for backend in model.versions.values())


def _joined(model: Model) -> Model:
    """`model` once its load is done (now, when it is), or that load's error, for a load that shares it."""
    if model.state is State.LOADING:
        log.info("waiting for the load under way", extra={"fields": {"model": model.name}})
    return model.loaded.get()


def _close_when_gone(model: Model, scheduler) -> None:
    """Once the registry has freed `model` (unloaded, evicted, replaced or abandoned), its scheduler's
    threads end."""
    model.gone.wait()
    scheduler.close()


def _check_step(ensemble: str, step: Step, model: Model) -> None:
    if model.signature is None:
        raise InvalidModel(f"ensemble '{ensemble}': step model '{step.model}' is a SageMaker handler model, which "
                           f"takes a request body, not tensors")
    if step.version is not None and step.version not in model.versions:
        raise InvalidModel(f"ensemble '{ensemble}': step model '{step.model}' has no version {step.version}")
    for kind, names, specs in (("input", step.inputs, model.signature.inputs), ("output", step.outputs, model.signature.outputs)):
        unknown = sorted(set(names) - {spec.name for spec in specs})
        if unknown:
            raise InvalidModel(f"ensemble '{ensemble}': step model '{step.model}' has no {kind}(s) {unknown}; it has "
                               f"{[spec.name for spec in specs]}")


def _not_loaded(name: str, version: int | None = None) -> ModelNotFound:
    if version is not None:
        return ModelNotFound(f"model '{name}' has no version {version}")
    return ModelNotFound(f"model '{name}' is not loaded")


def _done(job: Job | Ticket, client: Client | None) -> None:
    job.settled()
    if client is not None:
        client.done(job)
