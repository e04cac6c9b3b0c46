"""The S3 client retries as AWS's own settings say (AWS_RETRY_MODE, AWS_MAX_ATTEMPTS, the profile's
`retry_mode` and `max_attempts`), and where none says anything, in standard mode with 5 retries."""

import pytest

from container.models.s3 import S3


@pytest.fixture
def aws(monkeypatch, tmp_path):
    """An environment with no AWS setting but a region and the profile file `config` (empty at first)."""
    for name in ("AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "config"
    config.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return config


def retries() -> dict:
    return S3().client.meta.config.retries


def test_without_aws_settings_it_retries_five_times_in_standard_mode(aws):
    assert retries() == {"mode": "standard", "total_max_attempts": 6}


def test_the_environment_sets_the_mode_and_the_attempts_first_included(aws, monkeypatch):
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    assert retries() == {"mode": "adaptive", "total_max_attempts": 2}


def test_the_profile_sets_them_where_the_environment_does_not(aws):
    aws.write_text("[default]\nretry_mode = legacy\nmax_attempts = 3\n")
    assert retries() == {"mode": "legacy", "total_max_attempts": 3}
