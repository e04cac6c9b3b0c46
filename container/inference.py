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
