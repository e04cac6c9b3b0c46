"""Frameworks, one module each. A backend object is loaded from files, executes on an execution thread,
reports the bytes it holds per device (`memory()`), and frees them on `close()`.

- `pytorch.TorchScriptModel`: named numpy tensors in, named numpy tensors out (Triton layout);
  `pytorch.Replicas` when the config's instance groups name several GPUs: a copy on each, its
  instances placed as the groups place them.
- `handler_worker.HandlerWorker`: request bytes in, response bytes out, through SageMaker's handler
  functions, in a worker process of the model's own (`handler.HandlerModel` runs there).
"""

from container.backends.handler_worker import HandlerOptions, HandlerWorker
from container.backends.pytorch import Replicas, TorchScriptModel
from container.models.config import instance_gpus
from container.models.source import ModelSource, TritonLayout


def load_backends(name: str, source: ModelSource, device: str, options: HandlerOptions) -> dict[int, object]:
    """Every served version of the model at `source`, loaded on `device`. Blocking: run it on a thread."""
    layout = source.layout
    if isinstance(layout, TritonLayout):
        loaded = {}
        placed = instance_gpus(layout.config)
        named = list(dict.fromkeys(placed))
        devices = named if device.startswith("cuda") and len(named) > 1 else [device]
        try:
            for version, path in sorted(layout.versions.items()):
                copies = []
                try:
                    copies += [TorchScriptModel(name, path, layout.signature, d) for d in devices]
                except BaseException:
                    for copy in copies:
                        copy.close()
                    raise
                loaded[version] = copies[0] if len(copies) == 1 else Replicas(copies, [named.index(d) for d in placed])
        except BaseException:
            for backend in loaded.values():
                backend.close()
            raise
        return loaded
    return {1: HandlerWorker(name, source.directory, device, options)}
