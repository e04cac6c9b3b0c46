"""Requests that cross the channel as one group keep each its own meaning: in a group, one request's
failure is its own, priorities order executions and queue timeouts expire as they do for requests that
came apart, and a sequence keeps its order whichever front-ends its requests come through. The groups
here are sent over the real model process's channel by this test acting as front-ends, so that their
makeup is the test's, not the timing's; the HTTP tests send a burst through a real front-end."""

import asyncio
import itertools
import json
import os
import socket

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from container.api.pipeline import Request
from container.channel import socket_path, wire
from container.channel.client import ChannelClient
from container.channel.groups import TAKEN
from container.grpc_api.clients import Clients
from container.grpc_api.inference_service import InferenceService
from container.grpc_api.services import generic_handler
from container.http_frontend.server import ChannelDispatcher
from container.settings import Settings
from tests import grpc_clients
from tests.builders import Scale, cycles_of_ours, fp32_model, handler_model, poll, tensor, triton_model, wait_for
from tests.integration.test_scheduling import SEQUENCE, Accumulate

DOCUMENT = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
ECHO = """
def model_fn(model_dir):
    return None


def transform_fn(model, body, content_type, accept):
    if body in (b"boom", "boom"):  # JSON reaches the script as text
        raise ValueError("no boom here")
    return body, "application/octet-stream"
"""


class FrontEnd:
    """This test as a front-end process of `server`: calls over the model process's channel, each front-end
    known to it by a number of its own (a front-end's pid)."""

    def __init__(self, server, number: int):
        self.number = number
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(socket_path(server.process.pid))
        self._ids = itertools.count()
        self._buffer = b""

    def group(self, op: str, name: str, calls: list, key: tuple = (None,)) -> list:
        """The items of `op`'s answer to one group of `calls` to `name` and the rest of the group's `key`
        (a version, say), in the order the model process sent them, after the first, which says it took
        the group up."""
        taken, *items = self._exchange(op, [self.number, name, *key, calls])[0]
        assert taken == TAKEN
        return items

    def call(self, op: str, *args):
        return self._exchange(op, list(args))[1]

    def _exchange(self, op: str, args: list) -> tuple[list, object]:
        call_id = next(self._ids)
        self.sock.sendall(wire.pack([call_id, op, args]))
        items = []
        while True:
            answered, kind, result = wire.unpack(self._frame())
            assert answered == call_id
            if kind == wire.ITEMS:
                items += result
            elif kind == wire.ITEM:
                items.append(result)
            else:
                assert kind == wire.ANSWER, result
                return items, result

    def close(self) -> None:
        self.sock.close()

    def _frame(self) -> bytes:
        while len(self._buffer) < wire.LENGTH.size or \
                len(self._buffer) < wire.LENGTH.size + wire.LENGTH.unpack_from(self._buffer)[0]:
            data = self.sock.recv(1 << 16)
            assert data, "the model process closed the channel"
            self._buffer += data
        (length,) = wire.LENGTH.unpack_from(self._buffer)
        frame, self._buffer = self._buffer[4:4 + length], self._buffer[4 + length:]
        return frame


def document_call(connection: int, document: dict | None = None, body: bytes = b"") -> list:
    """One request of a `v2_infer` group: its document, or None and a body for the model process to parse."""
    return [connection, 2, None, document, body, False]


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "double", Scale())
    fp32_model(root, "reshaped", Scale())  # reloaded by a test with another shape
    # one request per execution and one instance: the queue's order is the order of execution
    fp32_model(root, "queued", Scale(), max_batch_size=1,
               dynamic_batching={"priority_levels": 2, "default_priority_level": 2,
                                 "default_queue_policy": {"allow_timeout_override": True}})
    triton_model(root, "accumulate", Accumulate(), [tensor("INPUT", "TYPE_FP32", [1])],
                 [tensor("OUTPUT", "TYPE_FP32", [1]), tensor("CONTROLS", "TYPE_FP32", [4])], max_batch_size=4,
                 sequence_batching={**SEQUENCE, "max_sequence_idle_microseconds": 60_000_000})
    handler_model(root, "echo", ECHO)
    server = start_server(root, SERVE_LOAD_MODELS="double,queued,accumulate,reshaped,echo", SERVE_HTTP_WORKERS="1")
    wait_for(lambda: server.ready() and server.grpc_ready(), 60, "the models did not load, or gRPC did not listen")
    return server


@pytest.fixture
def front_ends(server):
    made = [FrontEnd(server, number) for number in (os.getpid(), os.getpid() + 1_000_000)]
    yield made
    for front_end in made:
        front_end.close()


def test_in_a_group_a_malformed_request_and_a_missing_input_fail_alone(front_ends):
    missing = {"inputs": [{"name": "z", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    items = front_ends[0].group("v2_infer", "double", [document_call(1, DOCUMENT), document_call(2, None, b"{not json"),
                                                       document_call(3, missing), document_call(4, DOCUMENT)])
    by_position = {item[0]: item[1:] for item in items}
    assert sorted(by_position) == [0, 1, 2, 3]
    for position in (0, 3):
        error, body, headers = by_position[position]
        assert error is None and json.loads(body)["outputs"][0]["data"] == [2, 4, 6, 8]
    assert by_position[1][0][0] == "InvalidRequest" and "malformed JSON" in by_position[1][0][1]
    assert by_position[2][0][2] == 400 and "'z'" in by_position[2][0][1]


def test_a_group_for_a_model_that_is_not_there_is_told_so_request_by_request(front_ends):
    items = front_ends[0].group("v2_infer", "nobody", [document_call(1, DOCUMENT), document_call(2, None, b"{not json")])
    assert [(position, error[2]) for position, error in items] == [(0, 404), (1, 404)]


def test_priorities_order_the_executions_of_one_group(front_ends):
    high = {**DOCUMENT, "parameters": {"priority": 1}}
    items = front_ends[0].group("v2_infer", "queued", [document_call(n, DOCUMENT) for n in (1, 2)] + [document_call(3, high)])
    assert [item[0] for item in items] == [2, 0, 1]
    assert all(item[1] is None for item in items)


def test_a_queue_timeout_in_a_group_expires_that_request_alone(front_ends):
    hurried = {**DOCUMENT, "parameters": {"timeout": 1}}  # µs: it expires while the first request runs
    items = dict((item[0], item[1:]) for item in front_ends[0].group(
        "v2_infer", "queued", [document_call(1, DOCUMENT), document_call(2, hurried), document_call(3, DOCUMENT)]))
    assert items[0][0] is None and items[2][0] is None
    assert items[1][0][0] == "QueueTimeout"


def test_a_sequence_keeps_its_order_through_different_front_ends(front_ends):
    totals = []
    for step in range(8):
        parameters = {"sequence_id": 77, "sequence_start": step == 0, "sequence_end": step == 7}
        document = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [step + 1]}],
                    "outputs": [{"name": "OUTPUT"}], "parameters": parameters}
        [(_, error, body, _)] = front_ends[step % 2].group("v2_infer", "accumulate", [document_call(1, document)])
        assert error is None
        totals.append(json.loads(body)["outputs"][0]["data"][0])
    assert totals == list(itertools.accumulate(range(1, 9)))


@pytest.mark.parametrize(("path", "good", "bad", "refused"), [
    ("/v2/models/double/infer", json.dumps(DOCUMENT).encode(), b"{not json", 400),
    ("/models/double/invoke", b"[[1, 2, 3, 4]]", b"[[1, 2", 400),
    ("/models/echo/invoke", b"[1]", b"boom", 500),  # the handler raised
    ("/v1/models/double:predict", b'{"instances": [[1, 2, 3, 4]]}', b'{"instances": [[1, 2', 400),
])
def test_in_a_burst_through_a_front_end_a_bad_request_and_a_client_that_hung_up_lose_the_others_nothing(
        server, path, good, bad, refused):
    requests = [good, bad, good, good, good]
    connections = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in requests]
    for sock, payload in zip(connections, requests, strict=True):
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), len(payload), payload))
    connections[2].close()  # hung up before its answer
    try:
        statuses = [_status(sock) for position, sock in enumerate(connections) if position != 2]
    finally:
        for sock in connections:
            sock.close()
    assert statuses == [200, refused, 200, 200]
    answer = server.request("POST", path, data=good, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200


def _status(sock: socket.socket) -> int:
    head = b""
    while b"\r\n" not in head:
        data = sock.recv(1024)
        assert data, "the connection closed without an answer"
        head += data
    return int(head.split(b" ", 2)[1])


def test_tensors_decoded_by_a_front_end_against_an_earlier_load_are_decoded_again(server, front_ends):
    """A front-end's view names the load it was made from; a call decoded against another load is not run
    but answered as stale, so that the front-end fetches the view again."""
    generation, *_ = front_ends[0].call("v2_view", "double")
    x = np.ones((1, 4), np.float32)
    items = front_ends[0].group("v2_infer_tensors", "double", [[1, 2, generation, {"x": x}, None, {}, ""],
                                                               [2, 2, generation + 1000, {"x": x}, None, {}, ""]])
    by_position = {item[0]: item[1:] for item in items}
    assert by_position[0][0] is None and np.array_equal(by_position[0][2]["y"], 2 * x)
    assert by_position[1] == [None]


def test_after_a_reload_that_changes_the_signature_the_front_ends_decode_against_the_new_one(server):
    """The front-ends' views of the first load (HTTP's and gRPC's) would take [1, 4] and refuse [1, 2];
    after the reload, the answers are the new load's: [1, 2] served, [1, 4] refused in the model
    process's words."""
    def infer(values: list) -> tuple[int, dict]:
        document = {"inputs": [{"name": "x", "shape": [1, len(values)], "datatype": "FP32", "data": values}]}
        answer = server.request("POST", "/v2/models/reshaped/infer", json=document)
        return answer.status_code, answer.json()

    def infer_grpc(values: list):
        x = np.array([values], np.float32)
        inputs = [triton_grpc.InferInput("x", list(x.shape), "FP32")]
        inputs[0].set_data_from_numpy(x)
        with grpc_clients.InferenceServerClient(server.grpc_url) as client:
            try:
                return client.infer("reshaped", inputs, client_timeout=30).as_numpy("y").tolist()
            except InferenceServerException as exc:
                return exc.message()

    assert infer([1, 2, 3, 4]) == (200, {"model_name": "reshaped", "model_version": "1", "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [1, 4], "data": [2, 4, 6, 8]}]})
    assert infer_grpc([1, 2, 3, 4]) == [[2, 4, 6, 8]]
    config = {"max_batch_size": 8, "input": [tensor("x", "TYPE_FP32", [2])], "output": [tensor("y", "TYPE_FP32", [2])]}
    reload = server.request("POST", "/v2/repository/models/reshaped/load", json={"parameters": {"config": json.dumps(config)}})
    assert reload.status_code == 200, reload.text
    assert infer([1, 2]) == (200, {"model_name": "reshaped", "model_version": "1", "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [2, 4]}]})
    status, refusal = infer([1, 2, 3, 4])
    assert status == 400 and refusal == {"error": "input 'x' must have shape [-1, 2], got [1, 4]"}
    assert infer_grpc([1, 2]) == [[2, 4]]
    assert infer_grpc([1, 2, 3, 4]) == "input 'x' must have shape [-1, 2], got [1, 4]"


def _request(rows: int, datatype: str = "FP32") -> pb.ModelInferRequest:
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    message = pb.ModelInferRequest(model_name="double", raw_input_contents=[x.tobytes()])
    message.inputs.add(name="x", datatype=datatype, shape=[rows, 4])
    return message


def _in_region(region: str) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="double")
    entry = message.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    entry.parameters["shared_memory_region"].string_param = region
    entry.parameters["shared_memory_byte_size"].int64_param = 16
    return message


class _Context:
    """What ModelInfer uses of grpcio's context: no metadata, a peer, and the status a failed call sets."""

    def __init__(self):
        self.status = None

    def invocation_metadata(self):
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def set_code(self, code) -> None:
        self.status = f"{code}: "

    def set_details(self, details: str) -> None:
        self.status += details


def test_a_grpc_front_end_sends_what_it_decodes_as_tensors_and_the_rest_as_documents(server):
    """The real gRPC service over the model process's real channel, the operations it calls recorded: a
    small request crosses decoded; one that names shared memory (the regions live in the model process)
    and one the front-end refuses (refused there, in one process's words) cross as their documents."""
    async def infer(message: pb.ModelInferRequest) -> tuple[list[str], object]:
        channel = ChannelClient(socket_path(server.process.pid))
        channel.start()
        assert await channel.wait_connected(30)
        sent, start_stream = [], channel.start_stream
        channel.start_stream = lambda op, *args: sent.append(op) or start_stream(op, *args)
        service = InferenceService(channel, Settings.from_env({}), Clients())
        context = _Context()
        try:
            answer = await asyncio.wait_for(service.ModelInfer(message, context), 30)
        finally:
            await channel.close()
        return sent, context.status or answer

    sent, answer = asyncio.run(infer(_request(2)))
    response = pb.ModelInferResponse.FromString(answer)
    assert sent == ["v2_infer_tensors"]
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [2 * v for v in range(8)]
    sent, answer = asyncio.run(infer(_in_region("nowhere")))  # the regions live in the model process
    assert sent == ["infer"] and "nowhere" in answer
    sent, answer = asyncio.run(infer(_request(2, "FP64")))
    assert sent == ["infer"] and answer == "StatusCode.INVALID_ARGUMENT: input 'x' is FP32; the request says FP64"


def test_a_failed_grpc_call_leaves_none_of_its_objects_to_the_garbage_collector(server):
    """The real gRPC service served by grpcio in this process over the model process's channel, called by a
    grpcio client: calls refused by the front-end, by the model process's shared memory, for a model not there
    and by a sequence batcher leave no reference cycle (an aborted call's error held its frames in one, ~50 objects a call)."""
    outside_sequence = pb.ModelInferRequest(model_name="accumulate", raw_input_contents=[b"\0" * 4])
    outside_sequence.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
    failing = [_request(2, "FP64"), _in_region("nowhere"), pb.ModelInferRequest(model_name="absent"), outside_sequence]

    codes = [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.NOT_FOUND,
             grpc.StatusCode.INVALID_ARGUMENT]

    async def fail_each(infer) -> None:
        for message, code in zip(failing, codes, strict=True):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await infer(message, timeout=30)
            assert refused.value.code() == code, refused.value.details()

    async def calls() -> list[str]:
        channel = ChannelClient(socket_path(server.process.pid))
        channel.start()
        assert await channel.wait_connected(30)
        service = InferenceService(channel, Settings.from_env({}), Clients())
        grpc_server = grpc.aio.server()
        grpc_server.add_generic_rpc_handlers([generic_handler(pb.DESCRIPTOR.services_by_name["GRPCInferenceService"],
                                                              service)])
        port = grpc_server.add_insecure_port("127.0.0.1:0")
        await grpc_server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as client:
                infer = client.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                           pb.ModelInferRequest.SerializeToString, pb.ModelInferResponse.FromString)
                await fail_each(infer)  # what lasts beyond a call (a client's state, grpcio's own) is made by the first
                with cycles_of_ours() as left:
                    await fail_each(infer)
                return left
        finally:
            await grpc_server.stop(0)
            await channel.close()

    left = asyncio.run(calls())
    assert not left, f"left in reference cycles: {left}"


def test_a_group_of_invokes_answers_each_and_one_that_fails_fails_alone(front_ends):
    """SageMaker invokes of one model cross as a group, each [connection, its requests, body, headers,
    request id]: a tensor model's body decoded for each (one that does not decode refused alone), a
    handler model's each handed to its worker (one its script fails answered 500 alone)."""
    json_body = {"content-type": "application/json"}
    items = front_ends[0].group("invoke", "double", [[1, 2, b"[[1, 2, 3, 4]]", json_body, "a"],
                                                     [2, 2, b"[[1, 2", json_body, "b"],
                                                     [3, 2, b"[[4, 3, 2, 1]]", json_body, "c"]])
    by_position = {item[0]: item[1:] for item in items}
    assert json.loads(by_position[0][3]) == [[2, 4, 6, 8]] and json.loads(by_position[2][3]) == [[8, 6, 4, 2]]
    assert by_position[1][0][0] == "InvalidRequest" and by_position[1][0][2] == 400
    items = front_ends[1].group("invoke", "echo", [[1, 2, b"one", {}, "a"], [2, 2, b"boom", {}, "b"], [3, 2, b"three", {}, "c"]])
    by_position = {item[0]: item[1:] for item in items}
    assert by_position[0][1:] == [200, {"Content-Type": "application/octet-stream"}, b"one"]
    assert by_position[2][3] == b"three"
    assert by_position[1][0] == ["ModelError", "transform_fn of model 'echo' raised ValueError: no boom here", 500]


def test_sagemaker_invokes_a_front_end_decoded_are_run_against_their_own_load(front_ends):
    """A tensor model's invokes a front-end decoded cross as tensors, each [connection number, its requests,
    the view's generation, inputs, its custom attributes, request id]: each answered with its outputs, one
    decoded against another load told so alone (the front-end decodes it again), and a model that is not
    there told to each."""
    generation, *_ = front_ends[0].call("v2_view", "double")
    x = np.ones((1, 4), np.float32)
    calls = [[1, 2, generation, {"x": x}, None, "a"], [2, 2, generation + 1000, {"x": x}, "trace=1", "b"],
             [3, 2, generation, {"x": 3 * x}, "trace=2", "c"]]
    by_position = {item[0]: item[1:] for item in front_ends[0].group("invoke_tensors", "double", calls, (False,))}
    assert by_position[0][0] is None and np.array_equal(by_position[0][1]["y"], 2 * x)
    assert by_position[2][0] is None and np.array_equal(by_position[2][1]["y"], 6 * x)
    assert by_position[1] == [None]
    items = front_ends[1].group("invoke_tensors", "nobody", calls[:2], (False,))
    assert [(position, error[2]) for position, error in items] == [(0, 404), (1, 404)]


def test_a_group_of_tf_serving_inferences_answers_each_and_one_that_fails_fails_alone(front_ends):
    """TF Serving's inferences of one verb to one model, version or label cross as a group, each
    [connection number, its requests, body]: each body decoded against the leased model (one that does not
    parse, and one that names a signature the model lacks, refused alone); a version or a label the model
    lacks is told to each request, in TF Serving's words."""
    def body(*row: float) -> bytes:
        return json.dumps({"instances": [list(row)]}).encode()

    calls = [[1, 2, body(1, 2, 3, 4)], [2, 2, b'{"instances": [[1, 2'],
             [3, 2, b'{"signature_name": "other", "instances": [[1, 2, 3, 4]]}'], [4, 2, body(4, 3, 2, 1)]]
    by_position = {item[0]: item[1:] for item in front_ends[0].group("tfserving", "double", calls, (None, None, ":predict"))}
    assert json.loads(by_position[0][1]) == {"predictions": [[2.0, 4.0, 6.0, 8.0]]}
    assert json.loads(by_position[3][1]) == {"predictions": [[8.0, 6.0, 4.0, 2.0]]}
    assert by_position[1][0][0] == "InvalidRequest" and by_position[1][0][2] == 400
    assert by_position[2][0] == ["InvalidRequest", 'Serving signature name: "other" not found in signature def', 400]
    for key, told in [(("7", None, ":predict"), ["ModelNotFound", "Servable not found for request: Specific(double, 7)", 404]),
                      ((None, "stable", ":classify"), ["InvalidRequest", "Unrecognized servable version label: stable", 400])]:
        items = front_ends[1].group("tfserving", "double", calls[:2], key)
        assert sorted(items) == [[0, told], [1, told]]



def test_tf_serving_tensors_in_a_group_are_run_against_their_own_load_and_path(front_ends):
    """TF Serving's inferences a front-end decoded cross as tensors, each [connection number, its requests,
    the view's generation, inputs]: each answered with its outputs, one decoded against another load told
    so alone (the front-end decodes it again), and a label the model lacks told to each, in TF Serving's
    words."""
    generation, *_ = front_ends[0].call("v2_view", "double")
    x = np.ones((1, 4), np.float32)
    calls = [[1, 2, generation, {"x": x}], [2, 2, generation + 1000, {"x": x}], [3, 2, generation, {"x": 3 * x}]]
    by_position = {item[0]: item[1:] for item in front_ends[0].group("tfserving_tensors", "double", calls, (None, None))}
    assert by_position[0][0] is None and np.array_equal(by_position[0][1]["y"], 2 * x)
    assert by_position[2][0] is None and np.array_equal(by_position[2][1]["y"], 6 * x)
    assert by_position[1] == [None]
    items = front_ends[1].group("tfserving_tensors", "double", calls[:1], (None, "stable"))
    assert items == [[0, ["InvalidRequest", "Unrecognized servable version label: stable", 400]]]

def recording_front_end(server) -> tuple[ChannelDispatcher, list[str]]:
    """The real front-end's dispatcher over the model process's real channel, and the operations it calls
    there, as it calls them."""
    dispatcher = ChannelDispatcher(Settings.from_env({}), socket_path(server.process.pid))
    sent, call, stream = [], dispatcher.channel.call, dispatcher.channel.stream
    dispatcher.channel.call = lambda op, *args, **kw: sent.append(op) or call(op, *args, **kw)
    dispatcher.channel.stream = lambda op, *args, **kw: sent.append(op) or stream(op, *args, **kw)
    dispatcher.start()
    poll(lambda: dispatcher.channel.connected, 30, "the front-end did not reach the model process")
    return dispatcher, sent


def test_an_http_front_end_sends_tf_serving_bodies_it_decodes_as_tensors_and_the_rest_whole(server):
    """The real front-end's dispatcher over the model process's real channel, the operations it calls
    recorded: a body it decodes against its view of the model crosses as tensors and its answer is encoded
    there; a body it refuses, and one to a model it has no view of (a handler model), cross whole, to be
    refused in one process's words; a version the model lacks is the model process's to say, and leaves
    the front-end's view of the model in place."""
    dispatcher, sent = recording_front_end(server)
    client = dispatcher.new_client()

    def infer(path: str, document) -> tuple[list[str], int, dict]:
        sent.clear()
        client.requests += 1
        body = document if isinstance(document, bytes) else json.dumps(document).encode()
        answer = dispatcher.serve(Request("POST", path, "", {"content-type": "application/json"}, body, client=client))
        return [op for op in sent if op != "probes"], answer.status, json.loads(answer.body)

    row = {"instances": [[1, 2, 3, 4]]}
    assert infer("/v1/models/double:predict", row) == (["v2_view", "tfserving_tensors"], 200,
                                                        {"predictions": [[2.0, 4.0, 6.0, 8.0]]})
    assert infer("/v1/models/double/versions/1:classify", {"examples": [{"x": [1, 2, 3, 4]}]}) == (
        ["tfserving_tensors"], 200, {"results": [[["", 2.0], ["", 4.0], ["", 6.0], ["", 8.0]]]})
    assert infer("/v1/models/double:regress", {"examples": [{"x": [1, 2, 3, 4]}]}) == (
        ["tfserving"], 400, {"error": 'Serving signature name: "tensorflow/serving/regress" not found in signature def'})
    assert infer("/v1/models/double:predict", {"instances": [[1, 2]]}) == (
        ["tfserving"], 400, {"error": "input 'x' must have shape [-1, 4], got [1, 2]"})
    assert infer("/v1/models/double:predict", b'{"instances": [[1, 2')[:2] == (["tfserving"], 400)
    assert infer("/v1/models/double/versions/7:predict", row) == (
        ["tfserving_tensors"], 404, {"error": "Servable not found for request: Specific(double, 7)"})
    assert infer("/v1/models/double:predict", row)[:2] == (["tfserving_tensors"], 200)  # the view still serves
    assert infer("/v1/models/echo:predict", row) == (
        ["v2_view", "tfserving"], 400,
        {"error": "model 'echo' is a SageMaker handler model: it takes a request body (POST /models/echo/invoke), not tensors"})


def test_an_http_front_end_sends_sagemaker_invokes_it_decodes_as_tensors_and_the_rest_whole(server):
    """As TF Serving's: a tensor model's body the front-end decodes (JSON, CSV, an envelope) crosses as
    tensors and its answer is encoded there, in the type Accept asks for; a body it refuses (malformed, the
    wrong shape, a type it cannot answer in), one to a handler model and one to a model not there cross
    whole, to be answered in one process's order and words."""
    dispatcher, sent = recording_front_end(server)
    client = dispatcher.new_client()

    def invoke(path: str, body: bytes, content_type: str = "application/json", accept: str = "*/*",
               **headers: str) -> tuple[list[str], int, str, bytes]:
        sent.clear()
        client.requests += 1
        headers = {"content-type": content_type, "accept": accept, **headers}
        answer = dispatcher.serve(Request("POST", path, "", headers, body, client=client))
        return [op for op in sent if op != "probes"], answer.status, answer.headers.get("Content-Type"), answer.body

    assert invoke("/models/double/invoke", b"[[1, 2, 3, 4]]") == (
        ["v2_view", "invoke_tensors"], 200, "application/json", b"[[2.0,4.0,6.0,8.0]]")
    assert invoke("/models/double/invoke", b'{"instances": [[1, 2, 3, 4]]}') == (
        ["invoke_tensors"], 200, "application/json", b'{"predictions":[[2.0,4.0,6.0,8.0]]}')
    assert invoke("/models/double/invoke", b"1,2,3,4\n", "text/csv", "text/csv") == (
        ["invoke_tensors"], 200, "text/csv", b"2.0,4.0,6.0,8.0\n")
    target = {"x-amzn-sagemaker-target-model": "double"}
    assert invoke("/invocations", b"[[1, 2, 3, 4]]", **target)[:2] == (["invoke_tensors"], 200)
    ops, status, _, body = invoke("/models/double/invoke", b"[[1, 2")
    assert (ops, status) == (["invoke"], 400) and "malformed JSON" in json.loads(body)["error"]
    ops, status, _, body = invoke("/models/double/invoke", b"[[1, 2]]")
    assert (ops, status, json.loads(body)) == (["invoke"], 400, {"error": "input 'x' must have shape [-1, 4], got [1, 2]"})
    assert invoke("/models/double/invoke", b"[[1, 2, 3, 4]]", accept="image/png")[:2] == (["invoke"], 406)
    assert invoke("/models/echo/invoke", b"one") == (["v2_view", "invoke"], 200, "application/octet-stream", b"one")
    assert invoke("/models/nobody/invoke", b"[[1, 2, 3, 4]]")[:2] == (["v2_view", "invoke"], 404)
