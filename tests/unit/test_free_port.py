"""The ports the suite and the benchmarks give their servers (bench/harness.py): never the same one to
two processes at once, since the suite's two workers and the bench's processes start servers together."""

import subprocess
import sys

from tests.conftest import PROJECT

TAKE = "from bench.harness import free_port; print(*(free_port() for _ in range(200)), flush=True); input()"


def test_processes_that_ask_at_once_are_given_different_ports():
    takers = [subprocess.Popen([sys.executable, "-c", TAKE], cwd=PROJECT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True) for _ in range(3)]
    try:
        given = [set(map(int, taker.stdout.readline().split())) for taker in takers]  # each holds its ports meanwhile
    finally:
        for taker in takers:
            taker.communicate("", timeout=30)
    assert [len(ports) for ports in given] == [200] * 3
    assert not (given[0] & given[1] or given[0] & given[2] or given[1] & given[2])
