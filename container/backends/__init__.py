"""Frameworks, one module each. A backend object is loaded from files, executes on an execution thread,
reports the bytes it holds per device (`memory()`), and frees them on `close()`.

- `pytorch.TorchScriptModel`: named numpy tensors in, named numpy tensors out (Triton layout).
- `handler.HandlerModel`: request bytes in, response bytes out, through SageMaker's handler functions.
"""

from container.backends.handler import HandlerModel
from container.backends.pytorch import TorchScriptModel
from container.models.signature import Signature
from container.models.source import ModelSource, TritonLayout


def load_backends(name: str, source: ModelSource, device: str) -> dict[int, object]:
    """Every served version of the model at `source`, loaded on `device`. Blocking: run it on a thread."""
    layout = source.layout
    if isinstance(layout, TritonLayout):
        signature = Signature.from_config(layout.config)
        loaded = {}
        try:
            for version, path in sorted(layout.versions.items()):
                loaded[version] = TorchScriptModel(name, path, signature, device)
        except BaseException:
            for backend in loaded.values():
                backend.close()
            raise
        return loaded
    return {1: HandlerModel(name, source.directory, layout.model_file, layout.handler_file, device)}
