"""What an HTTP front-end process asks the model process over the channel: each request it has parsed,
served here by the one pipeline (pipeline.Dispatcher: routing, limits, the request id, the handlers, the
error renderer, the access log), so every answer is the one a single process would give. Each of a
front-end's connections is one Client here, as a connection is in a single process: a batcher waits for
a client it has just answered, across front-ends, until the front-end says the connection closed (or
the front-end itself is gone). V2 inference is the exception: a front-end serves its HTTP itself
(api/v2_infer.py) and asks here only for the inference (`v2_infer`)."""

from typing import Callable

from container.api import v2_dataplane
from container.api.pipeline import Dispatcher, Request
from container.api.v2_infer import answer_body, parser
from container.channel.blobs import large
from container.core import Core
from container.inference import Client


class FrontEndClients:
    """(front-end pid, its connection's number) → the Client that connection is here."""

    def __init__(self):
        self._clients: dict[int, dict[int, Client]] = {}

    def get(self, front_end: int, number: int, requests: int) -> Client:
        clients = self._clients.setdefault(front_end, {})
        client = clients.get(number)
        if client is None:
            client = clients[number] = Client()
        client.requests = requests
        return client

    def close(self, front_end: int, number: int) -> None:
        client = self._clients.get(front_end, {}).pop(number, None)
        if client is not None:
            client.close()

    def close_all(self, front_end: int) -> None:
        for client in self._clients.pop(front_end, {}).values():
            client.close()


def http_operations(dispatcher: Dispatcher, clients: FrontEndClients, core: Core, shared_memory) -> dict[str, Callable]:
    def http(front_end: int, number: int, requests: int, method: str, path: str, query: str,
             headers: dict[str, str], body, oversize: int | None) -> list:
        """`body`: bytes, or a large body mapped from shared memory (handlers read bytes)."""
        request = Request(method, path, query, headers, body if isinstance(body, bytes) else bytes(body), oversize,
                          clients.get(front_end, number, requests))
        response = dispatcher.serve(request)
        return [response.status, response.headers, large(response.body)]

    def v2_infer(front_end: int, number: int, requests: int, name: str, version: str | None, header_length: str | None,
                 document: dict | None, data, heavy: bool) -> list:
        """A V2 inference, answered with the response's body and headers: `document` is the request's JSON,
        which the front-end parsed, and `data` the binary part after it; or None and the whole body, when
        the front-end could not parse it (a raw binary request, or a malformed one): parsed here once the
        model is leased, so errors come in the order one process gives them."""
        def parsed(_signature):
            return document, memoryview(data)

        parse = parsed if document is not None else parser(name, data if isinstance(data, bytes) else bytes(data),
                                                           header_length, heavy)
        answer, chunks = v2_dataplane.infer(core, shared_memory, name, version, parse,
                                            clients.get(front_end, number, requests), heavy)
        body, headers = answer_body(answer, chunks, heavy)
        return [large(body), headers]

    def probes() -> list[list[str]]:
        """The routes of the `health` group, which a front-end answers within a deadline of its own."""
        return [[route.method, route.template] for route in dispatcher.routes.routes if route.api == "health"]

    return {"http": http, "v2_infer": v2_infer, "connection_closed": clients.close, "probes": probes}
