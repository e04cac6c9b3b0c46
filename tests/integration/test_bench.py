"""The benchmark scripts run end to end in their smoke mode, so they cannot rot. No timing is asserted."""

import subprocess
import sys

from tests.conftest import PROJECT


def test_every_scenario_runs_and_reports_a_table():
    result = subprocess.run([sys.executable, "-m", "bench", "--smoke"], cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for scenario in ("tiny", "mlp", "payload", "churn", "cold_load", "memory"):
        assert f"`python -m bench {scenario}`" in result.stdout
    tables = [line for line in result.stdout.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    assert len(tables) >= 6 * 2  # a header and at least one row each
    assert "In-process torch" in result.stdout
