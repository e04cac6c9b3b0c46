"""KServe ModelMesh's runtime API, `mmesh.ModelRuntime`: ModelMesh asks a runtime's status once at
its start, then loads, sizes and unloads models on it, and forwards `inference.GRPCInferenceService`
calls to it with the model id injected into `model_name`. Its messages are declared here from the
published API's field numbers and types (no generated code), and each RPC is one channel call
(api/modelmesh.py). The API loads models: it is in the `model-repository` group of
SERVE_RESTRICTED_API."""

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message_factory import GetMessageClass

from container.grpc_api.status import answered

_STRING, _UINT64, _UINT32, _BOOL, _ENUM, _MESSAGE = (
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING, descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32, descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    descriptor_pb2.FieldDescriptorProto.TYPE_ENUM, descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE)
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_MODEL = [("modelId", 1, _STRING), ("modelType", 2, _STRING), ("modelPath", 3, _STRING), ("modelKey", 4, _STRING)]
_MESSAGES = {
    "LoadModelRequest": _MODEL,
    "LoadModelResponse": [("sizeInBytes", 1, _UINT64), ("maxConcurrency", 2, _UINT32)],
    "UnloadModelRequest": [("modelId", 1, _STRING)],
    "UnloadModelResponse": [],
    "PredictModelSizeRequest": _MODEL,
    "PredictModelSizeResponse": [("sizeInBytes", 1, _UINT64)],
    "ModelSizeRequest": [("modelId", 1, _STRING)],
    "ModelSizeResponse": [("sizeInBytes", 1, _UINT64)],
    "RuntimeStatusRequest": [],
    "RuntimeStatusResponse": [
        ("status", 1, _ENUM, ".mmesh.RuntimeStatusResponse.Status"), ("capacityInBytes", 2, _UINT64),
        ("maxLoadingConcurrency", 3, _UINT32), ("modelLoadingTimeoutMs", 4, _UINT32),
        ("defaultModelSizeInBytes", 5, _UINT64), ("runtimeVersion", 6, _STRING), ("numericRuntimeVersion", 7, _UINT64),
        ("methodInfos", 8, _MESSAGE, ".mmesh.RuntimeStatusResponse.MethodInfosEntry", _REPEATED),
        ("limitModelConcurrency", 9, _BOOL), ("allowAnyMethod", 10, _BOOL)],
}
_METHODS = [("loadModel", "LoadModel"), ("unloadModel", "UnloadModel"), ("predictModelSize", "PredictModelSize"),
            ("modelSize", "ModelSize"), ("runtimeStatus", "RuntimeStatus")]
# the inference RPCs ModelMesh may forward, and where their request names the model: field 1, model_name
INJECTED = {f"inference.GRPCInferenceService/{method}": [1]
            for method in ("ModelInfer", "ModelStreamInfer", "ModelMetadata", "ModelReady", "ModelConfig", "ModelStatistics")}


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="container/mmesh/model-runtime.proto", package="mmesh", syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, *more in fields:
            field = message.field.add(name=field_name, number=number, type=kind, json_name=field_name,
                                      label=more[1] if len(more) > 1 else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            if more:
                field.type_name = more[0]
    status = file.message_type[list(_MESSAGES).index("RuntimeStatusResponse")]
    status.enum_type.add(name="Status").value.extend([
        descriptor_pb2.EnumValueDescriptorProto(name=n, number=i) for i, n in enumerate(("STARTING", "READY", "FAILING"))])
    status.nested_type.add(name="MethodInfo").field.add(name="idInjectionPath", json_name="idInjectionPath", number=1,
                                                        type=_UINT32, label=_REPEATED)
    entry = status.nested_type.add(name="MethodInfosEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", json_name="key", number=1, type=_STRING)
    entry.field.add(name="value", json_name="value", number=2, type=_MESSAGE, type_name=".mmesh.RuntimeStatusResponse.MethodInfo")
    service = file.service.add(name="ModelRuntime")
    for method, message in _METHODS:
        service.method.add(name=method, input_type=f".mmesh.{message}Request", output_type=f".mmesh.{message}Response")
    return file


POOL = descriptor_pool.DescriptorPool()
DESCRIPTOR = POOL.Add(_file())
SERVICE = DESCRIPTOR.services_by_name["ModelRuntime"]
messages = {name: GetMessageClass(DESCRIPTOR.message_types_by_name[name]) for name in _MESSAGES}


class ModelRuntimeService:
    SERVICE = SERVICE.full_name

    def __init__(self, channel, settings):
        self.channel, self.restrictions = channel, settings.restricted_api

    @answered("model-repository")
    async def runtimeStatus(self, request, context):
        """ModelMesh asks only as it starts, and starts from nothing: every loaded model is unloaded
        first, as the API asks. READY once the models named at start have loaded."""
        status = await self.channel.call("mm_status")
        answer = messages["RuntimeStatusResponse"](
            status=1 if status["ready"] else 0, capacityInBytes=status["capacity"],
            maxLoadingConcurrency=status["load_concurrency"], modelLoadingTimeoutMs=0,
            defaultModelSizeInBytes=status["default_model_size"], runtimeVersion=status["version"])
        for method, path in INJECTED.items():
            answer.methodInfos[method].idInjectionPath.extend(path)
        return answer

    @answered("model-repository")
    async def loadModel(self, request, context):
        size = await self.channel.call("mm_load", request.modelId, request.modelPath)
        return messages["LoadModelResponse"](sizeInBytes=size)

    @answered("model-repository")
    async def unloadModel(self, request, context):
        await self.channel.call("mm_unload", request.modelId)
        return messages["UnloadModelResponse"]()

    @answered("model-repository")
    async def modelSize(self, request, context):
        return messages["ModelSizeResponse"](sizeInBytes=await self.channel.call("mm_size", request.modelId))

    @answered("model-repository")
    async def predictModelSize(self, request, context):
        return messages["PredictModelSizeResponse"](sizeInBytes=await self.channel.call("mm_predict_size", request.modelPath))
