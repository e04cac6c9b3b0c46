"""create_app(settings): the Flask app with the core wired in. Nothing runs at import."""

import functools
import logging
import os
import signal
from importlib.metadata import version as package_version

import psutil
import torch
from flask import Flask
from gevent.threadpool import ThreadPool

from container import channel, frontends, resources
from container.api import tfserving, tfserving_json
from container.api.channel_operations import channel_operations
from container.api.http_channel import FrontEndClients, http_operations
from container.api.log_and_trace import log_and_trace_routes
from container.api.metrics import metrics_routes
from container.api.openapi import openapi_routes
from container.api.pipeline import Dispatcher
from container.api.routing import Routes
from container.api.sagemaker import sagemaker_routes
from container.api.sagemaker_invoke import SINGLE_MODEL_NAME
from container.api.shared_memory import SharedMemory, shared_memory_routes
from container.api.v2 import v2_routes
from container.api.v2_generate import generate_routes
from container.api.v2_repository import repository_routes
from container.backends import WorkerOptions, load_backends, server_memory
from container.backends.gpus import Gpus
from container.backends.torch_runtime import configure_threads, free_memory, release_memory, warm_up
from container.core import Core
from container.logs import configure_logging
from container.models.cache import MemoryCache
from container.models.downloads import DownloadCache
from container.models.registry import Registry, Runtime
from container.models.response_cache import ResponseCache
from container.scheduling import scheduler_for
from container.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings, scratch: str | None = None) -> Flask:
    """`scratch`: where the model process extracts archives and writes load requests' files (default: the
    temporary directory)."""
    configure_logging(settings.log_level)
    logging.getLogger("container").info("serving", extra={"fields": {
        "mode": "multi-model" if settings.multi_model else "single-model", "model_root": settings.model_root,
        "relaxations": settings.relaxations(),
        "restricted_api": {g: r.header for r in settings.restricted_api for g in sorted(r.groups)}}})  # never a value
    configure_threads(resources.cpu_quota())
    warm_up()
    gpus = Gpus()
    idle = psutil.Process().memory_full_info()  # the process before any model: torch, the app, CUDA contexts
    backends = functools.partial(load_backends, options=worker_options(settings, gpus, channel.socket_path(os.getppid())))
    schedulers = functools.partial(scheduler_for, inline_below_ns=settings.inline_below_us * 1000,
                                   wait_limit=settings.model_server_timeout)
    front_ends = frontends.Connected(frontends.memory(settings.http_workers, settings.grpc_port is not None))
    responses = ResponseCache(settings.response_cache_size) if settings.response_cache_size else None
    runtime = Runtime(backends, release_memory, free_memory, functools.partial(own_memory, front_ends, responses))
    downloads = DownloadCache(settings.download_cache, settings.download_cache_size, ThreadPool(4))
    registry = Registry(settings.model_root, memory_cache(settings, gpus, idle.rss), runtime, settings.limits,
                        downloads=downloads, s3_roots=settings.s3_roots, scratch=scratch)
    registry.on_fault = lambda why: os.kill(os.getpid(), signal.SIGTERM)  # gunicorn drains, then starts a fresh worker
    core = Core(registry, schedulers, settings.allow_model_files, responses)
    shared_memory = SharedMemory(allowed=settings.allow_client_shm, gpus=len(gpus.devices),
                                 max_regions=settings.max_shm_regions)
    table = [
        *sagemaker_routes(core, settings),
        *v2_routes(core, shared_memory, settings.max_payload_bytes),
        *generate_routes(core, shared_memory, settings.max_payload_bytes),
        *repository_routes(core),
        *log_and_trace_routes(core, settings.log_level),
        *shared_memory_routes(shared_memory),
        *tfserving.tfserving_routes(core),
        *(metrics := metrics_routes(core, gpus, idle.uss)),
    ]
    routes = Routes([*table, *openapi_routes(package_version("container"), table)], mounts=[tfserving_json.MOUNT])
    dispatcher = Dispatcher(routes, settings.max_payload_bytes, settings.restricted_api)
    metrics_only = Dispatcher(Routes(metrics), settings.max_payload_bytes, settings.restricted_api)  # SERVE_METRICS_PORT
    # Flask is the WSGI face the design card names; every URL is served by the dispatcher behind it.
    app = Flask("container", static_folder=None)
    app.wsgi_app = dispatcher
    clients = FrontEndClients()

    def front_end_gone(pid: int) -> None:
        clients.close_all(pid)
        front_ends.disconnected(pid)

    app.extensions.update(registry=registry, core=core, dispatcher=dispatcher, metrics_dispatcher=metrics_only,
                          channel={**channel_operations(core, shared_memory, clients, settings.log_level),
                                   **http_operations(dispatcher, clients, core, shared_memory, settings.default_accept)},
                          front_end_came=front_ends.connected, front_end_gone=front_end_gone)
    return app


def worker_options(settings: Settings, gpus: Gpus, channel_path: str) -> WorkerOptions:
    """`channel_path`: the model process's channel, which python models' BLS calls reach the core by."""
    return WorkerOptions(settings.program, settings.default_accept, settings.install_requirements,
                         settings.requirements_cache, settings.requirements_cache_size, torch.get_num_threads(),
                         settings.handler_workers(len(gpus.devices)), settings.handler_max_workers(len(gpus.devices)),
                         settings.handler_idle_seconds, gpus.contexts, settings.log_level, settings.load_timeout,
                         settings.python_response_timeout, settings.handler_timeout, channel_path)


def own_memory(front_ends: frontends.Connected, responses: ResponseCache | None) -> dict[str, dict[str, int]]:
    """Part → device → what the server's own parts took after its start, no model's: the backends' (a
    runtime, the fork server), what the front-ends hold beyond what was set aside for them, and the
    responses the response cache keeps."""
    parts = {**server_memory(), "front_ends": {"cpu": front_ends.beyond_allowance()}}
    return parts if responses is None else {**parts, "response_cache": {"cpu": responses.bytes}}


def memory_cache(settings: Settings, gpus: Gpus, idle_bytes: int) -> MemoryCache:
    """Budgets for models: SERVE_MEMORY_LIMIT, never more than the container's RAM less the idle
    process, the front-end processes beside it and what the server's own parts take later (the cache's
    ceiling); on each GPU, SERVE_GPU_MEMORY_LIMIT of it less what was in use before any model."""
    beside = frontends.memory(settings.http_workers, settings.grpc_port is not None)
    limits = {"cpu": settings.memory_limit}
    for device in gpus.devices:
        limits[device] = gpus.budget(device, settings.gpu_budget(gpus.totals[device]))
    return MemoryCache(limits, evict=settings.eviction == "lru",
                       ceilings={"cpu": resources.memory_limit() - idle_bytes - beside})


def load_startup_models(app: Flask, settings: Settings) -> None:
    """Blocking: load the models the settings name. Run it in a greenlet so the server answers meanwhile."""
    core = app.extensions["core"]
    try:
        entries = startup_models(settings, core)
    except Exception:  # the names could not be listed (a root or a name gone): the server serves without them
        log.exception("the models named at start could not be listed")
        entries = []
    core.start(entries)


def startup_models(settings: Settings, core: Core) -> list[tuple[str, str]]:
    """(name, url) of the models to load at start: the one model, or those SERVE_LOAD_MODELS names."""
    if not settings.multi_model:
        return [(SINGLE_MODEL_NAME, ".")]
    if settings.load_models == ("*",):
        return core.entries()
    return [(name, core.locate(name)) for name in settings.load_models]
