"""A gRPC front-end process: grpc.aio on SERVE_GRPC_PORT (one per HTTP front-end, sharing the port),
reaching the model process over the channel. Health follows the model process: SERVING while it
answers ready, NOT_SERVING otherwise. SIGTERM stops new calls, lets those under way finish (gunicorn's
graceful timeout) and ends each open stream once it has nothing under way; the master lets the front-ends
drain before it stops the model process."""

import asyncio
import logging
import os
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

from container.channel import max_call
from container.channel.client import ChannelClient
from container.errors import ServeError, ServiceNotFound
from container.grpc_api import modelmesh_service
from container.grpc_api.clients import IDLE_SECONDS, Clients
from container.grpc_api.inference_service import InferenceService
from container.grpc_api.services import generic_handler
from container.grpc_api.status import answered, refused
from container.settings import Restriction, Settings

log = logging.getLogger(__name__)
_SERVICES = ("", "inference.GRPCInferenceService")
_HEALTH_PERIOD = 1.0  # seconds between health checks of the model process
_CONNECT_WAIT = 60.0  # seconds between words that the model process is not reached yet
_ORPHAN_CHECK = 1.0  # seconds between looks at whether the master is still there
_GRACE = 30.0  # seconds the calls under way have at SIGTERM, as gunicorn's graceful timeout
_FRAMING = 64 << 10  # room for a message's protobuf beside its largest allowed tensor data
_COMPRESSION = {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
                "deflate": grpc.Compression.Deflate}


def options(settings: Settings, shared: bool) -> list[tuple[str, int]]:
    """grpcio's channel arguments from the settings. Sends are unbounded, as Triton's (an answer is as
    large as the model makes it); receives are bounded as HTTP bodies are. `shared`: the port is shared
    with the server's other gRPC front-ends (the master found it free); otherwise a second server on the
    port is an error, not a silent share."""
    return [
        ("grpc.max_receive_message_length", settings.max_payload_bytes + _FRAMING),
        ("grpc.max_send_message_length", -1),
        ("grpc.server.max_pending_requests", settings.grpc_max_pending),
        ("grpc.server.max_pending_requests_hard_limit", settings.grpc_max_pending),
        ("grpc.keepalive_time_ms", settings.grpc_keepalive_time * 1000),
        ("grpc.keepalive_timeout_ms", settings.grpc_keepalive_timeout * 1000),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),  # tritonclient may ping this often
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.so_reuseport", int(shared)),
    ]


async def serve(settings: Settings, channel_path: str, shared: bool) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    orphaned = asyncio.create_task(_watch_master(os.getppid(), stopping))
    channel = ChannelClient(channel_path, max_call(settings.max_payload_bytes))
    channel.start()
    clients = Clients()
    inference = InferenceService(channel, settings, clients)
    server = grpc.aio.server(options=options(settings, shared), compression=_COMPRESSION[settings.grpc_compression])
    server.add_generic_rpc_handlers([
        generic_handler(pb.DESCRIPTOR.services_by_name["GRPCInferenceService"], inference),
        generic_handler(modelmesh_service.SERVICE, modelmesh_service.ModelRuntimeService(channel, settings)),
    ])
    # Listen once the model process is reached, as the HTTP front-ends accept only then: until then a
    # connection goes to a front-end that is ready (the port is shared) or waits for one.
    if not await _reached(channel, stopping):
        return
    checks = LoggedHealth(settings.restricted_api)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    try:
        server.add_insecure_port(f"[::]:{settings.grpc_port}")
    except RuntimeError as exc:  # the port is taken (another server, a second container on the host)
        log.error("gRPC cannot listen; set SERVE_GRPC_PORT to a free port, or off",
                  extra={"fields": {"port": settings.grpc_port, "error": str(exc)}})
        raise SystemExit(2) from None
    await server.start()
    log.info("gRPC listening", extra={"fields": {"port": settings.grpc_port}})
    watching = [orphaned, asyncio.create_task(_watch_health(channel, checks)), asyncio.create_task(_forget_idle(channel, clients))]
    await stopping.wait()
    log.info("gRPC draining")
    for task in watching:
        task.cancel()
    await checks.enter_graceful_shutdown()
    deadline = loop.time() + _GRACE
    channel.refuse("the server is shutting down")
    inference.drain()
    if not await channel.settled(_GRACE):
        log.warning("gRPC calls still under way at the end of the graceful timeout are cancelled")
    await server.stop(max(deadline - loop.time(), 0))  # what is left: answers on their way out
    await channel.close()


class LoggedHealth(health.aio.HealthServicer):
    """grpc.health.v1 as grpcio answers it, in SERVE_RESTRICTED_API's `health` group (as Triton's
    --grpc-restricted-protocol puts it), each Check with its line in the access log, as an HTTP health
    probe has (a Watch is one stream for as long as its client stays)."""

    SERVICE = health.SERVICE_NAME

    def __init__(self, restrictions: tuple[Restriction, ...]):
        super().__init__()
        self.restrictions = restrictions

    @answered("health")
    async def Check(self, request, context):
        if request.service not in _SERVICES:  # (grpcio's own answer aborts the call)
            raise ServiceNotFound(f"no health status for service '{request.service}'")
        return await super().Check(request, context)

    async def Watch(self, request, context):
        if not refused(self.restrictions, "health", context):
            await super().Watch(request, context)


async def _reached(channel: ChannelClient, stopping: asyncio.Event) -> bool:
    """Whether the model process is reached before a stop; while it is not, said every _CONNECT_WAIT seconds."""
    waits = {asyncio.create_task(channel.wait_connected(None)), asyncio.create_task(stopping.wait())}
    while not (await asyncio.wait(waits, timeout=_CONNECT_WAIT, return_when=asyncio.FIRST_COMPLETED))[0]:
        log.warning("the model process is not reached yet", extra={"fields": {"channel": channel.path}})
    for task in waits:
        task.cancel()
    return not stopping.is_set()


async def _watch_master(master: int, stopping: asyncio.Event) -> None:
    """Stop once the master is gone (killed outright): an orphan must not hold the port."""
    while os.getppid() == master:
        await asyncio.sleep(_ORPHAN_CHECK)
    log.error("the master is gone; exiting", extra={"fields": {"master": master}})
    stopping.set()


async def _forget_idle(channel: ChannelClient, clients: Clients) -> None:
    """The model process forgets the clients gone idle, as it forgets an HTTP connection that closed."""
    while True:
        await asyncio.sleep(IDLE_SECONDS / 2)
        for number in clients.forget_idle():
            try:
                await channel.call("connection_closed", os.getpid(), number)
            except ServeError:
                pass  # the model process is away: its new self never knew the client


async def _watch_health(channel: ChannelClient, checks) -> None:
    serving = None
    while True:
        try:
            await channel.call("ready")
            now = health_pb2.HealthCheckResponse.SERVING
        except ServeError:
            now = health_pb2.HealthCheckResponse.NOT_SERVING
        if now != serving:
            for service in _SERVICES:
                await checks.set(service, now)
            serving = now
        await asyncio.sleep(_HEALTH_PERIOD)
