"""A gRPC stream answers one sequence's requests in the order they came, the order they ran, whatever the
order the model process sends those answers in (grpc_api/inference_service.py): the model process may
send a sequence's next answer before the one before it (a request whose result waits on a thread before
its answer goes, as the first requests after a load do while their model is measured again). Clients read
a sequence's answers back in that order (Triton's sequence stream example does). The front-end is the real
one, InferenceService in a grpc.aio server, driven with tritonclient's stream; the model process is a
ChannelServer on a gevent hub of its own thread, holding the request named "held" until the test releases it."""

import asyncio
import queue
import threading

import gevent
import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from gevent.event import Event
from tritonclient.grpc import service_pb2 as pb

from container.channel.client import ChannelClient
from container.channel.server import ChannelServer
from container.grpc_api.clients import Clients
from container.grpc_api.inference_service import InferenceService
from container.grpc_api.services import generic_handler
from container.settings import Settings
from tests import grpc_clients
from tests.builders import wait_for

DEADLINE = 10  # seconds


class ModelProcess:
    """`infer_stream` answers each request at once with its id and no outputs, but the one with id "held",
    which it answers once released; `answered`: the ids answered, in the order they were sent."""

    def __init__(self, path: str):
        self.path, self.answered = path, []
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        assert started.wait(DEADLINE), "the model process did not start"

    def _run(self, started: threading.Event) -> None:
        self._hub, self._released, self._stop = gevent.get_hub(), Event(), Event()
        server = ChannelServer(self.path, {"infer_stream": self._infer_stream}, 1 << 20)
        server.start()
        started.set()
        self._stop.wait()
        server.drain(1)

    def _infer_stream(self, name: str, version: str, document: dict, binary):
        if document["id"] == "held":
            self._released.wait(DEADLINE)
        self.answered.append(document["id"])
        yield [{"model_name": name, "model_version": version or "1", "id": document["id"], "outputs": []}, [], True, None]

    def release(self) -> None:
        self._hub.loop.run_callback_threadsafe(self._released.set)

    def stop(self) -> None:
        self._hub.loop.run_callback_threadsafe(self._stop.set)
        self._thread.join(DEADLINE)


class FrontEnd:
    """The gRPC front-end's InferenceService on a grpc.aio server, on an asyncio loop of its own thread."""

    def __init__(self, channel_path: str):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self._run(self._start(channel_path))

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(DEADLINE)

    async def _start(self, channel_path: str) -> int:
        self._channel = ChannelClient(channel_path)
        self._channel.start()
        assert await self._channel.wait_connected(DEADLINE)
        service = InferenceService(self._channel, Settings.from_env({}), Clients())
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers([generic_handler(pb.DESCRIPTOR.services_by_name["GRPCInferenceService"], service)])
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    def stop(self) -> None:
        self._run(self._server.stop(0))
        self._run(self._channel.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(DEADLINE)
        self._loop.close()


@pytest.fixture
def servers(tmp_path):
    model_process = ModelProcess(str(tmp_path / "models.sock"))
    front_end = FrontEnd(model_process.path)
    yield model_process, front_end
    model_process.release()
    front_end.stop()
    model_process.stop()


@pytest.fixture
def stream(servers):
    """Send (request id, sequence id) on one stream; `answers` gets each answer's id as it comes."""
    client = grpc_clients.InferenceServerClient(f"127.0.0.1:{servers[1].port}")
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result.get_response().id),
                        stream_timeout=DEADLINE)
    number = triton.InferInput("x", [1], "FP32")
    number.set_data_from_numpy(np.ones(1, np.float32))

    def send(request_id: str, sequence_id: int) -> None:
        client.async_stream_infer("m", [number], request_id=request_id, sequence_id=sequence_id,
                                  sequence_start=request_id == "held")

    send.answers = answers
    yield send
    client.stop_stream()
    client.close()


def test_a_sequence_s_answers_go_in_the_order_its_requests_came_though_the_model_process_sent_them_otherwise(servers, stream):
    model_process, _ = servers
    stream("held", 7)
    stream("next", 7)
    wait_for(lambda: model_process.answered == ["next"], DEADLINE, "the model process never answered the later request")
    model_process.release()
    assert [stream.answers.get(timeout=DEADLINE) for _ in range(2)] == ["held", "next"]
    assert model_process.answered == ["next", "held"]


def test_the_answers_of_other_sequences_do_not_wait_for_it(servers, stream):
    model_process, _ = servers
    stream("held", 7)
    stream("other sequence", 8)
    assert stream.answers.get(timeout=DEADLINE) == "other sequence"  # while "held" is still held
    model_process.release()
    assert stream.answers.get(timeout=DEADLINE) == "held"
