"""Scenario 10: `/ping` while the server is worn down — connections that send nothing, heads that
drip a byte at a time, a header value without a line end — against `/ping` on a quiet server. The
tests check that each attack is refused; this measures what the attacks cost everyone else."""

import http.client
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import Server

TITLE = "/ping latency under attack: silent connections, slow heads, an endless header"


def run(seconds: float, smoke: bool) -> list[str]:
    silent, drips, pings = (50, 4, 10) if smoke else (1100, 20, 200)
    with tempfile.TemporaryDirectory() as scratch:
        server = Server(Path(scratch), SERVE_LOAD_MODELS="")
        sockets: list[socket.socket] = []
        stop = threading.Event()
        try:
            rows = [_row("none", _pings(server, pings))]
            sockets += [socket.create_connection(("127.0.0.1", server.port)) for _ in range(silent)]
            rows.append(_row(f"{silent:,} connections that send nothing", _pings(server, pings)))
            dripping = [_opened(server, b"GET /ping HTTP/1.1\r\nX-Slow: ") for _ in range(drips)]
            endless = _opened(server, b"GET /ping HTTP/1.1\r\nX-Long: ")
            sockets += [*dripping, endless]
            threading.Thread(target=_drip, args=(dripping, stop), daemon=True).start()
            threading.Thread(target=_flood, args=(endless,), daemon=True).start()
            rows.append(_row(f"and {drips} heads dripping a byte every 200 ms, and a 16 MiB header value without "
                             f"a line end", _pings(server, pings)))
        finally:
            stop.set()
            for sock in sockets:
                sock.close()
            server.stop()
    return [f"{pings} pings on one keep-alive connection after each attack is in place.", "",
            "| attack | p50 ms | p99 ms | max ms |", "| --- | --- | --- | --- |", *rows]


def _pings(server: Server, count: int) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            connection.request("GET", "/ping")
            answer = connection.getresponse()
            answer.read()
            assert answer.status == 200, answer.status
            times.append((time.perf_counter() - started) * 1000)
        return times
    finally:
        connection.close()


def _row(attack: str, times: list[float]) -> str:
    times = sorted(times)
    return (f"| {attack} | {statistics.median(times):.2f} | {times[int(len(times) * 0.99) - 1]:.2f} | "
            f"{times[-1]:.2f} |")


def _opened(server: Server, head: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(head)
    return sock


def _drip(sockets: list[socket.socket], stop: threading.Event) -> None:
    while not stop.wait(0.2):
        for sock in sockets:
            try:
                sock.send(b"x")
            except OSError:  # refused with 408 and closed: the attack is over for that one
                pass


def _flood(sock: socket.socket) -> None:
    try:
        for _ in range(256):
            sock.sendall(b"a" * 65536)
    except OSError:  # refused with 431 and closed
        pass
