"""grpcio handlers for a protobuf service, made from its descriptor. Each request is parsed here: a
message that does not parse reaches the RPC as `Malformed`, and the client gets INVALID_ARGUMENT with
what was wrong (grpcio's own parsing would answer INTERNAL, a server fault). An RPC answers with its
response message, or with the message already serialized."""

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass


class Malformed:
    def __init__(self, why: str):
        self.why = why


def generic_handler(service, servicer) -> grpc.GenericRpcHandler:
    """`service`: a ServiceDescriptor; `servicer`: an object with a method per RPC, named as the RPC."""
    handlers = {}
    for method in service.methods:
        request = GetMessageClass(method.input_type)
        if method.client_streaming and method.server_streaming:
            kind = grpc.stream_stream_rpc_method_handler
        elif not method.client_streaming and not method.server_streaming:
            kind = grpc.unary_unary_rpc_method_handler
        else:
            raise TypeError(f"{method.full_name}: only unary and bidirectional RPCs are served")
        handlers[method.name] = kind(getattr(servicer, method.name), request_deserializer=_parser(request),
                                     response_serializer=_serialize)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _serialize(message) -> bytes:
    """A response message, or one an RPC serialized itself (messages.infer_response) as it is."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def _parser(message_class):
    def parse(data: bytes):
        try:
            return message_class.FromString(data)
        except DecodeError as exc:
            return Malformed(f"the request is not a valid {message_class.DESCRIPTOR.full_name} message: {exc}")
    return parse
