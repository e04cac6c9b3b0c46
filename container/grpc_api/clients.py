"""The gRPC front-end's clients as the model process's batchers know them: each peer (its address and
port, one connection) a number, with the requests it has made, as an HTTP front-end numbers its
connections. grpc.aio says nothing when a connection closes, so a peer idle for IDLE_SECONDS is
forgotten, and the model process told, as a closed connection is."""

import itertools
import time

IDLE_SECONDS = 60.0


class Clients:
    def __init__(self):
        self._peers: dict[str, list] = {}  # peer → [number, requests, when last seen]
        self._numbers = itertools.count(1)

    def seen(self, peer: str) -> tuple[int, int]:
        """A request from `peer`: its number, and the requests it has made, this one included."""
        entry = self._peers.get(peer)
        if entry is None:
            entry = self._peers[peer] = [next(self._numbers), 0, 0.0]
        entry[1] += 1
        entry[2] = time.monotonic()
        return entry[0], entry[1]

    def forget_idle(self, seconds: float = IDLE_SECONDS) -> list[int]:
        """The numbers of the peers idle for `seconds`, forgotten."""
        since = time.monotonic() - seconds
        idle = [peer for peer, (_, _, seen) in self._peers.items() if seen < since]
        return [self._peers.pop(peer)[0] for peer in idle]
