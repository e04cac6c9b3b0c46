"""An HTTP front-end's SageMaker invokes: the `run` of api/sagemaker_invoke.py's routes. The route, the
request id, the access log and the error's rendering are this process's. A tensor model's body is decoded
here, against the view this front-end holds of the model (views.py), so that only its tensors cross the
channel and only its outputs come back, to be encoded here: the one model process does little more than
what only it can (the lease, execution).

A body to a handler model (its worker takes the body as it is), to a model this front-end has no view of
(not loaded yet: `/invocations` loads it on first use), a large one, or one this decoding refuses crosses
whole, with its headers, and the model process decodes it against the model it leases, so a refusal comes
in one process's order and words. Either way the invokes of one model that arrive together cross as one
(channel/groups.py)."""


from container.api import offload
from container.api.pipeline import Request, Response
from container.api.sagemaker_invoke import CUSTOM_ATTRIBUTES, tensors
from container.channel.blobs import large
from container.channel.groups import Groups
from container.channel.hub_client import HubChannelClient
from container.http_frontend.views import FrontEndViews
from container.limits import Limits
from container.v2 import views
from container.v2.views import TensorView


class RemoteInvoke:
    def __init__(self, channel: HubChannelClient, model_views: FrontEndViews, limits: Limits, default_accept: str):
        self.limits, self.default_accept = limits, default_accept
        self._bodies = Groups(channel, "invoke")
        self._tensors = Groups(channel, "invoke_tensors")
        self._views = model_views

    def __call__(self, request: Request, name: str, on_demand: bool) -> Response:
        client, body, headers = request.client, request.body, request.headers
        key = (name, on_demand)

        def cross(view: TensorView, decoded: tuple) -> list:
            inputs = decoded[0]
            call = [client.number, client.requests, view.generation, inputs, headers.get(CUSTOM_ATTRIBUTES),
                    request.request_id]
            return self._tensors.call(key, call, views.call_size(len(body), inputs), client)

        ran = None if offload.heavy(len(body)) else self._views.run(name, False, self._decoder(body, headers), cross)
        if ran is not None:
            _, (_, finish), [outputs] = ran
            return finish(outputs)
        call = [client.number, client.requests, large(body), headers, request.request_id]
        status, headers, body = self._bodies.call(key, call, len(body), client)
        return Response(body, status=status, headers=headers)

    def _decoder(self, body: bytes, headers: dict[str, str]):
        def decoded(view: TensorView) -> tuple | None:
            """The body's inputs, decoded and checked against `view`, and their answer's `finish`; None when
            refused here (or a bug stops it): the model process decodes it again, and refuses it in one
            process's order and words."""
            try:
                inputs, finish = tensors(body, headers, view.signature, self.default_accept)
                view.signature.check(inputs, None, self.limits)
            except Exception:
                return None
            return inputs, finish

        return decoded
