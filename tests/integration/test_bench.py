"""The benchmark scripts run end to end in their smoke mode, so they cannot rot. No speed is asserted;
the soak's and the chaos run's correctness counts are: no wrong answer, no unexpected status, no lost
request, every model serving after, no fault of the server's own in its log, and a stop under load that
ends, with nothing left, before `docker stop` would kill it."""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from bench.__main__ import SCENARIOS
from tests.conftest import PROJECT


def test_every_scenario_runs_and_reports_a_table():
    """The scenarios in two processes at once (most of a smoke run is a server starting on one core)."""
    halves = [SCENARIOS[0::2], SCENARIOS[1::2]]
    with ThreadPoolExecutor(len(halves)) as pool:
        runs = list(pool.map(lambda names: subprocess.run([sys.executable, "-m", "bench", *names, "--smoke"], cwd=PROJECT,
                                                          capture_output=True, text=True, timeout=600), halves))
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    stdout = "".join(run.stdout for run in runs)
    for scenario in SCENARIOS:
        assert f"`python -m bench {scenario}`" in stdout
    tables = [line for line in stdout.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    assert len(tables) >= 6 * 2  # a header and at least one row each
    assert "In-process torch" in stdout
    soak = re.search(r"^\| ([\d,]+) \| (\d+) \| (\d+) \| (\d+) \|.*\| (yes|no.*) \|$", stdout, re.MULTILINE)
    requests, wrong, unexpected, lost, healthy = soak.groups()
    assert int(requests.replace(",", "")) > 0 and (wrong, unexpected, lost, healthy) == ("0", "0", "0", "yes"), \
        stdout[soak.start():soak.start() + 3000]  # the row, each call's answers, the unexpected ones' bodies
    chaos = re.search(r"^\| ([\d,]+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| [\d /]+ \| \d+ \| (yes|no) \| (\d+) \| (\d+) \|$",
                      stdout, re.MULTILINE)
    calls, unexpected, unanswered, stuck, cut, healthy, faults, left = chaos.groups()
    assert int(calls.replace(",", "")) > 0 and (unexpected, unanswered, stuck, cut, healthy, faults, left) == \
        ("0", "0", "0", "0", "yes", "0", "0"), \
        stdout[chaos.start():chaos.start() + 3000]
    stop = re.search(r"Then SIGTERM to the master alone.*\n\n\|.*\n\| ---.*\n\| (\S+) \| ([\d.]+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| \d+ \|$",
                     stdout, re.MULTILINE)
    status, seconds, processes, files, unexpected, unanswered, stuck = stop.groups()
    # within `docker stop`'s 10 s, after which it kills every process
    assert (status, processes, files, unexpected, unanswered, stuck) == ("0", "0", "0", "0", "0", "0") and float(seconds) < 10, \
        stdout[stop.start():stop.start() + 2000]
