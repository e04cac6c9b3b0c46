"""The gRPC front-end: a process of its own (`python -m container.grpc_api CHANNEL`), grpc.aio with
nothing monkey-patched, serving Triton's GRPCInferenceService, KServe ModelMesh's mmesh.ModelRuntime
and grpc.health.v1. It decodes and encodes protobuf here and asks the model process everything else
over the channel (container/channel/), so no model lives in it and its death loses none."""
