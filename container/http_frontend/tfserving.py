"""An HTTP front-end's TF Serving inferences: the `run` of api/tfserving_infer.py's routes. The route,
the request id, the access log and the error's rendering are this process's. The body is decoded here,
against the view this front-end holds of the model (views.py), so that only its tensors cross the
channel and only its outputs come back, to be encoded here: the one model process does little more than
what only it can (the version or label resolved, the lease, execution).

A body this decoding refuses, a large one, or one to a model this front-end has no view of crosses
whole, and the model process decodes it against the model it leases, so a refusal comes in one
process's order and words (a model that is not there is a 404 whatever the body holds). Either way the
calls that arrive together cross as one (channel/groups.py)."""


from container.api import offload, tfserving_codec
from container.api.pipeline import Request, Response
from container.api.tfserving_infer import answer
from container.channel.blobs import large
from container.channel.groups import Groups
from container.channel.hub_client import HubChannelClient
from container.http_frontend.views import FrontEndViews
from container.limits import Limits
from container.v2 import views
from container.v2.views import TensorView


class RemoteTFServing:
    def __init__(self, channel: HubChannelClient, model_views: FrontEndViews, limits: Limits):
        self.limits = limits
        self._bodies = Groups(channel, "tfserving")
        self._tensors = Groups(channel, "tfserving_tensors")
        self._views = model_views

    def __call__(self, request: Request, verb: str) -> Response:
        client, params, body = request.client, request.params, request.body
        name, path = params["name"], (params.get("version"), params.get("label"))

        def cross(view: TensorView, decoded: tuple) -> list:
            inputs = decoded[0]
            return self._tensors.call((name, *path), [client.number, client.requests, view.generation, inputs],
                                      views.call_size(len(body), inputs), client)

        ran = None if offload.heavy(len(body)) else self._views.run(
            name, path != (None, None), lambda view: _decoded(view, body, verb, self.limits), cross)
        if ran is not None:
            _, (_, encode), [outputs] = ran
            return answer(encode(outputs))
        [answered] = self._bodies.call((name, *path, verb), [client.number, client.requests, large(body)],
                                       len(body), client)
        return answer(answered)


def _decoded(view: TensorView, body: bytes, verb: str, limits: Limits):
    """The body's inputs, decoded and checked against `view`, and their answer's encoder; None when
    refused here (or a bug stops it): the model process decodes it again, and refuses it in one process's
    order and words."""
    try:
        inputs, encode = tfserving_codec.decode(view.signature, view.labels, body, verb)
        view.signature.check(inputs, None, limits)
    except Exception:
        return None
    return inputs, encode
