"""V2's operations on its documents, protocol-free: what `/v2/…` over HTTP (v2.py, v2_repository.py)
and Triton's GRPCInferenceService (a front-end process, over the channel) both answer. A request here
is V2's JSON-shaped document (decoded from JSON, or built from protobuf) with its binary tensor data;
the answers are documents too, and each protocol writes them its own way."""

import contextlib
from importlib.metadata import version as package_version
from typing import Iterator

from container import errors
from container.api import offload
from container.api.leased import serve_leased, serve_one
from container.core import Core, ModelView, State
from container.errors import InvalidRequest, ModelNotFound, Unavailable, Unsupported
from container.inference import Client, InferResponse, Ticket
from container.limits import check_name, whole_number
from container.models.statistics import Duration, Statistics
from container.v2 import codec, documents

EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
    "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
    "statistics", "logging",
]
PLATFORMS = {"pytorch": "pytorch_libtorch", "python": "python"}


def server_metadata() -> dict:
    return {"name": "container", "version": package_version("container"), "extensions": EXTENSIONS}


def check_ready(core: Core) -> None:
    """The server is ready once the models named at start have loaded."""
    core.check_health()
    if not core.started.is_set():
        raise Unavailable("the models named at start are still loading")


def check_model_ready(core: Core, name: str, version: str | None) -> None:
    model(core, name, version)


def model_metadata(core: Core, name: str, version: str | None) -> dict:
    view, number = model(core, name, version, default_latest=False)
    versions = [number] if number is not None else sorted(view.versions)
    document = {"name": view.name, "versions": [str(v) for v in versions],
                "platform": platform(view), "inputs": [], "outputs": []}
    if view.signature is not None:
        document["inputs"] = [codec.tensor_metadata(s) for s in view.signature.inputs]
        document["outputs"] = [codec.tensor_metadata(s) for s in view.signature.outputs]
    return document


def model_config(core: Core, name: str, version: str | None):
    """The model's ModelConfig message as Triton serves it, normalised at load (read it, never change it)."""
    view, _ = model(core, name, version)
    if view.config is None:
        raise InvalidRequest(f"model '{view.name}' is a SageMaker handler model; it has no Triton config")
    return view.config


def statistics(core: Core, name: str | None = None, version: str | None = None) -> dict:
    selected = core.stats(*model(core, name, version, default_latest=False)) if name is not None else core.stats()
    return {"model_stats": [_model_statistics(m, v, s, core.version_memory(m, v)) for m, v, s in selected]}


# Triton's words and status (501, gRPC's UNIMPLEMENTED: measured on tritonserver 2.51)
HTTP_DECOUPLED = "HTTP end point doesn't support models with decoupled transaction policy"
GRPC_DECOUPLED = "ModelInfer RPC doesn't support models with decoupled transaction policy"


def infer(core: Core, shared_memory, name: str, version: str | None, parse, client: Client | None = None,
          heavy: bool = False, decoupled: str = HTTP_DECOUPLED) -> tuple[dict, list[bytes]]:
    """One inference: `parse(signature)` gives the request's document and binary data once the model is
    leased (a raw binary request takes its shape from the signature); `heavy`: decode and encode on a
    thread, off the hub (a large request, or one that reads shared memory). Returns the answer's document and
    the binary data of its outputs sent as binary, in order. `decoupled`: the refusal a decoupled model's
    request gets, in the words of the transport's Triton endpoint."""
    lease = _lease(core, name, version, client)
    _check_coupled(lease, decoupled)
    return serve_one(lease, document_request(core, shared_memory, parse, heavy), core.infer)


def infer_group(core: Core, name: str, version: str | None, requests: list[tuple],
                decoupled: str = HTTP_DECOUPLED) -> Iterator[tuple[int, object]]:
    """Inferences of one model and version that arrived together, each (decode, client): the model leased
    once for them all, each request's `decode(lease)` → (InferRequest, finish), and their inferences handed
    to its scheduler together (leased.py). Yields (position, `finish(response)` or the exception it failed
    with) for each, as each is done; one request's failure is its own."""
    try:
        leases = _leases(core, name, version, [client for _, client in requests])
        _check_coupled(leases[0], decoupled)
    except Exception as exc:  # the model, or the version, is not there: each request is told
        yield from ((position, exc) for position in range(len(requests)))
        return
    yield from serve_leased(leases, [decode for decode, _ in requests], core.infer_all)


def document_request(core: Core, shared_memory, parse, heavy: bool, ticket: Ticket | None = None):
    """`decode` for infer_group: a request's document and binary data (`parse(signature)`), decoded here,
    and `finish(response)`: the answer's document and binary chunks; `ticket`: the request's own
    cancellation (InferRequest.ticket)."""

    def decode(lease):
        signature, view = lease.signature, lease.view
        document, binary = parse(signature)
        on_thread = heavy or documents.reads_much_shared_memory(document)
        request, requested = offload.run(on_thread, documents.decode_request, document, binary, signature, shared_memory,
                                         core.limits, lease.name)
        request.ticket = ticket

        def finish(response: InferResponse) -> tuple[dict, list[bytes]]:
            return offload.run(heavy or documents.heavy_outputs(response.outputs), documents.answer, document, request,
                               response.model_name, response.model_version, response.outputs, requested, signature,
                               view.output_labels, shared_memory)

        return request, finish

    return decode


def infer_stream(core: Core, shared_memory, name: str, version: str | None, parse, heavy: bool = False):
    """`infer` as a stream (gRPC's ModelStreamInfer): items (answer, binary chunks, final, error).
    A decoupled model's responses come each as it sends it (a final flag without a response is an item
    with no answer); any other model's one answer is one final item."""
    with _lease(core, name, version) as lease:
        request, finish = document_request(core, shared_memory, parse, heavy)(lease)
        for outcome, final in core.responses(lease, request):
            if isinstance(outcome, Exception):
                yield None, [], final, outcome
            elif outcome is None:
                yield None, [], final, None
            else:
                yield *finish(InferResponse(lease.name, lease.version, outcome)), final, None


def _check_coupled(lease, decoupled: str) -> None:
    if lease.view.decoupled:
        raise Unsupported(decoupled)


def _lease(core: Core, name: str, version: str | None, client: Client | None = None):
    return core.lease(name, _version(version), not_found=lambda _, *v: _unknown(core, name, *v), client=client)


def _leases(core: Core, name: str, version: str | None, clients: list[Client | None]):
    return core.leases(name, _version(version), clients, not_found=lambda _, *v: _unknown(core, name, *v))


def repository_index(core: Core, ready_only) -> list[dict]:
    if not isinstance(ready_only, bool):
        raise InvalidRequest("'ready' must be true or false")
    entries = []
    for entry in core.index(ready_only):
        # as Triton writes them: an entry a version, none for a model never loaded, no empty state or reason
        said = {key: value for key, value in (("state", entry.state), ("reason", entry.reason)) if value}
        entries += [{"name": entry.name, **({"version": str(v)} if v is not None else {}), **said}
                    for v in entry.versions or (None,)]
    return entries


def load(core: Core, name: str, parameters: dict) -> None:
    """Load or reload `name`; `parameters`: `config` (the model's config as JSON) and `file:<path>`
    (each file's bytes), as Triton takes them."""
    check_name(name)
    config = parameters.get("config")
    files = {key[len("file:"):]: value for key, value in parameters.items() if key.startswith("file:")}
    if config is not None and not isinstance(config, str):
        raise InvalidRequest("parameter 'config' must be a string holding the model config as JSON")
    if files and config is None:
        raise InvalidRequest("'file:' parameters need the 'config' parameter too")
    try:
        core.reload(name, config, files)
    except errors.SourceNotFound as exc:  # Triton's words, which scripts check, then ours
        raise errors.SourceNotFound(f"failed to load '{name}', failed to poll from model repository ({exc})") from None
    except InvalidRequest as exc:
        raise type(exc)(f"failed to load '{name}', {exc}") from None


def unload(core: Core, name: str, parameters: dict) -> None:
    dependents = parameters.get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise InvalidRequest("parameter 'unload_dependents' must be true or false")
    with contextlib.suppress(ModelNotFound):  # unloading a model that is not loaded succeeds, as in Triton
        core.unload(name, dependents)


def model(core: Core, name: str, version: str | None, default_latest: bool = True) -> tuple[ModelView, int | None]:
    """The model and the version a request names; a miss in Triton's words, which Triton's clients match."""
    number = _version(version)
    view = core.ready_model(name, not_found=lambda _: _unknown(core, name))
    if number is None:
        return view, view.latest if default_latest else None
    if number not in view.versions:
        raise ModelNotFound(f"Request for unknown model: '{name}' version {number} is not found")
    return view, number


def platform(view: ModelView) -> str:
    if view.config is None:
        return "sagemaker_pytorch"
    return view.config.platform or PLATFORMS.get(view.config.backend, "pytorch_libtorch")


def _version(text: str | None) -> int | None:
    if text is None or text == "":  # gRPC's empty model_version: the latest, as no version in a URL
        return None
    number = whole_number(text)
    if number is None:  # Triton's words, which clients match (its std::stol names itself in the details)
        shown = text[:256]
        if shown.startswith("-") and whole_number(shown[1:]) is not None:
            raise InvalidRequest(f"invalid model version specified '{shown}' , version should be an integral value > 0")
        raise InvalidRequest(f"failed to get model version from specified version string '{shown}' (details: stol), "
                             f"version should be an integral value > 0")
    return number


def _unknown(core: Core, name: str, version: int | None = None) -> ModelNotFound | Unavailable:
    """Triton's words for a model, or a version of it, that cannot serve; but a 503 to retry while it, or
    any model named at start, still loads (at start, or after the model process restarted): Triton loads
    the latter before it listens."""
    if not core.started.is_set():
        return Unavailable("the models named at start are still loading")
    if core.state(name) is State.LOADING:
        return Unavailable(f"model '{name}' is still loading")
    if version is not None:
        return ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found")
    return ModelNotFound(f"Request for unknown model: '{name}' {'has no available versions' if core.known(name) else 'is not found'}")


def _model_statistics(view: ModelView, version: int, stats: Statistics, memory: dict[str, int]) -> dict:
    """Triton's statistics of one version; its `memory_usage` is what the memory-aware cache charges it,
    per device, in Triton's kinds (CPU, GPU with its index)."""
    def duration(d: Duration) -> dict:
        return {"count": d.count, "ns": d.ns}

    phases = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
    inference = {p: duration(getattr(stats, p)) for p in phases}
    batches = [
        {"batch_size": size, **{p: duration(getattr(b, p)) for p in ("compute_input", "compute_infer", "compute_output")}}
        for size, b in sorted(stats.batches.items())
    ]
    responses = {str(place): {k: duration(getattr(r, k)) for k in ("compute_infer", "compute_output", "success", "fail",
                                                                    "empty_response", "cancel")}
                 for place, r in sorted(stats.responses.items())}
    usage = [{"type": "CPU" if device == "cpu" else "GPU", "id": 0 if device == "cpu" else int(device.partition(":")[2] or 0),
              "byte_size": size} for device, size in sorted(memory.items())]
    return {"name": view.name, "version": str(version), "last_inference": stats.last_inference_ms,
            "inference_count": stats.inference_count, "execution_count": stats.execution_count,
            "inference_stats": inference, "batch_stats": batches, "memory_usage": usage, "response_stats": responses}
