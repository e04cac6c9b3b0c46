"""`python -m bench.grpc_floor PORT`: grpcio's own cost, the floor under this server's gRPC front-end. The
front-end's server (grpc.aio on uvloop, with the server's options) answers ModelInfer with the tiny
model's answer, made once: no parsing, no channel, no model. What it costs a call, no front-end built on
grpcio can go below."""

import os
import sys

import grpc
import numpy as np
import uvloop
from tritonclient.grpc import service_pb2 as pb

from container.grpc_api.server import options
from container.settings import Settings


def _answer() -> bytes:
    response = pb.ModelInferResponse(model_name="tiny", model_version="1")
    response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 16])
    response.raw_output_contents.append(np.zeros(16, np.float32).tobytes())
    return response.SerializeToString()


async def serve(port: int) -> None:
    answer = _answer()

    async def infer(request: bytes, context) -> bytes:
        return answer

    server = grpc.aio.server(options=options(Settings.from_env(os.environ), shared=False))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)})])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1])))
