"""An HTTP front-end's SageMaker invokes: the `run` of api/sagemaker_invoke.py's routes. The route, the
request id, the access log and the error's rendering are this process's; only the body, its headers and
the request id cross, and only the answer comes back, so that the one model process does little more
than what only it can: the lease, a load on first use, and a handler model's hand-off to its worker (a
tensor model's body is decoded there too, against the signature of the load it runs on). The invokes of
one model that arrive together cross as one (channel/groups.py)."""

import os

from container.api.pipeline import Request, Response
from container.channel.blobs import large
from container.channel.groups import Groups
from container.channel.hub_client import HubChannelClient


class RemoteInvoke:
    def __init__(self, channel: HubChannelClient):
        self._groups = Groups(channel, "invoke")

    def __call__(self, request: Request, name: str, on_demand: bool) -> Response:
        client = request.client
        call = [client.number, client.requests, large(request.body), request.headers, request.request_id]
        status, headers, body = self._groups.call((os.getpid(), name, on_demand), call, len(request.body))
        return Response(body, status=status, headers=headers)
