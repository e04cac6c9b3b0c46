"""The benchmark scripts run end to end in their smoke mode, so they cannot rot. No timing is asserted;
the soak's correctness counts are: no wrong answer, no unexpected status, no lost request."""

import re
import subprocess
import sys

from tests.conftest import PROJECT


def test_every_scenario_runs_and_reports_a_table():
    result = subprocess.run([sys.executable, "-m", "bench", "--smoke"], cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for scenario in ("tiny", "mlp", "grpc", "frontends", "payload", "churn", "cold_load", "memory", "handler", "soak", "s3_load", "python_backend"):
        assert f"`python -m bench {scenario}`" in result.stdout
    tables = [line for line in result.stdout.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    assert len(tables) >= 6 * 2  # a header and at least one row each
    assert "In-process torch" in result.stdout
    soak = re.search(r"^\| ([\d,]+) \| (\d+) \| (\d+) \| (\d+) \|.*\| (yes|no.*) \|$", result.stdout, re.MULTILINE)
    requests, wrong, unexpected, lost, healthy = soak.groups()
    assert int(requests.replace(",", "")) > 0 and (wrong, unexpected, lost, healthy) == ("0", "0", "0", "yes"), soak[0]
