"""The master keeps each front-end process running: one killed after it has served is started again after
the base delay every time; one that cannot start (it exits at once) is started again later and later. Real
processes and real signals; the delays are made short, and the test reads the ones the master logged."""

import os
import signal
import socket
import sys
import threading
from pathlib import Path

import pytest

from container import frontends
from tests.builders import wait_for


class Log:
    """The master's logger, as FrontEnd uses it: what it said of each restart."""

    def __init__(self):
        self.started = threading.Semaphore(0)
        self.waits: list[float] = []

    def info(self, message, extra):
        self.started.release()

    def error(self, message, extra):
        self.waits.append(extra["fields"]["after_seconds"])


@pytest.fixture
def short_delays(monkeypatch):
    monkeypatch.setattr(frontends, "_RESTART_DELAY", 0.02)
    monkeypatch.setattr(frontends, "_MAX_DELAY", 0.16)


def _run(command: list[str], restarts: int, between=lambda front_end: None) -> list[float]:
    log = Log()
    front_end = frontends.FrontEnd("test", command, log)
    front_end.start()
    try:
        assert log.started.acquire(timeout=30), "the front-end did not start"
        for _ in range(restarts):
            between(front_end)
            assert log.started.acquire(timeout=30), "the front-end was not started again"
    finally:
        front_end.stop(timeout=10)
    return log.waits[:restarts]


def test_a_front_end_that_cannot_start_is_started_again_later_and_later(short_delays):
    waits = _run([sys.executable, "-c", "raise SystemExit(3)"], restarts=5)
    assert waits == [0.02, 0.04, 0.08, 0.08, 0.08]  # doubled up to the most


def test_a_front_end_killed_after_it_has_served_is_started_again_at_once_every_time(short_delays, monkeypatch):
    monkeypatch.setattr(frontends, "_STEADY", 0.05)

    def served_then_killed(front_end):
        pid = front_end.process.pid
        wait_for(lambda: _running_seconds(pid) > 0.1, message="the front-end did not run")
        os.kill(pid, signal.SIGKILL)

    waits = _run([sys.executable, "-c", "import signal; signal.pause()"], restarts=4, between=served_then_killed)
    assert waits == [0.01] * 4


def _running_seconds(pid: int) -> float:
    """How long `pid` has run, from /proc (its start in clock ticks since boot)."""
    ticks = os.sysconf("SC_CLK_TCK")
    started = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - started


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_front_end_told_to_stop_before_it_reaches_the_model_process_exits_cleanly(kind, tmp_path):
    """No model process listens on its channel: it waits for one, and SIGTERM ends that wait."""
    channel = str(tmp_path / "models.sock")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.set_inheritable(True)
        if kind == "http":
            head = {"max_line": 0, "max_fields": 0, "max_field": 0, "keepalive": 5}
            front_end = frontends.http_front_end(0, channel, [listener.fileno()], head, 30, Log())
        else:
            front_end = frontends.FrontEnd("grpc", [sys.executable, "-m", "container.grpc_api", channel, "alone"], Log())
        front_end.start()
        try:
            wait_for(lambda: front_end.process and _catches(front_end.process.pid, signal.SIGTERM),
                     message="the front-end never took SIGTERM for its own")
        finally:
            front_end.stop(timeout=30)
    assert front_end.process.returncode == 0


def _catches(pid: int, signum: int) -> bool:
    """Whether `pid` has a handler of its own for `signum` (/proc's SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (signum - 1) & 1)
