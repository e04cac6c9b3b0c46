"""What a front-end holds of a model to decode its V2 requests and encode their answers itself: the
tensors it takes and gives, its output labels (classification), and the load they belong to
(ModelView.generation). A request decoded against a view crosses the channel as tensors, naming the
view's generation; the model process runs it only while that load still serves, and otherwise tells the
front-end to fetch the view again (api/http_channel.py)."""

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from container.inference import InferRequest
from container.limits import Limits
from container.models.signature import Signature, TensorSpec
from container.tensors import decoded_size
from container.v2 import documents

TRIES = 3  # decodings against a fresh view before a request goes as its document


@dataclass(frozen=True)
class TensorView:
    generation: int
    signature: Signature  # its inputs, outputs and max_batch_size: what decoding and encoding read
    labels: Mapping[str, tuple[str, ...]]  # output → class labels


class Views:
    """A front-end's views, by model name; each flavour fetches them as its event loop does (`get`),
    concurrent first requests sharing one fetch (`fetching`)."""

    def __init__(self):
        self.views: dict[str, TensorView] = {}
        self.fetching: dict[str, object] = {}

    def keep(self, name: str, description: list | None) -> TensorView | None:
        if description is None:
            return None
        view = self.views[name] = from_description(description)
        return view

    def stale(self, name: str, view: TensorView) -> None:
        """`view` is of a load that no longer serves (or of a model gone)."""
        if self.views.get(name) is view:
            del self.views[name]

    def not_found(self, name: str, view: TensorView, version_named: bool) -> None:
        """A request decoded against `view` was told that its model, or the version (or label) it named,
        is not there. A version may be missing while the load the view is of still serves: only a request
        that named none says the model is gone (so a client asking for a missing version does not make
        each of its requests fetch the view again)."""
        if not version_named:
            self.stale(name, view)


def decode(view: TensorView, document: dict, binary, limits: Limits, name: str) -> tuple[InferRequest, list | None] | None:
    """The request decoded and checked against `view`, and the outputs it asks for; None when it is
    refused here (or a bug stops it): the model process decodes it again, and refuses it in one process's
    order and words (a model that is not there is a 404 whatever the request holds)."""
    try:
        request, requested = documents.decode_request(document, binary, view.signature, None, limits, name)
        view.signature.check(request.inputs, request.outputs, limits)
    except Exception:
        return None
    return request, requested


def tensor_call(client: list, view: TensorView, request: InferRequest) -> list:
    """A call of `v2_infer_tensors` (api/http_channel.py); `client`: its number and the requests it has made."""
    return [*client, view.generation, request.inputs, request.outputs, request.parameters, request.request_id]


def call_size(body_size: int, inputs: dict) -> int:
    """What a call of decoded tensors weighs for grouping (channel/groups.py): its tensors' bytes, or its
    body's where more (a BYTES element counts as its reference only). A JSON number takes as little as
    two bytes and an FP64 element eight, and a gRPC request's typed contents are not in its raw bytes."""
    return max(body_size, decoded_size(inputs.values()))


def description(view) -> list | None:
    """A ready model's view (core.ModelView) as the channel carries it; None for a SageMaker handler
    model (bytes in, bytes out) and for a decoupled one (its refusal is in each transport's words)."""
    signature = view.signature
    if signature is None or view.decoupled:
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
