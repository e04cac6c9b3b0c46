"""Which V2 requests the model process decodes on a thread (v2/documents.py): those whose inputs read much
from shared memory, by the sizes they claim; and which name shared memory at all (decoded there, where the
regions are, never in a front-end)."""

from container.v2.documents import HEAVY_BYTES, names_shared_memory, reads_much_shared_memory


def _in_region(name: str, size) -> dict:
    return {"name": name, "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": size}}


def test_inputs_read_from_shared_memory_are_heavy_by_the_bytes_they_claim_together():
    assert not reads_much_shared_memory({"inputs": [_in_region("x", 16)], "outputs": [_in_region("y", 12)]})
    assert reads_much_shared_memory({"inputs": [_in_region("x", HEAVY_BYTES)]})
    assert reads_much_shared_memory({"inputs": [_in_region("x", HEAVY_BYTES // 2), _in_region("z", HEAVY_BYTES // 2)]})


def test_outputs_written_to_shared_memory_weigh_nothing_before_they_are_made():
    """The answer is weighed by the outputs the model made (heavy_outputs), not by the regions named for them."""
    assert not reads_much_shared_memory({"inputs": [], "outputs": [_in_region("y", 1 << 30)]})
    assert names_shared_memory({"inputs": [], "outputs": [_in_region("y", 1 << 30)]})


def test_malformed_requests_are_weighed_without_failing_and_refused_by_their_decoding():
    for document in ({}, {"inputs": "x"}, {"inputs": [1, None, "x"]}, {"inputs": [{"parameters": []}]},
                     {"inputs": [_in_region("x", "many")]}, {"inputs": [_in_region("x", None)]}):
        assert not reads_much_shared_memory(document)
    assert names_shared_memory({"inputs": [_in_region("x", "many")]})
    assert not names_shared_memory({"inputs": [{"name": "x", "parameters": {"binary_data_size": 16}}], "outputs": [{}]})
