"""The gRPC API as `.proto` files, the counterpart of the HTTP side's OpenAPI document: written from
the descriptors the server itself serves (Triton's `grpc_service.proto` and `model_config.proto`, as
tritonclient ships them compiled, and ModelMesh's runtime API, declared in modelmesh_service.py), so
they cannot differ from what it answers. `python -m container.grpc_api.protos` writes them into
container/grpc_api/proto/, which the package ships; a test checks they are current."""

import sys
from pathlib import Path

from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb

from container.grpc_api import modelmesh_service

DIRECTORY = Path(__file__).with_name("proto")
_FIELD = descriptor_pb2.FieldDescriptorProto
_SCALARS = {value: name.removeprefix("TYPE_").lower() for name, value in _FIELD.Type.items()
            if name not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")}


def files() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """File name → descriptor, for every file the server's gRPC services use."""
    found = {}
    for module_descriptor in (model_config_pb2.DESCRIPTOR, pb.DESCRIPTOR, modelmesh_service.DESCRIPTOR):
        proto = descriptor_pb2.FileDescriptorProto()
        module_descriptor.CopyToProto(proto)
        found[Path(proto.name).name] = proto
    return found


def proto_text(file: descriptor_pb2.FileDescriptorProto) -> str:
    lines = ["// Written by `python -m container.grpc_api.protos` from the descriptors the server serves.",
             f'syntax = "{file.syntax or "proto2"}";', "", f"package {file.package};"]
    if file.dependency:
        lines += ["", *(f'import "{Path(dependency).name}";' for dependency in file.dependency)]
    for service in file.service:
        lines += ["", f"service {service.name} {{"]
        for method in service.method:
            into, out = ("stream " if method.client_streaming else ""), ("stream " if method.server_streaming else "")
            lines.append(f"  rpc {method.name}({into}{method.input_type}) returns ({out}{method.output_type});")
        lines.append("}")
    for enum in file.enum_type:
        lines += ["", *_enum(enum, "")]
    for message in file.message_type:
        lines += ["", *_message(message, "")]
    return "\n".join(lines) + "\n"


def _message(message, indent: str) -> list[str]:
    maps = {nested.name: nested for nested in message.nested_type if nested.options.map_entry}
    lines = [f"{indent}message {message.name} {{"]
    for enum in message.enum_type:
        lines += _enum(enum, indent + "  ")
    for nested in message.nested_type:
        if nested.name not in maps:
            lines += _message(nested, indent + "  ")
    written: set[int] = set()  # the oneofs written, each where its first field stands
    for field in message.field:
        if not field.HasField("oneof_index"):
            repeated = field.label == _FIELD.LABEL_REPEATED and not _map_entry(field, maps)
            lines.append(f"{indent}  {'repeated ' if repeated else ''}{_field(field, maps)}")
        elif field.oneof_index not in written:
            written.add(field.oneof_index)
            members = [f for f in message.field if f.HasField("oneof_index") and f.oneof_index == field.oneof_index]
            lines += [f"{indent}  oneof {message.oneof_decl[field.oneof_index].name} {{",
                      *(f"{indent}    {_field(f, maps)}" for f in members), f"{indent}  }}"]
    return lines + [f"{indent}}}"]


def _field(field, maps: dict) -> str:
    return f"{_type(field, maps)} {field.name} = {field.number};"


def _enum(enum, indent: str) -> list[str]:
    return [f"{indent}enum {enum.name} {{", *(f"{indent}  {v.name} = {v.number};" for v in enum.value), f"{indent}}}"]


def _map_entry(field, maps: dict):
    return maps.get(field.type_name.rpartition(".")[2]) if field.type == _FIELD.TYPE_MESSAGE else None


def _type(field, maps: dict) -> str:
    entry = _map_entry(field, maps)
    if entry is not None:
        key, value = entry.field
        return f"map<{_type(key, {})}, {_type(value, {})}>"
    return _SCALARS.get(field.type) or field.type_name


def write(directory: Path = DIRECTORY) -> None:
    directory.mkdir(exist_ok=True)
    for name, file in files().items():
        (directory / name).write_text(proto_text(file))


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else DIRECTORY)
