"""The `context` argument SageMaker's toolkit hands to handlers that take one (`model_fn(model_dir,
context)`, `input_fn(data, content_type, context)`, …): TorchServe's `Context`, with the parts handler
code reads — system properties, the request's headers — and writes: response status, type, headers."""

from dataclasses import dataclass, field
from importlib.metadata import version


@dataclass
class RequestProcessor:
    """One request's headers, as TorchServe's `RequestProcessor` shows them."""

    headers: dict[str, str] = field(default_factory=dict)

    def get_request_property(self, key: str) -> str | None:
        return _lookup(self.headers, key)

    def get_request_properties(self) -> dict[str, str]:
        return self.headers


@dataclass
class Response:
    status: int = 200
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


class Context:
    """A batch of one request: index 0 is the request being served."""

    def __init__(self, model_name: str, model_dir: str, device: str):
        gpu_id = int(device.partition(":")[2] or 0) if device.startswith("cuda") else None
        self.model_name = model_name
        self.system_properties = {"model_dir": model_dir, "gpu_id": gpu_id, "batch_size": 1,
                                  "server_name": "container", "server_version": version("container"),
                                  "limit_max_image_pixels": True}
        self.manifest = {"model": {"modelName": model_name}}
        self.metrics = None
        self.start(None, {})

    def start(self, request_id: str | None, headers: dict[str, str]) -> None:
        """Begin serving a request: its headers in, a fresh response out."""
        self.request_ids = {0: request_id}
        self.request_processor = [RequestProcessor(headers)]
        self.response = Response()

    def get_request_id(self, idx: int = 0) -> str | None:
        return self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self.request_processor[idx].get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        return self.request_processor[idx].get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.response.content_type = value

    def get_response_content_type(self, idx: int) -> str | None:
        return self.response.content_type

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.response.status = int(code)

    def get_response_status(self, idx: int = 0) -> int:
        return self.response.status

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self.response.headers[str(key)] = str(value)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self.response.headers


def _lookup(headers: dict[str, str], key: str) -> str | None:
    lowered = key.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)
