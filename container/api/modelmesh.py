"""KServe ModelMesh's runtime API (`mmesh.ModelRuntime`) as operations on the core, for the gRPC
front-end (over the channel). ModelMesh places models on runtimes by the memory each reports, so the
answers are the cache's own accounting: the budget as capacity, each model's charged bytes as its size.
A model id is the model's name here; its path is a directory or archive under the model root."""

import contextlib
from importlib.metadata import version as package_version
from typing import Callable

from container.core import Core
from container.errors import ModelNotFound
from container.limits import check_name


def modelmesh_operations(core: Core) -> dict[str, Callable]:
    def status() -> dict:
        """The runtime as ModelMesh asks at its start, every loaded model unloaded first: ModelMesh
        starts from nothing, and a model it does not know of would hold memory it counts as free."""
        for view in core.ready():
            core.unload(view.name)
        budget, _ = core.memory()["cpu"]
        return {"ready": core.started.is_set(), "capacity": budget, "load_concurrency": core.load_concurrency,
                "default_model_size": budget // 16, "version": package_version("container")}

    def load(model_id: str, path: str) -> int:
        """Loading again what is loaded, or loading, is a success: ModelMesh retries a load it gave up on."""
        check_name(model_id)
        current = core.after_loading(model_id)
        if current is None or current.url != path:
            core.load(model_id, path, reload=current is not None)
        return _charged(core, model_id)

    def unload(model_id: str) -> None:
        """ModelMesh unloads a model whose load it cancelled at once: that load is waited for, then undone.
        Unloading what is not loaded succeeds."""
        with contextlib.suppress(ModelNotFound):
            core.unload(model_id)

    return {
        "mm_status": status,
        "mm_load": load,
        "mm_unload": unload,
        "mm_size": lambda model_id: _charged(core, model_id),
        "mm_predict_size": core.predicted_memory,
    }


def _charged(core: Core, model_id: str) -> int:
    return sum(core.model_memory(core.ready_model(model_id)).values())
