"""Triton's `inference.GRPCInferenceService`, each RPC a call over the channel to the model process
(api/channel_operations.py), its answer written as Triton's protobuf. ModelInfer's requests are decoded
here, against this front-end's view of the model (v2/views.py), and cross as tensors, in groups, as an
HTTP front-end's do (http_frontend/inference.py says which go as their documents instead, and why)."""

import asyncio
import base64
import logging
import time
from functools import partial

from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb

from container.body_budget import BodyBudget, no_room
from container.channel.blobs import large
from container.channel.client import ChannelClient
from container.channel.groups import MOST_BYTES, AsyncGroups
from container.errors import Forbidden, InvalidRequest, ModelNotFound, ServeError, Unavailable
from container.grpc_api import messages
from container.grpc_api.clients import Clients
from container.grpc_api.services import Malformed
from container.grpc_api.status import answered, code_of, logged, refused, set_error
from container.settings import Settings
from container.v2 import documents, views
from container.v2.views import TensorView

log = logging.getLogger(__name__)
_STREAM_IN_FLIGHT = 64  # requests of one stream under way at once; the stream reads no more meanwhile


class InferenceService:
    SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name

    def __init__(self, channel: ChannelClient, settings: Settings, clients: Clients):
        self.channel, self.restrictions, self.clients, self.limits = channel, settings.restricted_api, clients, settings.limits
        self._documents = AsyncGroups(channel, "infer")
        self._tensors = AsyncGroups(channel, "v2_infer_tensors")
        self._views = _Views(channel)
        self._streams: set[_Reader] = set()
        self._draining = False
        self._bodies, self._room_timeout = BodyBudget(settings.bodies_per_process), settings.model_server_timeout

    def drain(self) -> None:
        """SIGTERM: each open stream ends once the requests it has under way are answered, at once when it has
        none (as an HTTP front-end closes its idle connections), so that a client holding a stream open does
        not hold the server's stop; unary calls under way finish, as gRPC's own stop lets them."""
        self._draining = True
        for reader in list(self._streams):
            reader.end_when_idle()

    # -- health and metadata ------------------------------------------------------------------------

    @answered("health")
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=await self._succeeds("live"))

    @answered("health")
    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=await self._succeeds("ready"))

    @answered("health")
    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=await self._succeeds("model_ready", request.name, request.version))

    @answered("metadata")
    async def ServerMetadata(self, request, context):
        return messages.from_document(await self.channel.call("server_metadata"), pb.ServerMetadataResponse())

    @answered("metadata")
    async def ModelMetadata(self, request, context):
        document = await self.channel.call("model_metadata", request.name, request.version)
        return messages.from_document(document, pb.ModelMetadataResponse())

    @answered("model-config")
    async def ModelConfig(self, request, context):
        config = await self.channel.call("model_config", request.name, request.version)
        return pb.ModelConfigResponse(config=model_config_pb2.ModelConfig.FromString(config))

    @answered("statistics")
    async def ModelStatistics(self, request, context):
        document = await self.channel.call("statistics", request.name or None, request.version)
        return messages.from_document(document, pb.ModelStatisticsResponse())

    # -- inference ----------------------------------------------------------------------------------

    @answered("inference")
    async def ModelInfer(self, request, context):
        size = await self._room(request)
        try:
            return await self._infer(request, context.peer())
        finally:
            self._bodies.give(size)

    async def _room(self, request) -> int:
        """`request` counted among the requests this process holds (body_budget.py), to be given back once it
        is answered: its size. (A plain await and try, where an async context manager cost 2 µs a call.)"""
        size = sum(map(len, request.raw_input_contents)) or request.ByteSize()  # (which encodes the message)
        if not await self._bodies.take_async(size, self._room_timeout):
            raise no_room(self._room_timeout)
        return size

    async def ModelStreamInfer(self, request_iterator, context):
        """Requests of a stream start in the order they arrive (a sequence's order holds) and may overlap;
        each answer, or its error in `error_message`, goes back as it is ready, and the stream lives on. A
        decoupled model's request gets each of its responses as the model sends it. The answers of one
        sequence's requests go in the order the requests came, which is the order they ran (as Triton's
        stream sends them, and as clients read them back)."""
        if refused(self.restrictions, "inference", context):
            logged(f"/{self.SERVICE}/ModelStreamInfer", None, Forbidden.status, time.perf_counter(), context)
            return
        answers: asyncio.Queue = asyncio.Queue()
        slots = asyncio.Semaphore(_STREAM_IN_FLIGHT)
        reader = _Reader()
        reader.task = reading = asyncio.create_task(self._read_stream(request_iterator, answers, slots, reader))
        reading.add_done_callback(lambda _: answers.put_nowait(None))  # cancelled before it ran, too
        self._streams.add(reader)
        if self._draining:
            reader.end_when_idle()
        try:
            while (answer := await answers.get()) is not None:
                yield answer
        finally:
            reading.cancel()
            self._streams.discard(reader)
        if reading.cancelled():  # ended by the server's stop: the client is told so, and what it sent since is not lost unseen
            stopped = Unavailable("the server is shutting down; send the requests not answered again, on a new stream")
            set_error(context, code_of(stopped), str(stopped))

    async def _read_stream(self, request_iterator, answers: asyncio.Queue, slots: asyncio.Semaphore, reader: "_Reader") -> None:
        latest: dict[tuple, asyncio.Task] = {}  # each sequence's latest request on this stream, while under way
        try:
            async for request in request_iterator:
                await slots.acquire()
                sequence = _sequence_of(request)
                task = asyncio.create_task(self._stream_answer(request, answers, slots, latest.get(sequence)))
                if sequence is not None:
                    latest[sequence] = task
                    task.add_done_callback(partial(_forget, latest, sequence))
                reader.started(task)
            if reader.under_way:
                await asyncio.wait(set(reader.under_way))
        finally:  # ended early, the stream was cancelled or its client went away: so are its requests under way
            for task in list(reader.under_way):
                task.cancel()

    async def _stream_answer(self, request, answers: asyncio.Queue, slots: asyncio.Semaphore, after: asyncio.Task | None) -> None:
        """One request of a stream, logged as its last answer goes (an error a decoupled model sent in one of
        its responses leaves the request itself answered); `after`: the request of its sequence before it,
        whose answers go first."""
        started, status = time.perf_counter(), 200
        try:
            if isinstance(request, Malformed):
                raise InvalidRequest(request.why)
            marked = messages.FINAL_FLAG in request.parameters and request.parameters[messages.FINAL_FLAG].bool_param
            size = await self._room(request)
            try:
                await self._answer_in_stream(request, marked, answers, after)
            finally:
                self._bodies.give(size)
        except ServeError as exc:
            status = exc.status
            answers.put_nowait(pb.ModelStreamInferResponse(error_message=str(exc)))
        except asyncio.CancelledError:  # the stream ended first
            status = 499
            raise
        except Exception:
            status = 500
            log.exception("gRPC stream request failed")
            answers.put_nowait(pb.ModelStreamInferResponse(error_message="internal error; see the server's log"))
        finally:
            slots.release()
            logged(f"/{self.SERVICE}/ModelStreamInfer", request, status, started)

    async def _answer_in_stream(self, request, marked: bool, answers: asyncio.Queue, after: asyncio.Task | None) -> None:
        document, binary = messages.infer_document(request)
        async for answer, chunks, final, error in self.channel.stream(
                "infer_stream", request.model_name, request.model_version, document, large(binary)):
            if after is not None:  # it ran after the request before it, whose answer the model process may send later
                await asyncio.wait([after])
                after = None
            if error is not None:  # one response of a decoupled model carried an error
                answers.put_nowait(pb.ModelStreamInferResponse(error_message=error))
                continue
            if answer is None and not marked:  # a final flag alone: the client did not ask to see it
                continue
            answers.put_nowait(messages.infer_response(answer or _empty(request, document), chunks, final, stream=True))

    async def _infer(self, request, peer: str) -> bytes:
        """The requests for one model that arrive together cross the channel as one group
        (channel/groups.py): as tensors decoded here, or as their documents."""
        document, binary = messages.infer_document(request)
        name, version = request.model_name, request.model_version
        key, client = (name, version), self.clients.seen(peer)
        heavy = documents.heavy(len(binary))
        here = not heavy and not documents.names_shared_memory(document)  # the regions are the model process's
        for _ in range(views.TRIES if here else 0):
            view = await self._views.get(name)
            decoded = view and views.decode(view, document, binary, self.limits, name)
            if not decoded:
                break
            inferred, requested = decoded
            try:
                answer = await self._tensors.call(key, views.tensor_call(client, view, inferred),
                                                  views.call_size(len(binary), inferred.inputs))
            except ModelNotFound:
                self._views.not_found(name, view, bool(version))
                raise
            if answer:
                ran, outputs = answer
                encode = partial(documents.answer, document, inferred, name, ran, outputs, requested, view.signature,
                                 view.labels, None)
                return messages.infer_response(*(await asyncio.to_thread(encode) if documents.heavy_outputs(outputs)
                                                 else encode()))
            self._views.stale(name, view)  # decoded against a load that no longer serves
        answer, chunks = await self._documents.call(key, [*client, document, large(binary)], MOST_BYTES if heavy else len(binary))
        return messages.infer_response(answer, chunks)

    # -- the model repository -----------------------------------------------------------------------

    @answered("model-repository")
    async def RepositoryIndex(self, request, context):
        _one_repository(request.repository_name)
        entries = await self.channel.call("repository_index", request.ready)
        return messages.from_document({"models": entries}, pb.RepositoryIndexResponse())

    @answered("model-repository")
    async def RepositoryModelLoad(self, request, context):
        _one_repository(request.repository_name)
        await self.channel.call("load", request.model_name, messages.parameters_of(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @answered("model-repository")
    async def RepositoryModelUnload(self, request, context):
        _one_repository(request.repository_name)
        await self.channel.call("unload", request.model_name, messages.parameters_of(request.parameters))
        return pb.RepositoryModelUnloadResponse()

    # -- shared memory ------------------------------------------------------------------------------

    @answered("shared-memory")
    async def SystemSharedMemoryStatus(self, request, context):
        return await self._regions("system", request.name, pb.SystemSharedMemoryStatusResponse())

    @answered("shared-memory")
    async def SystemSharedMemoryRegister(self, request, context):
        await self.channel.call("shm_register_system", request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @answered("shared-memory")
    async def SystemSharedMemoryUnregister(self, request, context):
        await self.channel.call("shm_unregister", "system", request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    @answered("shared-memory")
    async def CudaSharedMemoryStatus(self, request, context):
        return await self._regions("cuda", request.name, pb.CudaSharedMemoryStatusResponse())

    @answered("shared-memory")
    async def CudaSharedMemoryRegister(self, request, context):
        handle = {"b64": base64.b64encode(request.raw_handle).decode()}  # as the HTTP body carries it
        await self.channel.call("shm_register_cuda", request.name, handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @answered("shared-memory")
    async def CudaSharedMemoryUnregister(self, request, context):
        await self.channel.call("shm_unregister", "cuda", request.name or None)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- trace and log settings ---------------------------------------------------------------------

    @answered("trace")
    async def TraceSetting(self, request, context):
        update = {key: _trace_value(key, list(setting.value)) for key, setting in request.settings.items()}
        response = pb.TraceSettingResponse()
        for key, value in (await self.channel.call("trace_settings", request.model_name, update)).items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @answered("logging")
    async def LogSettings(self, request, context):
        update = {key: messages.parameter_value(setting) for key, setting in request.settings.items()}
        response = pb.LogSettingsResponse()
        for key, value in (await self.channel.call("log_settings", update)).items():
            setting = response.settings[key]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = value
        return response

    async def _regions(self, kind: str, name: str, response):
        """The registered regions of `kind` (one, when `name` is not empty) in a status response."""
        for region in await self.channel.call("shm_status", kind, name or None):
            response.regions[region["name"]].CopyFrom(type(response).RegionStatus(**region))
        return response

    async def _succeeds(self, op: str, *args) -> bool:
        """Whether the model process answers `op` without an error: health, which is never an error itself."""
        try:
            await self.channel.call(op, *args)
        except (Unavailable, ModelNotFound):
            return False
        return True


def _trace_value(key: str, values: list[str]):
    """A TraceSetting value as Triton's HTTP writes it (log_and_trace.py): the levels a list, any other
    setting one string; an empty list clears the setting."""
    if not values:
        return None
    return values if key == "trace_level" or len(values) > 1 else values[0]


def _one_repository(name: str) -> None:
    if name:
        raise InvalidRequest(f"repository '{name}' is not this server's: it has one model repository; leave the name empty")


def _sequence_of(request) -> tuple | None:
    """The model, version and sequence a stream's request belongs to; None outside a sequence."""
    if isinstance(request, Malformed) or "sequence_id" not in request.parameters:
        return None
    sequence_id = messages.parameter_value(request.parameters["sequence_id"])
    return (request.model_name, request.model_version, sequence_id) if sequence_id else None


def _forget(latest: dict, sequence: tuple, task: asyncio.Task) -> None:
    if latest.get(sequence) is task:
        del latest[sequence]


def _empty(request, document: dict) -> dict:
    """The answer that carries a decoupled model's final flag alone, as Triton sends it: no outputs."""
    return {"model_name": request.model_name, "model_version": request.model_version, "id": document.get("id", ""),
            "outputs": []}


class _Reader:
    """What one stream has under way: the task reading its requests and the task of each request it started.
    Told to end when idle (the server stops), it stops reading once none is under way, and the stream ends."""

    __slots__ = ("task", "under_way", "ending")

    def __init__(self):
        self.task: asyncio.Task | None = None
        self.under_way: set[asyncio.Task] = set()
        self.ending = False

    def started(self, request: asyncio.Task) -> None:
        self.under_way.add(request)
        request.add_done_callback(self._answered)

    def end_when_idle(self) -> None:
        self.ending = True
        if not self.under_way:
            self.task.cancel()

    def _answered(self, request: asyncio.Task) -> None:
        self.under_way.discard(request)
        if self.ending and not self.under_way:
            self.task.cancel()


class _Views(views.Views):
    """On the asyncio loop."""

    def __init__(self, channel: ChannelClient):
        super().__init__()
        self.channel = channel

    async def get(self, name: str) -> TensorView | None:
        """This front-end's view of `name` (http_frontend/views.py's `FrontEndViews.get`)."""
        view = self.views.get(name)
        if view is not None:
            return view
        fetching = self.fetching.get(name)
        if fetching is None:
            fetching = self.fetching[name] = asyncio.ensure_future(self._fetch(name))
            fetching.add_done_callback(lambda _: self.fetching.pop(name, None))
        return await asyncio.shield(fetching)  # a caller that goes away does not cancel the others' fetch

    async def _fetch(self, name: str) -> TensorView | None:
        try:
            return self.keep(name, await self.channel.call("v2_view", name))
        except ServeError:
            return None
