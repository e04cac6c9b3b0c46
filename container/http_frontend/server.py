"""An HTTP front-end process: the master's listeners served on gevent (http_transport.Connections), each
request handed whole to the model process over the channel (`ChannelDispatcher`), except inference:
V2's, SageMaker's invokes and TF Serving's have their HTTP (and V2's its JSON) handled here, through
the same routes and pipeline one process uses, and only the inference crosses, so that the one model
process does the least per request; and `generate_stream`, whose events cross as the model makes them.

- A refusal this process makes itself (a head too large or too slow, a body past the limit, the server
  stopping, the model process away) is rendered by the pipeline's own Dispatcher here: the same body,
  request id and access-log line a single process writes.
- While the model process is away (dead, restarting), every request is answered 503 with Retry-After.
  A health probe (a route of the `health` group, which the model process names at each connection,
  and before this process accepts any) waits PROBE_DEADLINE at most: a stuck model process makes
  `/ping` unhealthy within the 2 s SageMaker allows, instead of holding it.
- SIGTERM: stop accepting, close idle connections, let requests under way finish (the master stops the
  model process after its front-ends). SIGINT and SIGQUIT: exit at once. A front-end whose master is
  gone exits, so that no orphan holds the port."""

import logging
import os
import signal
import sys

import gevent
from gevent import socket
from gevent.event import Event
from gevent.pool import Pool
from gevent.server import StreamServer
from werkzeug.exceptions import HTTPException

from container.api import tfserving_infer
from container.api.pipeline import ACCESS_LOG, Dispatcher, Request, Response
from container.api.routing import Match, Route, Routes
from container.api.sagemaker_invoke import invoke_routes
from container.api.tfserving_json import MOUNT
from container.api.v2_generate_stream import stream_routes
from container.api.v2_infer import infer_routes
from container.channel import max_call
from container.channel.blobs import large
from container.channel.hub_client import HubChannelClient
from container.errors import ServeError, Unavailable
from container.http_frontend.inference import RemoteInference
from container.http_frontend.invocations import RemoteInvoke
from container.http_frontend.tfserving import RemoteTFServing
from container.http_frontend.views import FrontEndViews
from container.http_transport import Connections, HeadLimits
from container.inference import Client
from container.settings import Settings

log = logging.getLogger(__name__)
PROBE_DEADLINE = 1.5  # seconds a health probe waits for the model process (SageMaker's /ping allows 2)
_ORPHAN_CHECK = 1.0  # seconds between looks at whether the master is still there
_PROBES_TIMEOUT = 10.0  # seconds the model process has to name its health routes
_PROBES_RETRY = 1.0  # seconds before asking again


class FrontEndConnection(Client):
    """A connection of this front-end, known to the model process by its number."""

    __slots__ = ("number",)

    def __init__(self, number: int):
        super().__init__()
        self.number = number


class ChannelDispatcher:
    """What the connections see as their dispatcher: `serve` crosses the channel, or serves V2 inference
    here (the `local` pipeline, with the inference over the channel); refusals render here."""

    def __init__(self, settings: Settings, channel_path: str):
        self.channel = HubChannelClient(channel_path, self._learn_probes, max_call(settings.max_payload_bytes))
        model_views = FrontEndViews(self.channel)
        self.local = Dispatcher(Routes([*infer_routes(RemoteInference(self.channel, model_views, settings.limits),
                                                      settings.max_payload_bytes),
                                        *invoke_routes(RemoteInvoke(self.channel, model_views, settings.limits, settings.default_accept), settings),
                                        *tfserving_infer.infer_routes(RemoteTFServing(self.channel, model_views, settings.limits)),
                                        *stream_routes(self._generate_events, settings.max_payload_bytes)], [MOUNT]),
                                settings.max_payload_bytes, settings.restricted_api)
        self.max_body = self.local.max_body
        self.too_large, self.refuse = self.local.too_large, self.local.refuse
        self.probes = Routes([])
        self.ready = Event()  # set once the probes are known: then this process accepts connections
        self._connections = 0
        self._pid = os.getpid()  # in each call: a system call each time

    def start(self) -> None:
        self.channel.start()

    def serve(self, request: Request) -> Response:
        match = self._served_here(request)
        if match is not None:
            return self.local.serve(request, match)
        client = request.client
        try:
            status, headers, body = self.channel.call(
                "http", self._pid, client.number, client.requests, request.method, request.path, request.query_string,
                request.headers, large(request.body), request.oversize, timeout=self._deadline(request))
        except Unavailable as exc:  # the model process is away, or stuck past a probe's deadline
            return self.refuse(request, exc)
        return Response(body, status=status, headers=headers)

    def _served_here(self, request: Request) -> Match | None:
        """The request's route where this process serves it, else None."""
        try:
            return self.local.routes.match(request.method, request.path)
        except (HTTPException, ServeError):  # a miss, in werkzeug's words or a mount's (TF Serving's)
            return None

    def _generate_events(self, name: str, version: str | None, body: dict):
        return self.channel.stream("generate_stream", name, version, body)

    def new_client(self) -> FrontEndConnection:
        self._connections += 1
        client = FrontEndConnection(self._connections)
        client.when_closed(self._closed)
        return client

    def _closed(self, client: FrontEndConnection) -> None:
        if client.requests:  # the model process knows only connections that carried a request
            gevent.spawn(self._tell_closed, client.number)

    def _tell_closed(self, number: int) -> None:
        try:
            self.channel.call("connection_closed", self._pid, number)
        except ServeError:
            pass  # the model process is away: its new self never knew the connection

    def _deadline(self, request: Request) -> float | None:
        try:
            self.probes.match(request.method, request.path)
        except HTTPException:
            return None
        return PROBE_DEADLINE

    def _learn_probes(self) -> None:
        """At each connection: the health routes, asked again while the model process does not answer
        (the next connection asks anew)."""
        while self.channel.connected:
            try:
                routes = self.channel.call("probes", timeout=_PROBES_TIMEOUT)
            except ServeError as exc:  # stuck, or shutting down: ask again in a moment
                log.warning("the model process did not name its health routes", extra={"fields": {"error": str(exc)}})
                gevent.sleep(_PROBES_RETRY)
                continue
            self.probes = Routes([Route(method, template, None, "health", {}) for method, template in routes])
            self.ready.set()
            return


def serve(settings: Settings, channel_path: str, limits: HeadLimits, graceful_timeout: float, fds: list[int]) -> None:
    dispatcher = ChannelDispatcher(settings, channel_path)
    dispatcher.start()
    connections = Connections(dispatcher, settings, limits, settings.max_connections, new_client=dispatcher.new_client)
    stop = Event()
    gevent.signal_handler(signal.SIGTERM, stop.set)
    for quick in (signal.SIGINT, signal.SIGQUIT):
        gevent.signal_handler(quick, _exit_now)
    master = os.getppid()
    # Connections are accepted once the model process has answered (named its health routes): until then
    # they wait in the listen queue, as they did while a single process booted, or go to a front-end
    # that is ready.
    if not _until(dispatcher.ready, stop, master):
        return
    servers = []
    for fd in fds:
        server = StreamServer(socket.socket(fileno=fd), lambda sock, _: connections.handle(sock),
                              spawn=Pool(settings.max_connections))
        server.max_accept = 1  # one connection per wake-up, so that a burst spreads over the front-ends
        server.start()
        servers.append(server)
    _until(stop, stop, master)
    for server in servers:
        server.close()
    connections.drain(graceful_timeout)
    ACCESS_LOG.flush()


def _until(event: Event, stop: Event, master: int) -> bool:
    """Wait for `event`; False when told to stop first, or when the master is gone (an orphan must not
    hold the port)."""
    while not gevent.wait([event, stop], timeout=_ORPHAN_CHECK, count=1):
        if os.getppid() != master:
            log.error("the master is gone; exiting", extra={"fields": {"master": master}})
            return False
    return event.is_set()


def _exit_now() -> None:
    ACCESS_LOG.flush()
    sys.stderr.flush()
    os._exit(0)
