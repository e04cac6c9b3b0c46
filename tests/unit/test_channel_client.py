"""The gRPC front-end's end of the channel (channel/client.py) on uvloop, its loop in the front-end, as the
model process it talks to ends: a call is told to retry, and nothing it wrote stays in shared memory."""

import asyncio
import os
import socket
import threading
from pathlib import Path

import pytest
import uvloop

from container.channel import blob_prefix
from container.channel.blobs import THRESHOLD, large
from container.channel.client import ChannelClient
from container.errors import Unavailable


@pytest.fixture
def listener(tmp_path):
    """Where a model process would listen, with nobody serving."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "models.sock"))
    sock.listen(1)
    sock.settimeout(10)
    yield sock
    sock.close()


def test_a_call_on_a_connection_closed_before_its_reader_knows_is_told_to_retry(listener):
    """uvloop raises RuntimeError at a write to a connection that has closed (the model process died) when the
    task reading it has not run since: a call made in that moment failed as a server bug, a 500 (once in a
    240 s chaos run)."""
    path = listener.getsockname()

    async def call():
        channel = ChannelClient(path)
        _, channel._writer = await asyncio.open_unix_connection(path)  # as its reading task holds it
        channel._writer.close()
        await channel._writer.wait_closed()
        with pytest.raises(Unavailable, match="retry"):
            await channel.call("echo", 1)

    uvloop.run(call())


def test_a_large_call_the_model_process_never_read_is_not_left_in_shared_memory(listener):
    """The model process died with the frame unread (as test_hub_client's, for the HTTP front-ends' client)."""
    path = listener.getsockname()

    def dies_reading():
        peer, _ = listener.accept()
        with peer:
            peer.settimeout(10)
            peer.recv(1)

    async def call():
        channel = ChannelClient(path)
        channel.start()
        assert await channel.wait_connected(10)
        try:
            with pytest.raises(Unavailable, match="ended during the request"):
                await asyncio.wait_for(channel.call("echo", large(b"x" * THRESHOLD)), 10)
        finally:
            await channel.close()

    model_process = threading.Thread(target=dies_reading)
    model_process.start()
    uvloop.run(call())
    model_process.join(10)
    assert not list(Path("/dev/shm").glob(f"{blob_prefix(path)}-{os.getpid()}-*"))
