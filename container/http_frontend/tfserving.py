"""An HTTP front-end's TF Serving inferences: the `run` of api/tfserving_infer.py's routes. The route,
the request id, the access log and the error's rendering are this process's; only the body crosses,
and only the answer's comes back, so that the one model process does little more than what only it
can: the lease, and the body decoded against the signature of the load it runs on. Those of one verb
to one model, version or label that arrive together cross as one (channel/groups.py)."""

import os

from container.api.pipeline import Request, Response
from container.api.tfserving_infer import answer
from container.channel.blobs import large
from container.channel.groups import Groups
from container.channel.hub_client import HubChannelClient


class RemoteTFServing:
    def __init__(self, channel: HubChannelClient):
        self._groups = Groups(channel, "tfserving")

    def __call__(self, request: Request, verb: str) -> Response:
        client, params = request.client, request.params
        key = (os.getpid(), params["name"], params.get("version"), params.get("label"), verb)
        [body] = self._groups.call(key, [client.number, client.requests, large(request.body)], len(request.body))
        return answer(body)
