"""What an HTTP front-end process asks the model process over the channel: each request it has parsed,
served here by the one pipeline (pipeline.Dispatcher: routing, limits, the request id, the handlers, the
error renderer, the access log), so every answer is the one a single process would give. Each of a
front-end's connections is one Client here, as a connection is in a single process: a batcher waits for
a client it has just answered, across front-ends, until the front-end says the connection closed (or
the front-end itself is gone). Inference is the exception: a front-end serves its HTTP itself and asks
here only for the inferences, in groups (channel/groups.py). V2's (api/v2_infer.py) cross as tensors it
decoded against its view of the model (`v2_view`, `v2_infer_tensors`), or as documents for this
process to decode (`v2_infer`; http_frontend/inference.py says which goes how); TF Serving's
(tfserving_infer.py) as tensors decoded against the same view (`tfserving_tensors`), or as bodies
(`tfserving`); SageMaker's invokes (sagemaker_invoke.py) likewise (`invoke_tensors`, `invoke`)."""

from typing import Callable, Iterator

from container.api import sagemaker, tfserving, v2_dataplane
from container.api.pipeline import Dispatcher, Request
from container.api.sagemaker_invoke import log_attributes
from container.api.v2_infer import answer_body, parser
from container.channel.blobs import large
from container.channel.groups import GroupItems, group_items
from container.core import Core
from container.inference import Client, InferRequest, InferResponse, Ticket
from container.v2 import views


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


def http_operations(dispatcher: Dispatcher, clients: FrontEndClients, core: Core, shared_memory,
                    default_accept: str) -> dict[str, Callable]:
    def http(front_end: int, number: int, requests: int, method: str, path: str, query: str,
             headers: dict[str, str], body, oversize: int | None) -> list:
        """`body`: bytes, or a large body mapped from shared memory (handlers read bytes)."""
        request = Request(method, path, query, headers, body if isinstance(body, bytes) else bytes(body), oversize,
                          clients.get(front_end, number, requests))
        response = dispatcher.serve(request)
        return [response.status, response.headers, large(response.body)]

    def v2_infer(front_end: int, name: str, version: str | None, calls: list[list]):
        """V2 inferences of one model and version that a front-end received together and leaves to this
        process to decode, each [its connection's number, the requests that connection has carried, its
        Inference-Header-Content-Length, document, data, heavy]: `document` is the request's JSON, which
        the front-end parsed, and `data` the binary part after it; or None and the whole body, when the
        front-end could not parse it (a raw binary request, or a malformed one): parsed here once the
        model is leased, so errors come in the order one process gives them. Its items (group_items): TAKEN,
        then [position, None, the answer's body, its headers] for each, or [position, error], as each is
        done."""
        requests = [(v2_dataplane.document_request(core, shared_memory, _parser(name, header_length, document, data, heavy),
                                                   heavy), clients.get(front_end, number, count))
                    for number, count, header_length, document, data, heavy in calls]

        def answer(position: int, result) -> list:
            body, headers = answer_body(*result, calls[position][5])
            return [large(body), headers]

        return group_items(v2_dataplane.infer_group(core, name, version, requests), answer)

    def v2_infer_tensors(front_end: int, name: str, version: str | None, calls: list[list]):
        """V2 inferences a front-end received together, decoded and checked (Signature.check) against its
        view of the model (v2/views.py), each [connection number, its requests, the view's generation,
        inputs, the outputs asked for (None: all), parameters, request id]. Its items: TAKEN, then [position,
        None, the version that ran, its outputs] for each, or [position, error], or [position, None] when
        the model's load is no longer the view's: the front-end fetches the view again and decodes anew."""
        tickets = [Ticket() for _ in calls]  # a gRPC front-end may cancel one call alone (GroupItems.cancel)
        requests = [(_tensor_request(generation, InferRequest(inputs, outputs, parameters, request_id=request_id,
                                                              ticket=ticket)),
                     clients.get(front_end, number, count))
                    for (number, count, generation, inputs, outputs, parameters, request_id), ticket
                    in zip(calls, tickets, strict=True)]
        return _tensor_items(v2_dataplane.infer_group(core, name, version, requests),
                             lambda response: [response.model_version, response.outputs], tickets)

    def invoke(front_end: int, name: str, on_demand: bool, calls: list[list]):
        """SageMaker invokes of one model that a front-end received together and leaves to this process to
        decode (sagemaker_invoke.py), each [connection number, its requests, body, headers, request id];
        `on_demand`: loaded first when it is not (`/invocations` of a multi-model endpoint). Its items:
        TAKEN, then [position, None, status, headers, body] for each, or [position, error], as each is
        done."""
        requests = [(sagemaker.body_decoder(body if isinstance(body, bytes) else bytes(body), headers, request_id,
                                            default_accept), clients.get(front_end, number, count))
                    for number, count, body, headers, request_id in calls]
        return group_items(sagemaker.invoke_group(core, name, on_demand, requests),
                           lambda _, response: [response.status, response.headers, large(response.body)])

    def invoke_tensors(front_end: int, name: str, on_demand: bool, calls: list[list]):
        """SageMaker invokes of a tensor model that a front-end received together, each decoded and checked
        against its view of the model (http_frontend/invocations.py): [connection number, its requests, the
        view's generation, inputs, its X-Amzn-SageMaker-Custom-Attributes, request id]. Its items as
        `v2_infer_tensors`', [position, None, the outputs] for each answer: the front-end encodes them."""
        requests = [(_logged(name, attributes, request_id, _tensor_request(generation, InferRequest(inputs))),
                     clients.get(front_end, number, count))
                    for number, count, generation, inputs, attributes, request_id in calls]
        return _tensor_items(sagemaker.invoke_group(core, name, on_demand, requests), lambda response: [response.outputs])

    def tfserving_infer(front_end: int, name: str, version: str | None, label: str | None, verb: str, calls: list[list]):
        """TF Serving inferences of one verb to one model, version or label (as their path names them)
        that a front-end received together and leaves to this process to decode (tfserving_infer.py), each
        [connection number, its requests, body]. Its items: TAKEN, then [position, None, the answer's body]
        for each, or [position, error], as each is done."""
        requests = [(tfserving.decoder(body if isinstance(body, bytes) else bytes(body), verb),
                     clients.get(front_end, number, count)) for number, count, body in calls]
        return group_items(tfserving.infer_group(core, name, version, label, requests),
                           lambda _, response: [large(response.body)])

    def tfserving_tensors(front_end: int, name: str, version: str | None, label: str | None, calls: list[list]):
        """TF Serving inferences to one model, version or label that a front-end received together, each
        decoded and checked against its view of the model (http_frontend/tfserving.py): [connection number,
        its requests, the view's generation, inputs]. Its items as `v2_infer_tensors`', [position, None,
        the outputs] for each answer: the front-end encodes them."""
        requests = [(_tensor_request(generation, InferRequest(inputs)), clients.get(front_end, number, count))
                    for number, count, generation, inputs in calls]
        return _tensor_items(tfserving.infer_group(core, name, version, label, requests),
                             lambda response: [response.outputs])

    def probes() -> list[list[str]]:
        """The routes of the `health` group, which a front-end answers within a deadline of its own."""
        return [[route.method, route.template] for route in dispatcher.routes.routes if route.api == "health"]

    return {"http": http, "v2_infer": v2_infer, "v2_infer_tensors": v2_infer_tensors, "invoke": invoke,
            "invoke_tensors": invoke_tensors, "tfserving": tfserving_infer, "tfserving_tensors": tfserving_tensors,
            "v2_view": lambda name: views.description(core.ready_model(name)), "connection_closed": clients.close,
            "probes": probes}


class _Stale(Exception):
    """A request decoded against a view of a load that no longer serves."""


def _tensor_items(results: Iterator[tuple[int, object]], answer: Callable[[InferResponse], list],
                  tickets: list[Ticket] | None = None) -> GroupItems:
    """group_items of requests a front-end decoded (`_tensor_request`): [position, None, *answer(response)]
    for each answered, and [position, None] alone for one decoded against a load that no longer serves."""
    results = ((position, _STALE if isinstance(result, _Stale) else result) for position, result in results)
    return group_items(results, lambda _, result: [] if result is _STALE else answer(result), tickets)


_STALE = object()


def _tensor_request(generation: int, request: InferRequest):
    """`decode` for infer_group: a request a front-end decoded, answered with the core's response."""

    def decode(lease):
        if lease.view.generation != generation:
            raise _Stale()
        request.checked = True  # against this load's signature, by the front-end
        return request, lambda response: response

    return decode


def _logged(name: str, attributes: str | None, request_id: str, decode):
    """`decode`, and the invoke's custom attributes logged, as one process logs them (not for a request
    decoded against another load: it comes again)."""

    def logged(lease):
        decoded = decode(lease)
        log_attributes(name, attributes, request_id)
        return decoded

    return logged


def _parser(name: str, header_length: str | None, document: dict | None, data, heavy: bool):
    if document is None:
        return parser(name, data if isinstance(data, bytes) else bytes(data), header_length, heavy)
    return lambda _signature: (document, memoryview(data))
