"""A burst from many connections forms batches through any number of front-ends: each of 32
`tritonclient` connections, open before the burst, sends two requests at once with the others (the
second when the first is answered); the model's statistics count the executions."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as http

from tests.builders import Scale, fp32_model, wait_for

CLIENTS = 32


def burst(server, barrier: threading.Barrier, n: int) -> list[np.ndarray]:
    client = http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30)
    try:
        client.is_server_live()  # the connection is open before the burst
        tensor = http.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), n, np.float32))
        barrier.wait(30)
        return [client.infer("batched", [tensor]).as_numpy("y") for _ in range(2)]
    finally:
        client.close()


@pytest.mark.parametrize("front_ends", ["0", "1", "2"])
def test_a_burst_from_many_connections_forms_batches(start_server, tmp_path, front_ends):
    fp32_model(tmp_path / "models", "batched", Scale(), max_batch_size=8,
               dynamic_batching={"max_queue_delay_microseconds": 20_000})
    server = start_server(tmp_path / "models", SERVE_LOAD_MODELS="batched", SERVE_HTTP_WORKERS=front_ends)
    wait_for(server.ready, 60, "the model did not load")
    wait_for(lambda: len(server.http_pids()) == int(front_ends), 30, "the front-ends did not start")
    barrier = threading.Barrier(CLIENTS, timeout=60)  # one client that fails never holds the others for ever
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda n: burst(server, barrier, n), range(CLIENTS), timeout=120))
    assert all(np.array_equal(y, np.full((1, 4), 2.0 * n)) for n, pair in enumerate(answers) for y in pair)
    stats = server.request("GET", "/v2/models/batched/stats").json()["model_stats"][0]
    assert stats["inference_count"] == 2 * CLIENTS
    sizes = {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats["batch_stats"]}
    assert sum(size * count for size, count in sizes.items()) == 2 * CLIENTS
    assert max(sizes) >= 4 and stats["execution_count"] <= CLIENTS, sizes  # a mean batch of 2 at least
