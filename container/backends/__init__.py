"""Frameworks, one module each. A backend object is loaded from files, executes on an execution thread,
reports the bytes it holds per device (`memory()`), and frees them on `close()`.

- `pytorch.TorchScriptModel`: named numpy tensors in, named numpy tensors out (Triton layout);
  `pytorch.Replicas` when the config's instance groups name several GPUs: a copy on each, its
  instances placed as the groups place them.
- `handler_worker.HandlerWorker`: request bytes in, response bytes out, through SageMaker's handler
  functions, in a worker process of the model's own (`handler.HandlerModel` runs there).
- `pt2.Pt2Model`: the same, from a `.pt2` (an AOTInductor package or an ExportedProgram).
- `python_backend.PythonBackend`: a Triton python-backend `model.py`, a worker process per instance;
  its `execute` takes the batch's requests as a list.
- `ensemble.Ensemble`: the steps of an ensemble, which the core runs through the models they name.
"""

import functools
import logging

import torch

from container.backends import footprint, pt2, python_backend, worker_process
from container.backends.ensemble import Ensemble
from container.backends.handler_worker import HandlerWorker
from container.backends.pytorch import Replicas, Switches, TorchScriptModel
from container.backends.worker_process import WorkerOptions
from container.models.config import ENSEMBLE_PLATFORM, PT2, PYTHON_BACKEND, instance_gpus, normalize
from container.models.source import ModelSource, TritonLayout
from container.models.warmup import warm, warmup_samples

log = logging.getLogger(__name__)


def load_backends(name: str, source: ModelSource, device: str, options: WorkerOptions) -> dict[int, object]:
    """Every served version of the model at `source`, loaded on `device`, its config completed (by the
    model, where it completes its own) and normalised as Triton's is before any version loads. Blocking:
    run it on a thread."""
    layout = source.layout
    if not isinstance(layout, TritonLayout):
        return {1: HandlerWorker(name, source.directory, device, options)}
    if layout.kind in (ENSEMBLE_PLATFORM, PYTHON_BACKEND) and layout.config.model_warmup:
        log.warning("model_warmup runs for TorchScript and .pt2 models only; this model serves without it",
                    extra={"fields": {"model": name, "kind": layout.kind}})
    latest = layout.versions[max(layout.versions)]
    if layout.kind == PYTHON_BACKEND:  # its `auto_complete_config`, with the latest version's `model.py`, as Triton runs it
        layout.complete(python_backend.complete_config(name, latest, layout.config, options))
    elif layout.kind == PT2:
        pt2.prepare_runtime(layout.versions.values())
        if layout.signature is None:  # from the latest version's recorded tensors
            layout.complete(pt2.completed(layout.config, latest))
    normalize(layout.config, name, device)
    if layout.kind == ENSEMBLE_PLATFORM:
        return {version: Ensemble(name, layout.config) for version in layout.versions}
    if layout.kind == PYTHON_BACKEND:
        return _each_version(layout, lambda version, path: python_backend.PythonBackend(name, version, path, layout.config,
                                                                                      device, options))
    if layout.kind == PT2:
        return _pt2_versions(name, source, device)
    return _torchscript_versions(name, source, device)


def server_memory() -> dict[str, dict[str, int]]:
    """Part → device → bytes the server's own parts took after its idle start, which no model is
    charged: the runtimes this process prepared since (footprint.prepared), and the fork server
    handler workers start from."""
    return {"runtimes": {"cpu": footprint.runtime_bytes()}, "fork_server": {"cpu": worker_process.fork_server_bytes()}}


@functools.cache
def _torchscript_deprecated(name: str) -> None:
    """Said once a model name in the process's life: a model evicted and loaded again, or reloaded, is not news."""
    log.warning("TorchScript is deprecated by PyTorch (torch.jit.load warns so since 2.11): export the model "
                "with torch.export and serve it as model.pt2 (platform torch_export, or torch_aoti once compiled "
                "with torch._inductor.aoti_compile_and_package); docs/models.md shows how",
                extra={"fields": {"model": name, "torch": torch.__version__}})


def _torchscript_versions(name: str, source: ModelSource, device: str) -> dict[int, object]:
    """A TorchScript model's versions, each copied onto every GPU its instance groups name."""
    layout = source.layout
    _torchscript_deprecated(name)
    placed = instance_gpus(layout.config)
    named = list(dict.fromkeys(placed))
    devices = named if device.startswith("cuda") and len(named) > 1 else [device]
    samples = warmup_samples(source.directory, layout.config)
    switches = Switches.from_config(layout.config)

    def torchscript(version: int, path) -> object:
        copies = []
        try:
            copies += [TorchScriptModel(name, path, layout.signature, d, switches) for d in devices]
        except BaseException:
            for copy in copies:
                copy.close()
            raise
        loaded = copies[0] if len(copies) == 1 else Replicas(copies, [named.index(d) for d in placed])
        warm(loaded, samples, layout.signature)
        return loaded

    return _each_version(layout, torchscript)


def _pt2_versions(name: str, source: ModelSource, device: str) -> dict[int, object]:
    layout = source.layout
    samples = warmup_samples(source.directory, layout.config)

    def program(version: int, path) -> object:
        loaded = pt2.Pt2Model(name, path, layout.config.platform, layout.signature, device)
        warm(loaded, samples, layout.signature)
        return loaded

    return _each_version(layout, program)


def _each_version(layout: TritonLayout, load) -> dict[int, object]:
    """`load(version, path)` of every served version; all of them closed if one fails."""
    loaded = {}
    try:
        for version, path in sorted(layout.versions.items()):
            loaded[version] = load(version, path)
    except BaseException:
        for backend in loaded.values():
            backend.close()
        raise
    return loaded
