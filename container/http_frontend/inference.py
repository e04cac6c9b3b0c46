"""An HTTP front-end's V2 inference: the `run` of api/v2_infer.py's route. The request is parsed and
decoded here, against the view this front-end holds of the model (v2/views.py), so that only its
tensors cross the channel and only its outputs come back, to be encoded here: the model process, which
every request passes through, keeps only what it alone can do (the lease, the scheduler, execution).

What is not decoded here crosses as its document (or whole body), decoded by the model process once the
model is leased: a request that names shared memory (the regions live there) or is large (its data
crosses in shared memory, and is decoded on a thread there); a request this decoding refuses (refused
there in one process's order and words: a model that is not there is a 404 whatever the body holds);
a model this front-end has no view of (a handler model, a decoupled one, or one not loaded).

Either way the calls for one model that arrive together cross as one (channel/groups.py)."""


from container.api import offload
from container.api.pipeline import Request
from container.api.v2_infer import answer_body, is_raw
from container.channel.blobs import large
from container.channel.groups import MOST_BYTES, Groups
from container.channel.hub_client import HubChannelClient
from container.errors import InvalidRequest, PayloadTooLarge
from container.http_frontend.views import FrontEndViews
from container.limits import Limits
from container.v2 import codec, documents, views
from container.v2.views import TensorView


class RemoteInference:
    def __init__(self, channel: HubChannelClient, model_views: FrontEndViews, limits: Limits):
        self.channel, self.limits = channel, limits
        self._documents = Groups(channel, "v2_infer")
        self._tensors = Groups(channel, "v2_infer_tensors")
        self._views = model_views

    def __call__(self, request: Request, body: bytes, heavy: bool) -> tuple[bytes, dict[str, str]]:
        name, version = request.params["name"], request.params.get("version")
        key = (name, version)
        header_length = request.header(codec.HEADER_LENGTH)
        client = [request.client.number, request.client.requests]

        def cross(view: TensorView, decoded: tuple) -> list:
            inferred = decoded[1][0]
            return self._tensors.call(key, views.tensor_call(client, view, inferred), views.call_size(len(body), inferred.inputs),
                                     request.client)

        here = not heavy and b"shared_memory_region" not in body  # the regions are the model process's
        ran = self._views.run(name, version is not None, lambda view: _decoded(view, body, header_length, self.limits, name),
                              cross) if here else None
        if ran is None:
            return self._by_document(request, body, heavy, key, header_length)
        view, (document, (inferred, requested)), (model_version, outputs) = ran
        return answer_body(*offload.run(documents.heavy_outputs(outputs), documents.answer, document, inferred, name,
                                        model_version, outputs, requested, view.signature, view.labels, None), False)

    def _by_document(self, request: Request, body: bytes, heavy: bool, key: tuple,
                     header_length: str | None) -> tuple[bytes, dict[str, str]]:
        """The request for the model process to decode: its JSON parsed here, or, when it does not parse
        (a raw binary request needs the model's signature; a malformed one is refused after the model's
        own checks, as in one process), its whole body."""
        document, data = None, body
        if not is_raw(header_length):
            try:
                document, data = offload.run(heavy, _typed, body, header_length)
            except InvalidRequest:
                pass
        client = request.client
        size = MOST_BYTES if heavy else len(body)
        call = [client.number, client.requests, header_length, document, large(data), heavy]
        try:
            answer, headers = self._documents.call(key, call, size, client)
            return answer, headers
        except PayloadTooLarge:
            if document is None:
                raise
        # Parsed, it is too large to cross (JSON's numbers as msgpack's, up to 9 bytes each): the body is
        # not, as its limit is the call's, so the model process parses it as one process would.
        call[3:5] = None, large(body)
        answer, headers = self._documents.call(key, call, size, client)
        return answer, headers


def _decoded(view: TensorView, body: bytes, header_length: str | None, limits: Limits, name: str):
    """The request's document, and its decoding against `view` (views.decode); None when refused here."""
    try:
        document, binary = _parse(body, header_length, view, name)
    except Exception:
        return None
    decoded = views.decode(view, document, binary, limits, name)
    return decoded and (document, decoded)


def _parse(body: bytes, header_length: str | None, view: TensorView, name: str) -> tuple[dict, memoryview]:
    if is_raw(header_length):
        return codec.raw_request(view.signature, len(body), name), memoryview(body)
    return codec.split(body, header_length)


def _typed(body: bytes, header_length: str | None) -> tuple[dict, memoryview]:
    """A V2 request's document, its JSON data already typed, and the binary data after it."""
    document, data = codec.split(body, header_length)
    return codec.typed_data(document), data
