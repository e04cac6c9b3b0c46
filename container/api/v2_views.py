"""What an HTTP front-end holds of a model to decode its V2 requests and encode their answers itself: the
tensors it takes and gives, its output labels (classification), and the load they belong to
(ModelView.generation). A request decoded against a view crosses the channel as tensors, naming the
view's generation; the model process runs it only while that load still serves, and otherwise tells the
front-end to fetch the view again (http_channel.py)."""

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from container.models.signature import Signature, TensorSpec


@dataclass(frozen=True)
class TensorView:
    generation: int
    signature: Signature  # its inputs, outputs and max_batch_size: what decoding and encoding read
    labels: Mapping[str, tuple[str, ...]]  # output → class labels


def description(view) -> list | None:
    """A ready model's view (core.ModelView) as the channel carries it; None for a SageMaker handler
    model (bytes in, bytes out)."""
    signature = view.signature
    if signature is None:
        return None
    return [view.generation, signature.max_batch_size, [_spec(s) for s in signature.inputs],
            [_spec(s) for s in signature.outputs], {output: list(labels) for output, labels in view.output_labels.items()}]


def from_description(description: list) -> TensorView:
    generation, max_batch_size, inputs, outputs, labels = description
    signature = Signature(tuple(map(_tensor, inputs)), tuple(map(_tensor, outputs)), max_batch_size)
    return TensorView(generation, signature, MappingProxyType({k: tuple(v) for k, v in labels.items()}))


def _spec(spec: TensorSpec) -> list:
    return [spec.name, spec.datatype, list(spec.shape), spec.optional]


def _tensor(fields: list) -> TensorSpec:
    name, datatype, shape, optional = fields
    return TensorSpec(name, datatype, tuple(shape), optional=optional)
