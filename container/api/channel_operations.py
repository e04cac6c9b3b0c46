"""What front-end processes may ask the model process over the channel (channel/server.py): V2's
operations on its documents (v2_dataplane.py), the shared memory regions (which live here, so a region
registered through one front-end serves every front-end), the log and trace settings (log_and_trace.py),
and ModelMesh's runtime API (modelmesh.py);
and what python models' worker processes ask: their BLS calls (`bls_infer`, tensors in and out; `bls_stream`, a decoupled model's responses). Arguments
and answers are plain values and tensors; a ModelConfig crosses as its serialized protobuf."""

from typing import Callable

import numpy as np

from container import content
from container.api import v2_dataplane
from container.api.http_channel import FrontEndClients
from container.api.log_and_trace import log_settings, trace_settings
from container.api.modelmesh import modelmesh_operations
from container.api.shared_memory import SharedMemory
from container.api.v2_generate import generate_events
from container.channel.blobs import large
from container.channel.groups import group_items
from container.core import Core
from container.errors import InvalidInput, InvalidRequest
from container.inference import InferRequest, Ticket, TransformRequest
from container.v2 import documents


def channel_operations(core: Core, shared_memory: SharedMemory, clients: FrontEndClients, log_level: str) -> dict[str, Callable]:
    """`clients`: the front-ends' clients, as the batchers know them (http_channel.py)."""
    def infer(front_end: int, name: str, version: str | None, calls: list[list]):
        """V2 inferences of one model and version that a gRPC front-end received together, each [its
        client's number, the requests that client has made, document, binary data (bytes, or a large
        request's data mapped from shared memory)]. Its items (groups.group_items): TAKEN, then [position,
        None, answer, chunks] for each, or [position, error], as each is done."""
        tickets = [Ticket() for _ in calls]  # the front-end may cancel one call alone (GroupItems.cancel)
        requests = [(v2_dataplane.document_request(core, shared_memory, _parsed(document, binary), documents.heavy(len(binary)),
                                                   ticket), clients.get(front_end, number, count))
                    for (number, count, document, binary), ticket in zip(calls, tickets, strict=True)]
        return group_items(v2_dataplane.infer_group(core, name, version, requests, v2_dataplane.GRPC_DECOUPLED),
                           lambda _, result: [result[0], [large(chunk) for chunk in result[1]]], tickets)

    def infer_stream(name: str, version: str, document: dict, binary):
        """A request of gRPC's stream: [answer, chunks, final, error] for each response (v2_dataplane)."""
        for answer, chunks, final, error in v2_dataplane.infer_stream(
                core, shared_memory, name, version, _parsed(document, binary), heavy=documents.heavy(len(binary))):
            yield [answer, [large(chunk) for chunk in chunks], final, None if error is None else str(error)]

    def bls_infer(name: str, version: int, inputs: dict, outputs: list | None, parameters: dict, request_id: str) -> dict:
        """A python model's call to a model, as Triton's BLS makes it: version -1 is the latest. A
        SageMaker handler model takes one BYTES element, the request body (`content_type` and `accept`
        parameters as its headers), and answers outputs `body` and `content_type`, one element each."""
        with core.lease(name, version if version > 0 else None) as lease:
            if lease.takes_tensors:
                return core.infer(lease, InferRequest(inputs, outputs, parameters, request_id=request_id)).outputs
            response = core.transform(lease, _body_request(name, inputs, parameters, request_id))
            return {"body": np.array([response.body], np.object_),
                    "content_type": np.array([response.content_type.encode()], np.object_)}

    def bls_stream(name: str, version: int, inputs: dict, outputs: list | None, parameters: dict, request_id: str):
        """`bls_infer` with `decoupled=True`: [outputs or None, final, error or None] for each response
        the model sends (one, final, from a model that is not decoupled)."""
        with core.lease(name, version if version > 0 else None) as lease:
            if not lease.takes_tensors:
                raise InvalidRequest(f"model '{name}' is a SageMaker handler model: it sends one response; "
                                     f"call it with decoupled=False")
            for outcome, final in core.responses(lease, InferRequest(inputs, outputs, parameters, request_id=request_id)):
                failed = isinstance(outcome, Exception)
                yield [None if failed else outcome, final, [str(outcome), getattr(outcome, "status", 500)] if failed else None]

    def model_config(name: str, version: str) -> bytes:
        return v2_dataplane.model_config(core, name, version).SerializeToString()

    return {
        "live": core.check_health,
        "ready": lambda: v2_dataplane.check_ready(core),
        "server_metadata": v2_dataplane.server_metadata,
        "model_ready": lambda name, version: v2_dataplane.check_model_ready(core, name, version),
        "model_metadata": lambda name, version: v2_dataplane.model_metadata(core, name, version),
        "model_config": model_config,
        "statistics": lambda name, version: v2_dataplane.statistics(core, name, version),
        "infer": infer,
        "infer_stream": infer_stream,
        "generate_stream": lambda name, version, body: generate_events(core, shared_memory, name, version, body),
        "bls_infer": bls_infer,
        "bls_stream": bls_stream,
        "repository_index": lambda ready: v2_dataplane.repository_index(core, ready),
        "load": lambda name, parameters: v2_dataplane.load(core, name, parameters),
        "unload": lambda name, parameters: v2_dataplane.unload(core, name, parameters),
        "log_settings": lambda update: log_settings(log_level, update),
        "trace_settings": lambda name, update: trace_settings(core, name, update),
        "shm_status": shared_memory.status,
        "shm_register_system": shared_memory.register_system,
        "shm_register_cuda": shared_memory.register_cuda,
        "shm_unregister": shared_memory.unregister,
        **modelmesh_operations(core),
    }


def _parsed(document: dict, binary):
    return lambda _signature: (document, memoryview(binary))


def _body_request(name: str, inputs: dict, parameters: dict, request_id: str) -> TransformRequest:
    body = next(iter(inputs.values()), None) if len(inputs) == 1 else None
    if body is None or body.dtype != np.object_ or body.size != 1 or not isinstance(body.flat[0], bytes):
        raise InvalidInput(f"model '{name}' is a SageMaker handler model: a BLS request to it carries one input, "
                           f"a BYTES tensor of one element holding the request body")
    content_type, accept = parameters.get("content_type"), parameters.get("accept")
    if not isinstance(content_type, (str, type(None))) or not isinstance(accept, (str, type(None))):
        raise InvalidInput("the 'content_type' and 'accept' parameters are strings")
    return TransformRequest(body.flat[0], content.media_type(content_type) if content_type else None, accept,
                            request_id=request_id or None)
