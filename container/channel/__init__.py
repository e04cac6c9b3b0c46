"""The local channel between front-end processes and the one process that owns the models: calls and
their answers as msgpack frames over a Unix socket (wire.py), served in the model process on its hub
(server.py) and made from a front-end's asyncio loop (client.py)."""

import os

from container import workdirs

FRAMING = 1 << 20  # room for a call's description beside its largest allowed data
# Seconds between a front-end's attempts to reach the model process while it starts or restarts. An attempt
# on a socket not yet there costs microseconds; at 0.2 s, a start or a restart served its first request up
# to 0.2 s after the model process could (measured: 0.26 s after "serving" in a server's log).
CONNECT_RETRY = 0.02


def max_call(max_payload_bytes: int) -> int:
    """The largest call frame the model process reads: a request body's limit, and room to describe it.
    Front-ends check a call against it before they send it, so no call breaks the connection it
    shares with other clients' calls."""
    return max_payload_bytes + FRAMING


def socket_path(master_pid: int) -> str:
    """The model process's channel socket, in the server's own directory (workdirs.py): the gunicorn
    master's pid names it, so its worker and its front-ends find it without being told."""
    return os.path.join(workdirs.server(master_pid), "models.sock")


def blob_prefix(path: str) -> str:
    """The names of the channel's shared-memory data (blobs.py): its directory's, `container-<master pid>`."""
    return os.path.basename(os.path.dirname(path))
