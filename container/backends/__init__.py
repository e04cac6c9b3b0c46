"""Frameworks, one module each. A backend object is loaded from files, executes on an execution thread,
reports the bytes it holds per device (`memory()`), and frees them on `close()`.

- `pytorch.TorchScriptModel`: named numpy tensors in, named numpy tensors out (Triton layout).
- `handler_worker.HandlerWorker`: request bytes in, response bytes out, through SageMaker's handler
  functions, in a worker process of the model's own (`handler.HandlerModel` runs there).
"""

from container.backends.handler_worker import HandlerOptions, HandlerWorker
from container.backends.pytorch import TorchScriptModel
from container.models.source import ModelSource, TritonLayout


def load_backends(name: str, source: ModelSource, device: str, options: HandlerOptions) -> dict[int, object]:
    """Every served version of the model at `source`, loaded on `device`. Blocking: run it on a thread."""
    layout = source.layout
    if isinstance(layout, TritonLayout):
        loaded = {}
        try:
            for version, path in sorted(layout.versions.items()):
                loaded[version] = TorchScriptModel(name, path, layout.signature, device)
        except BaseException:
            for backend in loaded.values():
                backend.close()
            raise
        return loaded
    return {1: HandlerWorker(name, source.directory, device, options)}
