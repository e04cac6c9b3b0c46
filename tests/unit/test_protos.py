"""The shipped .proto files (container/grpc_api/proto/) are current, and protoc compiles them into the
very descriptors the server serves: field for field, method for method."""

import subprocess
import sys

from google.protobuf import descriptor_pb2

from container.grpc_api import protos


def test_the_shipped_files_are_what_the_descriptors_write():
    for name, file in protos.files().items():
        assert (protos.DIRECTORY / name).read_text() == protos.proto_text(file), f"run python -m container.grpc_api.protos ({name})"


def test_protoc_compiles_them_into_the_descriptors_the_server_serves(tmp_path):
    names = sorted(protos.files())
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{protos.DIRECTORY}", f"--descriptor_set_out={tmp_path / 'set'}",
                    *names], check=True)
    compiled = {file.name: file for file in descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "set").read_bytes()).file}
    for name, served in protos.files().items():
        assert _shape(compiled[name]) == _shape(served), name


def _shape(file: descriptor_pb2.FileDescriptorProto) -> dict:
    """What a client depends on: packages, messages, fields, enums and methods (not file names or json names)."""
    def message(m):
        return {"fields": [(f.name, f.number, f.type, f.label, f.type_name, f.HasField("oneof_index")) for f in m.field],
                "nested": [message(n) for n in m.nested_type], "enums": [enum(e) for e in m.enum_type],
                "oneofs": [o.name for o in m.oneof_decl], "map": m.options.map_entry, "name": m.name}

    def enum(e):
        return (e.name, [(v.name, v.number) for v in e.value])

    return {"package": file.package, "messages": [message(m) for m in file.message_type], "enums": [enum(e) for e in file.enum_type],
            "services": [(s.name, [(m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in s.method])
                         for s in file.service]}
