"""SageMaker's contract, without a server: what Batch Transform is told to send."""

import pytest

from container.api.sagemaker import batch_parameters


@pytest.mark.parametrize("instances, payload_mb, concurrent, payload", [
    (1, 6, 1, 6),       # one worker: one request at a time, SageMaker's own default
    (16, 6, 16, 6),     # a worker per core on 16 cores: 96 MB at once
    (32, 6, 16, 6),     # 32 workers: as many as 6 MB requests fit in SageMaker's 100 MB
    (3, 40, 2, 40),
    (4, 0.5, 4, 1),     # SageMaker counts whole MB: a limit under one is said as one
    (4, 250, 1, 100),   # no request past SageMaker's own bound
])
def test_batch_transform_sends_as_many_requests_as_the_model_runs_within_100_mb(instances, payload_mb, concurrent, payload):
    assert batch_parameters(instances, payload_mb) == {
        "MaxConcurrentTransforms": concurrent, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": payload}
