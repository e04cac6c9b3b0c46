"""Triton's published `ModelConfig` schema, the `model_config_pb2` module tritonclient ships.

It lives in `tritonclient.grpc`, whose package imports grpcio (about 19 MB) as it loads; the schema
itself needs only protobuf, so it is loaded from its file alone and grpcio is not installed."""

import importlib.util
from pathlib import Path


def _load_schema():
    package = importlib.util.find_spec("tritonclient")
    path = Path(package.submodule_search_locations[0], "grpc", "model_config_pb2.py")
    spec = importlib.util.spec_from_file_location(f"{__name__}.model_config_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


model_config_pb2 = _load_schema()
