"""What front-ends hand the core and get back: named numpy tensors, protocol-free."""

from dataclasses import dataclass, field

import numpy as np


@dataclass
class InferRequest:
    model_name: str
    inputs: dict[str, np.ndarray]
    model_version: int | None = None  # None: the latest served version
    outputs: list[str] | None = None  # None: every output
    parameters: dict = field(default_factory=dict)


@dataclass
class InferResponse:
    model_name: str
    model_version: int
    outputs: dict[str, np.ndarray]


@dataclass
class TransformRequest:
    """A request body for a SageMaker handler model, which decodes it itself."""

    model_name: str
    body: bytes
    content_type: str | None  # one media type, lower-case, without parameters; None when absent
    accept: str | None  # the Accept header as sent
    headers: dict[str, str] = field(default_factory=dict)
    request_id: str | None = None
